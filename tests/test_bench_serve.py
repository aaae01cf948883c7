"""benchmarks/bench_serve.py's summary of the serve section: medians over repeated levels, each count over the
server's own one-client figure and over llama-server's at as many clients (the figures are given, no server runs);
a server whose requests fail is reported with its log while the run goes on (a stand-in server); each level's
prompts are new, and who goes first rotates; no request is sent on a connection a server may have closed; the client
reads chunked event streams and reports an error status; an Orion server runs the orion the bench imported; and the
engine section (the same workload on the batched scheduler in process) generates every request."""

from __future__ import annotations

import argparse
import asyncio
import http.server
import io
import json
import os
import pathlib
import sys
import threading

import pytest

import orion
from support.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def bench():
    yield from benchmark_module("bench_serve.py")


def test_scaling_takes_medians_of_repeated_levels_and_divides_by_one_client_and_by_the_peer(bench):
    rows = [("orion-batched", 1, 80.0), ("llama-server", 1, 90.0), ("orion-batched", 8, 240.0), ("llama-server", 8, 150.0),
            ("orion-batched", 1, 100.0), ("llama-server", 1, 96.0), ("orion-batched", 8, 300.0), ("llama-server", 8, 210.0),
            ("orion-batched", 1, 70.0), ("orion-batched", 8, 330.0), ("orion-turns", 8, 85.0)]
    levels = [{"server": s, "clients": n, "tok_s": r} for s, n, r in rows]
    got = bench.scaling(levels)
    assert got["median_tok_s"]["orion-batched"] == {1: 80.0, 8: 300.0}
    assert got["median_tok_s"]["llama-server"] == {1: 93.0, 8: 180.0}
    assert got["over_one_client"] == {"orion-batched": {8: 3.75}, "llama-server": {8: 1.94}}  # no 1-client turns level
    assert got["over_llama_server"] == {"orion-batched": {1: 0.86, 8: 1.67}, "orion-turns": {8: 0.47}}
    rendered = bench.render({"backend": "emulator", "model": "m", "serve": {
        "slots": 8, "prompt_tokens": 16, "new_tokens": 32, "requests_per_client": 2, "threads": 2,
        "levels": [dict(level, requests=2, tokens=64, ttft_p50_ms=1.0, ttft_p99_ms=2.0, token_gap_p50_ms=1.0,
                        token_gap_p99_ms=2.0, load_average=0.5) for level in levels],
        "scaling": got, "notes": []}})
    assert "orion-batched 8: 3.75x" in rendered and "orion-turns 8: 0.47x" in rendered


