"""`python -m orion serve` under load: throughput and time to first token with 1, 4 and 16 concurrent
streaming clients on loopback, p50 and p99; and llama.cpp's server on the same load where it is installed.

The Orion server runs in a subprocess through ``orion.serve.cli.main`` (the real command line), on a
GPT-2 directory: ``--model DIR``, or random weights of ``--config`` saved with a word-level stand-in
tokenizer covering the whole vocabulary (prompts are sent as token ids, so text quality is irrelevant).
Each client sends ``--requests`` streaming completions one after the other, greedy, ``--new-tokens``
each; throughput counts the completion tokens the server reports (``stream_options.include_usage``)
over the wall time of the whole level. TTFT is from sending a request to its first text chunk.

    python benchmarks/bench_serve.py [--config 124m|tiny] [--model DIR] [--clients 1 4 16]
        [--prompt-tokens 16] [--new-tokens 32] [--requests 2] [--max-sequences 4]
        [--gguf FILE] [--json]

llama.cpp: ``llama-server`` on PATH (or ``llama-cpp-python[server]``) and ``--gguf`` the same model in
GGUF; without them its rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np

from orion.models import GPT2Config
from orion.models.gpt2.weights import random_weights, save_hf

CONFIGS = {
    "124m": GPT2Config(),
    "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=256),
}
EOS = "<|endoftext|>"


@dataclass
class Level:
    """One concurrency level's figures."""

    server: str
    clients: int
    requests: int
    tokens: int
    seconds: float
    tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    token_gap_p50_ms: float
    token_gap_p99_ms: float


def write_random_model(directory: Path, config: GPT2Config) -> None:
    """Random GPT-2 weights and a word-level tokenizer.json with exactly ``vocab_size`` ids (the last is EOS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    save_hf(directory, config, random_weights(config, seed=0))
    vocab = {f"w{i}": i for i in range(config.vocab_size - 1)} | {EOS: config.vocab_size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))


def start_orion(model: Path, max_sequences: int, queue: int) -> tuple[subprocess.Popen, str, float]:
    """The server process, its base URL, and the seconds it took to load, compile and listen."""
    code = "import sys; from orion.serve.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["--model", str(model), "--model-name", "bench", "--port", "0", "--quiet",
            "--max-sequences", str(max_sequences), "--max-queue", str(queue)]
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"the Orion server exited with {proc.wait()}")
        found = re.search(r"^ready: .* at (http://[\d.]+:\d+)/v1", line)
        if found:
            return proc, found.group(1), time.perf_counter() - start
    proc.kill()
    raise RuntimeError("the Orion server was not ready within 600 s")


def start_llama(gguf: str | None, parallel: int) -> tuple[subprocess.Popen | None, str | None, str]:
    """llama.cpp's server on the same model, or (None, None, why it is skipped)."""
    binary = shutil.which("llama-server")
    if not (binary or _llama_cpp_python_server()):
        return None, None, "llama.cpp: skipped (neither llama-server on PATH nor llama-cpp-python[server] installed)"
    if gguf is None:
        return None, None, "llama.cpp: skipped (installed, but no --gguf file of the same model was given)"
    import socket

    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    if binary:
        cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-np", str(parallel)]
    else:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return proc, url, ""
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    return None, None, "llama.cpp: skipped (its server did not answer within 300 s)"


def _llama_cpp_python_server() -> bool:
    """llama-cpp-python's server imports (the bindings alone, without the [server] extra, do not count)."""
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError:
        return False
    return True


