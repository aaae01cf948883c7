"""The ``server`` fuzz target: HTTP requests, drawn from the fuzz input, to ``python -m orion serve``
(a tiny GPT-2 on 127.0.0.1, started once per fuzzing process, or the one ``ORION_FUZZ_SERVER`` names).

A request is raw bytes to an endpoint, or an OpenAI request built from a valid one by a few mutations:
fields set to awkward values (:mod:`json_values`), unknown fields, wrong kinds, deep nesting, lone
surrogates, NaN literals, duplicate keys, streaming or not. A finding is any HTTP 500 (a streamed
``generation_failed`` or ``internal_error`` event too), a 4xx that is not OpenAI's error JSON, a request
the server does not answer, or a server that stops answering ``/health``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from json_values import NUMBERS, STRINGS, Draw, Pairs, Raw, dump, value

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the serve fixtures

PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/completions", "/v1/chat/completions", "/v1/models",
         "/v1/models/fuzz", "/health", "/tokenize", "/detokenize", "/metrics", "/v1/embeddings", "/")
FIELDS = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "seed", "stop", "n", "stream",
          "stream_options", "user", "logit_bias", "logprobs", "top_logprobs", "echo", "best_of", "suffix",
          "response_format", "tools", "tool_choice", "parallel_tool_calls", "ignore_eos", "tokens", "content")
ROLES = ("system", "developer", "user", "assistant", "tool", "robot")
HEALTH_EVERY = 8  # requests between two checks that the server is still healthy


class Finding(AssertionError):
    """The server broke its contract."""


_SERVER: dict = {}


def base_url() -> str:
    """The server's URL: ``ORION_FUZZ_SERVER`` (a running ``python -m orion serve``), else one started on
    first use on a free loopback port (a tiny GPT-2 with a real tokenizer and a chat template), in its
    own process as users run it (in-process, the GIL handoffs between client and server cost ~40 ms a
    request on a loaded machine), stopped at exit."""
    if not _SERVER:
        url = os.environ.get("ORION_FUZZ_SERVER")
        if url is None:
            url = _start_server()
        client = httpx.Client(timeout=60)
        model_id = client.get(url + "/v1/models").json()["data"][0]["id"]
        _SERVER.update(url=url, client=client, model_id=model_id, requests=0)
    return _SERVER["url"]


def _start_server() -> str:
    from serve.conftest import write_model

    directory = write_model(Path(tempfile.mkdtemp(prefix="orion-fuzz-serve-")) / "tiny")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(directory.parent / "server.log", "wb")  # open as long as the server runs
    process = subprocess.Popen([sys.executable, "-m", "orion", "serve", "--model", str(directory), "--host",
                                "127.0.0.1", "--port", str(port), "--quiet", "--max-body-bytes", str(256 * 1024),
                                "--body-timeout", "5"], stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    atexit.register(process.terminate)  # (libFuzzer ends the process without atexit: hence _die_with_parent)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the fuzz server did not start: {(directory.parent / 'server.log').read_text()}")
        time.sleep(0.2)


def _die_with_parent() -> None:
    """In the server's process before exec: SIGTERM when the fuzzing process ends (Linux's PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def request_for(data: bytes) -> tuple[str, str, bytes, bool]:
    """(method, path, body, streamed) drawn from ``data``."""
    d = Draw(data)
    mode, path = d.byte() % 8, d.pick(PATHS)
    method = d.pick(("GET", "PUT", "DELETE", "PATCH")) if d.rare() else ("GET" if path in ("/v1/models", "/health",
                                                                                             "/metrics") else "POST")
    if mode == 0:
        return method, path, d.rest(), False
    chat = path == "/v1/chat/completions"
    doc = Pairs(base_request(d, chat).items())
    for _ in range(d.byte() % 5):
        mutate(d, doc)
    streamed = any(k == "stream" and v is True for k, v in doc)
    return method, path, dump(doc).encode(), streamed


