"""The exec() restart: a script restarts itself twice; the compile-budget predicate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import orion
from orion.train import restart
from orion.train.errors import TrainError

SCRIPT = textwrap.dedent("""
    import json, os, sys
    from orion.train import restart
    log_path = sys.argv[1]
    seen = {"argv": sys.argv[1:], "pid": os.getpid(), "orig_argv_tail": sys.orig_argv[-3:]}
    inherited = os.environ.get("LEAKED_FD")
    if inherited:  # the fd the previous incarnation opened must be closed by the exec
        try:
            os.fstat(int(inherited))
            seen["leaked_fd_open"] = True
        except OSError:
            seen["leaked_fd_open"] = False
    with open(log_path, "a") as log:
        log.write(json.dumps(seen) + "\\n")
    runs = sum(1 for _ in open(log_path))
    if runs < 3:
        fd = os.open(log_path, os.O_RDONLY)
        os.set_inheritable(fd, True)  # would survive a plain exec
        os.environ["LEAKED_FD"] = str(fd)
        print(f"restarting after run {runs}", end="")  # unflushed on purpose: exec_restart must flush it
        restart.exec_restart()
    print("done")
""")


def test_exec_restart_twice_keeps_argv_adds_resume_once_and_closes_fds(tmp_path: Path) -> None:
    script, log = tmp_path / "selfrestart.py", tmp_path / "runs.jsonl"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(log), "--steps", "7"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 3
    assert runs[0]["argv"] == [str(log), "--steps", "7"]
    assert runs[1]["argv"] == runs[2]["argv"] == [str(log), "--steps", "7", "--resume"]  # once, not twice
    assert runs[0]["pid"] == runs[1]["pid"] == runs[2]["pid"]  # exec, not a child process
    assert runs[1]["leaked_fd_open"] is False and runs[2]["leaked_fd_open"] is False
    assert out == "restarting after run 1restarting after run 2done\n"  # flushed before each exec


def test_restart_argv_keeps_interpreter_options_and_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-X", "utf8", "-m", "orion", "train", "--steps", "5"])
    assert restart.restart_argv() == [sys.executable, "-X", "utf8", "-m", "orion", "train", "--steps", "5",
                                      "--resume"]
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "orion", "train", "--resume"])
    assert restart.restart_argv() == [sys.executable, "-m", "orion", "train", "--resume"]


def test_threshold_and_predicate(monkeypatch: pytest.MonkeyPatch) -> None:
    assert restart.compile_threshold(119) == 100
    assert restart.compile_threshold(1000) == 840
    budget = orion.compile_budget()
    assert restart.compile_threshold() == restart.compile_threshold(budget)
    monkeypatch.setattr(restart, "compile_count", lambda: 28)
    monkeypatch.setattr(restart, "compile_budget", lambda: 119)
    assert not restart.needs_restart(72)  # 28 + 72 = 100: at the threshold, not past it
    assert restart.needs_restart(73)
    with pytest.raises(TrainError, match="next_compiles=-1"):
        restart.needs_restart(-1)


def test_predicate_reads_the_real_compile_count_and_budget() -> None:
    env = {**os.environ, "ORION_COMPILE_BUDGET": "12"}
    code = ("from orion.train import restart; import orion\n"
            "print(orion.compile_count(), restart.compile_threshold(), restart.needs_restart(10), "
            "restart.needs_restart(11))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["0", "10", "False", "True"]