async def one_request(http: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                      new_tokens: int) -> tuple[float, list[float], int]:
    """(TTFT s, gaps between text chunks s, completion tokens) of one streaming completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    arrivals, tokens = [], 0
    async with http.stream("POST", url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter())
    if not arrivals:
        raise RuntimeError("a request streamed no text")
    return arrivals[0] - sent, list(np.diff(arrivals)), tokens


async def run_level(server: str, url: str, model: str, clients: int, requests: int, prompts: list[list[int]],
                    new_tokens: int) -> Level:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as http:
        async def client(i: int) -> list[tuple[float, list[float], int]]:
            return [await one_request(http, url, model, prompts[(i + r) % len(prompts)], new_tokens)
                    for r in range(requests)]

        start = time.perf_counter()
        results = [r for rs in await asyncio.gather(*(client(i) for i in range(clients))) for r in rs]
        seconds = time.perf_counter() - start
    ttft = np.array([r[0] for r in results]) * 1e3
    gaps = np.array([g for r in results for g in r[1]] or [0.0]) * 1e3
    tokens = sum(r[2] for r in results)
    return Level(server, clients, len(results), tokens, round(seconds, 3), round(tokens / seconds, 2),
                 round(float(np.percentile(ttft, 50)), 1), round(float(np.percentile(ttft, 99)), 1),
                 round(float(np.percentile(gaps, 50)), 2), round(float(np.percentile(gaps, 99)), 2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="124m", help="random-weight shape (default 124m)")
    p.add_argument("--model", help="a Hugging Face GPT-2 directory instead of random weights")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16], help="concurrency levels (default 1 4 16)")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (default 16)")
    p.add_argument("--new-tokens", type=int, default=32, help="max_tokens of each request (default 32)")
    p.add_argument("--requests", type=int, default=2, help="requests per client at each level (default 2)")
    p.add_argument("--max-sequences", type=int, default=4, help="the server's --max-sequences (default 4)")
    p.add_argument("--gguf", help="the same model in GGUF, for llama.cpp's server")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if min(args.clients) < 1 or args.prompt_tokens < 1 or args.new_tokens < 1 or args.requests < 1:
        p.error("--clients, --prompt-tokens, --new-tokens and --requests take positive numbers")

    with tempfile.TemporaryDirectory(prefix="orion-bench-serve-") as tmp:
        model = Path(args.model) if args.model else Path(tmp)
        if not args.model:
            write_random_model(model, CONFIGS[args.config])
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(0)
        prompts = [[int(t) for t in rng.integers(0, vocab - 1, args.prompt_tokens)] for _ in range(16)]
        os.environ.setdefault("ORION_CACHE_DIR", str(Path(tmp) / "cache"))  # leave no programs behind
        proc, url, ready_s = start_orion(model, args.max_sequences, queue=max(args.clients) * args.requests)
        levels = []
        try:
            asyncio.run(run_level("orion", url, "bench", 1, 1, prompts, 4))  # warm-up (prefill bucket compile)
            for clients in args.clients:
                levels.append(asyncio.run(run_level("orion", url, "bench", clients, args.requests, prompts,
                                                    args.new_tokens)))
        finally:
            proc.terminate()
            proc.wait(30)
        llama, llama_url, note = start_llama(args.gguf, args.max_sequences)
        if llama is not None:
            try:
                for clients in args.clients:
                    levels.append(asyncio.run(run_level("llama.cpp", llama_url, "bench", clients, args.requests,
                                                        prompts, args.new_tokens)))
            finally:
                llama.terminate()
                llama.wait(30)

    from orion.runtime.backend import backend

    report = {"backend": backend(), "model": args.model or f"random {args.config}", "ready_s": round(ready_s, 2),
              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "max_sequences": args.max_sequences, "levels": [asdict(level) for level in levels], "note": note}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"backend {report['backend']}, model {report['model']}, server ready in {ready_s:.1f} s, prompt "
          f"{args.prompt_tokens} tokens, max_tokens {args.new_tokens}, max-sequences {args.max_sequences}")
    print(f"{'server':<10} {'clients':>7} {'reqs':>5} {'tokens':>6} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'gap p50':>8} {'gap p99':>8}  (ms)")
    for lv in levels:
        print(f"{lv.server:<10} {lv.clients:>7} {lv.requests:>5} {lv.tokens:>6} {lv.tok_s:>8.1f} "
              f"{lv.ttft_p50_ms:>9.1f} {lv.ttft_p99_ms:>9.1f} {lv.token_gap_p50_ms:>8.2f} {lv.token_gap_p99_ms:>8.2f}")
    if note:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