FAKE_LLAMA_SERVER = '''#!{python}
"""A stand-in llama-server: answers /health, drops the connection of every completion request."""
import http.server
import sys

port = int(sys.argv[sys.argv.index("--port") + 1])


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def do_POST(self):
        sys.stderr.write("dropped a request\\n")
        sys.stderr.flush()
        self.connection.close()


http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def test_a_server_whose_requests_fail_is_reported_with_its_log_and_the_run_goes_on(bench, tmp_path):
    fake = tmp_path / "llama-server"
    fake.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 100}')
    args = argparse.Namespace(clients=[1, 2], slots=0, requests=1, prompt_tokens=4, new_tokens=2, threads=1,
                              temperature=0.0, top_p=None, servers=["llama-server"], orion_variant=[],
                              llama_server=str(fake), gguf=str(tmp_path / "unused.gguf"))
    report = bench.serve_section(args, model, tmp_path)
    assert report["levels"] == []  # its levels after the failure were skipped, not retried
    why = report["failed"]["llama-server"]
    assert "1 clients: a request failed" in why and "dropped a request" in why  # the error and its log's end
    assert any(note.startswith("llama-server: failed") for note in report["notes"])


def test_who_runs_a_level_first_rotates_over_the_repeats_of_its_client_count(bench, tmp_path, monkeypatch):
    class Running:
        returncode = None

        def poll(self):
            return None

        def terminate(self):
            pass

        def wait(self, timeout=None):
            return 0

    order = []

    async def level(server, url, clients, requests, prompts, new_tokens, sampling=None):
        order.append((server, clients))
        return bench.Level(server, clients, requests, 10, 1.0, 10.0, 1.0, 1.0, 1.0, 1.0, 0.0)

    monkeypatch.setattr(bench, "start_orion", lambda *args, **kwargs: (Running(), "http://127.0.0.1:1"))
    monkeypatch.setattr(bench, "run_level", level)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 100}')
    args = argparse.Namespace(clients=[1, 8, 1, 8, 1], slots=0, requests=1, prompt_tokens=4, new_tokens=2, threads=1,
                              temperature=0.0, top_p=None, servers=["orion"], orion_variant=["a=", "b="],
                              llama_server=None, gguf=None)
    bench.serve_section(args, model, tmp_path)
    assert order[2:] == [("a", 1), ("b", 1), ("a", 8), ("b", 8), ("b", 1), ("a", 1), ("b", 8), ("a", 8),
                         ("a", 1), ("b", 1)]  # after the warm-ups


def test_an_orion_server_runs_the_orion_the_bench_imported_unless_its_variant_says(bench, tmp_path, monkeypatch):
    """An installed orion must not shadow the tree the bench runs from (a variant without PYTHONPATH ran it)."""
    started = []

    class Started:
        def __init__(self, command, stderr, text, env):
            started.append(env)
            self.stderr = io.StringIO("ready: serving 'bench' at http://127.0.0.1:1/v1\n")

    monkeypatch.setattr(bench.subprocess, "Popen", Started)
    bench.start_orion(tmp_path, 1, 1, 1, [])
    bench.start_orion(tmp_path, 1, 1, 1, [], {"PYTHONPATH": "/elsewhere"})
    assert started[0]["PYTHONPATH"].split(os.pathsep)[0] == str(pathlib.Path(orion.__file__).parents[1])
    assert started[1]["PYTHONPATH"] == "/elsewhere"


def test_each_level_sends_new_prompts_the_same_for_every_server(bench):
    """A level's prompts are the same whichever server asks (its server runs see one workload) and none repeats one
    of another level's, which a server's prompt cache would then skip (llama-server's slots, Orion's prefix cache)."""
    levels = [bench.level_prompts(level, 16, 50257, 16) for level in range(7)]
    assert levels[3] == bench.level_prompts(3, 16, 50257, 16)
    every = [tuple(p) for prompts in levels for p in prompts]
    assert len(set(every)) == len(every) and all(len(p) == 16 and max(p) < 50256 for p in every)


class OneRequestPerConnection(http.server.BaseHTTPRequestHandler):
    """Streams a two-chunk completion on HTTP/1.1 and keeps the connection open, but closes it without an answer when
    a second request comes on it, as llama-server does past its kept requests."""

    protocol_version = "HTTP/1.1"
    answered = False

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.answered:
            self.close_connection = True
            return
        self.answered = True
        events = [{"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}, {"usage": {"completion_tokens": 2}}]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_each_request_opens_its_own_connection(bench):
    """A client's requests in turn do not reuse a kept-alive connection, which the server may close meanwhile (with
    reuse, the client's second request here fails: 'Server disconnected without sending a response')."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OneRequestPerConnection)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        level = asyncio.run(bench.run_level("stand-in", url, 2, 3, [[1, 2]] * 6, 2))
    finally:
        server.shutdown()
    assert (level.requests, level.tokens) == (6, 12)


class ChunkedStream(http.server.BaseHTTPRequestHandler):
    """Streams three text chunks and the usage as chunked SSE in 7-byte pieces (lines split across chunks), or
    answers 404 with a JSON error on /missing/...."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.startswith("/missing/"):
            body = b'{"error": {"message": "no such model"}}'
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        events = [{"choices": [{"text": t}]} for t in "xyz"] + [{"choices": [], "usage": {"completion_tokens": 3}}]
        data = "".join(f"data: {json.dumps(e)}\r\n\r\n" for e in events).encode() + b"data: [DONE]\r\n\r\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for at in range(0, len(data), 7):
            piece = data[at:at + 7]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def log_message(self, *args):
        pass


def test_the_client_reads_chunked_event_streams_and_reports_an_error_status(bench):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ChunkedStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        ttft, gaps, tokens = asyncio.run(bench.one_request(url, [1, 2], 3))
        with pytest.raises(bench.RequestFailed, match="404.*no such model"):
            asyncio.run(bench.one_request(url + "/missing", [1, 2], 3))
    finally:
        server.shutdown()
    assert tokens == 3 and len(gaps) == 2 and ttft > 0


def test_the_engine_section_runs_the_serve_workload_through_the_batched_scheduler_in_process(bench, tmp_path,
                                                                                            monkeypatch):
    """Every request of every level is generated, greedy, to its max_tokens; each count's tok/s is also given over the
    one-client figure's."""
    monkeypatch.setenv("ORION_NUM_THREADS", "1")  # restored after: the section sets the variable for its engine
    model = tmp_path / "model"
    model.mkdir()
    bench.write_random_model(model, bench.CONFIGS["tiny"])
    args = argparse.Namespace(clients=[1, 3, 1], slots=0, requests=2, prompt_tokens=4, new_tokens=5, threads=1,
                              temperature=0.0, top_p=None)
    report = bench.engine_section(args, model)
    assert report["slots"] == 3
    assert [(lv["clients"], lv["tokens"]) for lv in report["levels"]] == [(1, 10), (3, 30), (1, 10)]
    assert set(report["over_one_client"]) == {3} and report["over_one_client"][3] > 0
    assert "## engine" in bench.render({"backend": "emulator", "model": "m", "engine": report})