def base_request(d: Draw, chat: bool) -> dict:
    """A valid request (most of the time), short: a few tokens."""
    doc: dict = {"model": _SERVER["model_id"], "max_tokens": d.pick((1, 2, 4, 8))}
    if chat:
        doc["messages"] = [{"role": d.pick(ROLES[:4] if not d.rare() else ROLES), "content": d.pick(STRINGS[:3])}
                           for _ in range(1 + d.byte() % 3)]
    else:
        doc["prompt"] = d.pick(("hello", "the engine", [1, 2, 3], ["a"], "", [0]))
    for _ in range(d.byte() % 4):
        name = d.pick(("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream", "repetition_penalty"))
        doc[name] = {"temperature": d.pick((0, 0.7, 1.0)), "top_p": 0.9, "top_k": 5, "min_p": 0.1,
                     "seed": d.byte(), "stop": d.pick(("\n", ["e", "o"])), "stream": True,
                     "repetition_penalty": 1.2}[name]
    return doc


def mutate(d: Draw, doc: Pairs) -> None:
    """One change to the request: a field set, added, removed, duplicated or replaced by raw text."""
    action = d.byte() % 8
    if action == 0 and doc:
        del doc[d.byte() % len(doc)]
    elif action == 1:
        doc.append((d.pick(FIELDS), value(d)))
    elif action == 2 and doc:
        i = d.byte() % len(doc)
        doc[i] = (doc[i][0], value(d))
    elif action == 3:
        doc.append((d.text(12) if d.byte() & 1 else d.pick(STRINGS), value(d)))
    elif action == 4:  # a message of odd shape
        parts = [{"type": d.pick(("text", "image_url", "input_audio")), "text": value(d)} for _ in range(d.byte() % 3)]
        message = Pairs([("role", d.pick(ROLES)), ("content", d.pick((value(d), parts, d.pick(STRINGS))))])
        if d.rare():
            message.append((d.pick(("name", "tool_calls", "tool_call_id", "extra")), value(d)))
        doc.append(("messages", [message] * (1 + d.byte() % 3)))
    elif action == 5:
        doc.append((d.pick(("max_tokens", "top_k", "seed", "n", "temperature", "top_p")), d.pick(NUMBERS)))
    elif action == 6:
        doc.append(("prompt", [d.pick(NUMBERS) for _ in range(d.byte() % 5)]))
    else:
        doc.append((d.pick(FIELDS), Raw(d.text(16))))


def server(data: bytes) -> None:
    """One request from ``data`` (and every :data:`HEALTH_EVERY` requests ``/health``); raises
    :class:`Finding` on a broken contract."""
    url = base_url()
    client: httpx.Client = _SERVER["client"]
    method, path, body, streamed = request_for(data)
    headers = {"content-type": "application/json"}
    try:
        if streamed:
            with client.stream(method, url + path, content=body, headers=headers) as response:
                text = b"".join(response.iter_bytes()).decode("utf-8", "replace")
        else:
            response = client.request(method, url + path, content=body, headers=headers)
            text = response.text
    except httpx.HTTPError as exc:
        raise Finding(f"{method} {path}: no answer ({type(exc).__name__}: {exc}); body {body[:300]!r}") from None
    _SERVER["requests"] += 1
    check(response.status_code, text, f"{method} {path} {body[:300]!r}")
    if _SERVER["requests"] % HEALTH_EVERY:
        return
    health = client.get(url + "/health")
    if health.status_code != 200 or health.json().get("status") != "ok":
        raise Finding(f"the server is not healthy after {method} {path} {body[:300]!r}: {health.text[:500]}")


def check(status: int, text: str, what: str) -> None:
    """An answer keeps OpenAI's contract: no 5xx but 503 (busy), every 4xx an error object."""
    if status >= 500 and status != 503:
        raise Finding(f"HTTP {status} for {what}: {text[:1000]}")
    if status >= 400:
        try:
            error = json.loads(text)["error"]
            assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
        except (ValueError, KeyError, TypeError, AssertionError):
            raise Finding(f"HTTP {status} without OpenAI's error object for {what}: {text[:1000]}") from None
    for line in text.splitlines():  # a stream's error event
        if line.startswith("data:") and '"error"' in line and ("server_error" in line or "internal_error" in line):
            raise Finding(f"a streamed server error for {what}: {line[:1000]}")
