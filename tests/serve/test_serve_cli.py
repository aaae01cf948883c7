"""orion.serve.cli.main(argv), what ``python -m orion serve`` calls: checks, ready line, serving, Ctrl-C."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from orion.serve import cli

LAUNCH = "import sys; from orion.serve.cli import main; sys.exit(main(sys.argv[1:]))"


def launch(*args: str) -> subprocess.Popen:
    env = {**os.environ, "ORION_CACHE_DIR": "off"}
    return subprocess.Popen([sys.executable, "-c", LAUNCH, *args], stderr=subprocess.PIPE, text=True, env=env)


def test_defaults_bind_loopback() -> None:
    args = cli.build_parser().parse_args(["--model", "m"])
    assert (args.host, args.port) == ("127.0.0.1", 8000)


@pytest.mark.parametrize(("argv", "says"), [
    (["--model", "/nonexistent/dir"], "no such directory"),
    (["--model", __file__], "not a directory"),
    (["--port", "70000"], "--port 70000"),
    (["--max-queue", "0"], "--max-queue 0"),
    (["--body-timeout", "-1"], "--body-timeout"),
    (["--prefix-cache-mb", "-1"], "--prefix-cache-mb -1"),
    (["--speculative", "medusa"], "invalid choice: 'medusa'"),
    (["--speculative", "prompt-lookup", "--draft-tokens", "0"], "--draft-tokens 0"),
])
def test_bad_arguments_fail_before_loading(model_dir, capsys, argv, says) -> None:
    argv = argv if argv[0] == "--model" else ["--model", str(model_dir), *argv]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_missing_tokenizer_is_reported(model_dir, tmp_path, capsys) -> None:
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    assert cli.main(["--model", str(tmp_path), "--port", "0", "--quiet"]) == 1
    assert "tokenizer.json" in capsys.readouterr().err


def test_serves_until_ctrl_c(model_dir) -> None:
    server = launch("--model", str(model_dir), "--port", "0", "--model-name", "tiny")
    try:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in server.stderr], daemon=True).start()
        seen = []
        deadline = time.monotonic() + 60
        while not (seen and seen[-1].startswith("ready:")):  # stderr: compile progress, then the ready line
            assert server.poll() is None, f"the server exited early: {''.join(seen)}"
            seen.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))
        assert any(re.search(r"compil(ing|ed) \d+ programs", line) for line in seen[:-1])  # progress before ready
        url = re.search(r"http://127\.0\.0\.1:\d+", seen[-1]).group(0)
        assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
        out = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 3},
                         timeout=10)
        assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] >= 1
        server.send_signal(signal.SIGINT)
        assert server.wait(20) == 0
        time.sleep(0.1)  # let the reader thread take the last lines
        rest = []
        while not lines.empty():
            rest.append(lines.get_nowait())
        assert "Traceback" not in "".join(rest)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_busy_port_is_reported(model_dir, capsys) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        assert cli.main(["--model", str(model_dir), "--port", port, "--quiet"]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
