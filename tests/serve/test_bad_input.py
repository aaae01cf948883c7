"""Every bad request gets an OpenAI-shaped JSON error with a 4xx, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from .conftest import LIMITS


def assert_error(response: httpx.Response, status: int, param: str | None = None, says: str = "") -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    assert error["param"] == param and says in error["message"]


def post(base_url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(base_url + path, json=body, timeout=10)


def completion(engine, **fields) -> dict:
    return {"model": engine.model_id, "prompt": "hello", "max_tokens": 4, **fields}


def chat(engine, **fields) -> dict:
    return {"model": engine.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def test_malformed_json(base_url) -> None:
    for raw in (b"{not json", b'{"model": "x", "prompt": NaN}', b"\xff\xfe", b"[1, 2]", b""):
        response = httpx.post(base_url + "/v1/completions", content=raw, timeout=10)
        assert_error(response, 400, None, "JSON")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("max_tokens", "5", "integer"), ("max_tokens", 2.5, "integer"), ("max_tokens", True, "integer"),
    ("temperature", "hot", "number"), ("temperature", -1, "[0, 2]"), ("top_p", 1.5, "(0, 1]"), ("top_p", 0, "(0, 1]"),
    ("top_k", 0, ">= 1"), ("min_p", 2, "[0, 1]"), ("repetition_penalty", 0, "(0, 10]"), ("seed", 1.5, "integer"),
    ("stop", 5, "list"), ("stop", ["a"] * 17, "16"), ("stream", "yes", "boolean"), ("n", 0, ">= 1"),
    ("n", 99, "at most 4 choices"), ("frequency_penalty", 3, "[-2, 2]"), ("logprobs", 6, "[0, 5]"),
    ("logprobs", True, "[0, 5]"), ("echo", True, "echo"),
    ("prompt", {"text": "hi"}, "string"), ("prompt", [], "string"), ("prompt", ["a", "b"], "one prompt per request"),
    ("prompt", [1, 10**6], "outside the vocabulary"), ("stream_options", {"include_usage": 1}, "include_usage"),
    ("bogus", 1, "unknown field"),
])
def test_wrong_completion_fields(base_url, engine, field, value, says) -> None:
    assert_error(post(base_url, "/v1/completions", completion(engine, **{field: value})), 400, field, says)


@pytest.mark.parametrize(("messages", "param", "says"), [
    ("hi", "messages", "list"), ([], "messages", "non-empty"), (["hi"], "messages[0]", "object"),
    ([{"role": "robot", "content": "hi"}], "messages[0].role", "one of"),
    ([{"role": "user", "content": 5}], "messages[0].content", "string"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]", "text only"),
    ([{"role": "user", "content": "hi", "audio": {}}], "messages[0]", "unsupported fields"),
    ([{"role": "user", "content": "hi", "tool_calls": []}], "messages[0].tool_calls", "assistant message only"),
    ([{"role": "assistant", "content": "hi"}], "messages", "start with a user or system message"),  # the template
])
def test_wrong_messages(base_url, engine, messages, param, says) -> None:
    assert_error(post(base_url, "/v1/chat/completions", chat(engine, messages=messages)), 400, param, says)


def test_unsupported_chat_fields(base_url, engine) -> None:
    for field, value in (("tools", [{"type": "function"}]), ("logprobs", 1), ("top_logprobs", 21),
                         ("response_format", {"type": "json"})):
        assert_error(post(base_url, "/v1/chat/completions", chat(engine, **{field: value})), 400, field)


def test_unknown_or_missing_model(base_url, engine) -> None:
    assert_error(post(base_url, "/v1/completions", completion(engine, model="gpt-4")), 404, "model", "does not exist")
    assert_error(post(base_url, "/v1/chat/completions", chat(engine, model=7)), 400, "model", "string")
    assert_error(httpx.get(base_url + "/v1/models/gpt-4", timeout=10), 404, "model")
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=10)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)


def test_prompt_over_the_context_and_max_tokens_below_one(base_url, engine) -> None:
    too_long = [1] * (engine.context_length + 1)
    assert_error(post(base_url, "/v1/completions", completion(engine, prompt=too_long)), 400, "prompt", "context")
    long_chat = chat(engine, messages=[{"role": "user", "content": "hello world " * 200}])
    assert_error(post(base_url, "/v1/chat/completions", long_chat), 400, "messages", "context")
    for field in ("max_tokens", "max_completion_tokens"):
        assert_error(post(base_url, "/v1/chat/completions", chat(engine, **{field: 0})), 400, field, ">= 1")
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=10)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=engine.model_id, prompt="hi", max_tokens=-3)


def test_body_over_the_limit(base_url, engine) -> None:
    big = completion(engine, prompt="x" * (LIMITS.max_body_bytes + 1))
    assert_error(post(base_url, "/v1/completions", big), 413, None, "limit")
    chunks = (b" " * 4096 for _ in range(LIMITS.max_body_bytes // 4096 + 2))  # chunked: no Content-Length
    assert_error(httpx.post(base_url + "/v1/completions", content=chunks, timeout=10), 413, None, "limit")


def test_slow_client_gets_408_and_others_are_served(base_url, engine) -> None:
    host, port = httpx.URL(base_url).host, httpx.URL(base_url).port
    body = json.dumps(completion(engine)).encode()
    with socket.create_connection((host, port), timeout=10) as slow, \
            socket.create_connection((host, port), timeout=10) as slower:
        slower.sendall(b"POST /v1/compl")  # half a request line, then nothing: it must not hold anyone up
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])  # then nothing more
        start = time.monotonic()
        assert post(base_url, "/v1/completions", completion(engine)).status_code == 200  # not blocked by it
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            data = slow.recv(65536)
            if not data:
                break
            reply += data
        waited = time.monotonic() - start
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:200]
    assert json.loads(payload)["error"]["code"] == "request_timeout"
    assert LIMITS.body_timeout * 0.5 < waited < LIMITS.body_timeout + 5


def test_deeply_nested_body(base_url, engine) -> None:
    for depth in (30_000, 900, 65):  # (the test server takes 64 KiB bodies: 100,000 deep is a 413 here)
        raw = b'{"model": "m", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
        assert_error(httpx.post(base_url + "/v1/completions", content=raw, timeout=10), 400, None, "JSON")
    ok = chat(engine, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert post(base_url, "/v1/chat/completions", ok).status_code == 200  # ordinary nesting is fine


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", '{"model": "%s", "prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "\\udfff"}]}',
     "messages[0].content"),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": [{"type": "text", '
     '"text": "\\ud83d"}]}]}', "messages[0].content[0].text"),
    ("/v1/completions", '{"model": "%s", "prompt": "hi", "\\ud800": 1}', None),
    ("/v1/completions", '{"model": "%s", "prompt": "hi", "stop": ["\\udc00"]}', "stop[0]"),
])
def test_lone_surrogates(base_url, engine, path, raw, param) -> None:
    response = httpx.post(base_url + path, content=(raw % engine.model_id).encode(), timeout=10)
    assert_error(response, 400, param, "lone surrogate")


def test_seed_out_of_range(base_url, engine) -> None:
    for seed in (-1, 2**64):
        assert_error(post(base_url, "/v1/completions", completion(engine, seed=seed)), 400, "seed", "[0, 2**64)")
    assert post(base_url, "/v1/completions", completion(engine, seed=2**64 - 1)).status_code == 200


@pytest.mark.parametrize("field", ["temperature", "repetition_penalty", "top_p", "min_p"])
def test_tiniest_positive_settings_generate(base_url, engine, field) -> None:
    """5e-324 (the smallest double) made probabilities NaN: now a valid, if extreme, setting."""
    for stream in (False, True):
        response = post(base_url, "/v1/completions", completion(engine, stream=stream, **{field: 5e-324}))
        assert response.status_code == 200, response.text
        assert "error" not in response.text


def test_unknown_route_and_method(base_url) -> None:
    assert_error(httpx.get(base_url + "/v2/nothing", timeout=10), 404, None, "no route")
    assert_error(httpx.get(base_url + "/v1/completions", timeout=10), 405, None, "not allowed")


def test_still_serving_after_all_of_it(base_url, engine) -> None:
    health = httpx.get(base_url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["active"] == 0 and health["waiting"] == 0 and health["failed"] == 0
    out = post(base_url, "/v1/completions", completion(engine, temperature=0))
    assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] >= 1
