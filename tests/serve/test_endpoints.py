"""/tokenize and /detokenize in llama-server's and vLLM's shapes against the tokenizers library, and /metrics
in Prometheus' text format, its counters against the usage the responses reported."""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from .test_bad_input import assert_error, post


@pytest.fixture(scope="module")
def hf_tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def test_tokenize_llama_server_shape(base_url, hf_tokenizer) -> None:
    text = "hello world, café 🙂"
    want = hf_tokenizer.encode(text, add_special_tokens=False).ids
    assert post(base_url, "/tokenize", {"content": text}).json() == {"tokens": want}
    pieces = post(base_url, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == want
    assert [p["piece"] for p in pieces] == [hf_tokenizer.decode([i]) for i in want]


def test_tokenize_vllm_shape(base_url, engine, hf_tokenizer) -> None:
    text = "the neural engine"
    got = post(base_url, "/tokenize", {"model": engine.model_id, "prompt": text}).json()
    want = hf_tokenizer.encode(text, add_special_tokens=False).ids
    assert got == {"tokens": want, "count": len(want), "max_model_len": engine.context_length}
    messages = [{"role": "user", "content": "hi"}]
    got = post(base_url, "/tokenize", {"messages": messages}).json()
    assert got["tokens"] == engine.encode(engine.chat_prompt(messages), add_special_tokens=False)


def test_detokenize(base_url, hf_tokenizer) -> None:
    ids = hf_tokenizer.encode("naïve 日本語 hello").ids
    want = hf_tokenizer.decode(ids, skip_special_tokens=False)
    assert post(base_url, "/detokenize", {"tokens": ids}).json() == {"content": want, "prompt": want}


@pytest.mark.parametrize(("path", "body", "param", "says"), [
    ("/tokenize", {"content": 5}, "content", "type"),
    ("/tokenize", {"content": "a", "prompt": "b"}, "content", "exactly one"),
    ("/tokenize", {}, "content", "exactly one"),
    ("/tokenize", {"text": "a"}, "text", "unknown field"),
    ("/tokenize", {"content": "a\ud800b"}, "content", "lone surrogate"),
    ("/tokenize", {"prompt": "\udfff"}, "prompt", "lone surrogate"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "one of"),
    ("/detokenize", {"tokens": [1, "a"]}, "tokens", "token ids"),
    ("/detokenize", {"tokens": [10**9]}, "tokens", "outside the vocabulary"),
    ("/detokenize", {"tokens": [1], "model": "other"}, "model", "does not exist"),
])
def test_tokenize_errors(base_url, path, body, param, says) -> None:
    raw = json.dumps(body).encode()  # ASCII JSON: lone surrogates travel as \\ud800 escapes
    response = httpx.post(base_url + path, content=raw, headers={"content-type": "application/json"}, timeout=10)
    assert_error(response, 404 if "exist" in says else 400, param, says)


SAMPLE = re.compile(r'^([a-z_]+)(\{[a-z]+="[^"]*"\})? (-?[0-9.e+-]+|\+Inf|NaN)$')


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus' text format, strictly: HELP/TYPE lines for each family before its samples."""
    values, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            typed.add(name)
            continue
        match = SAMPLE.match(line)
        assert match, line
        name = match.group(1)
        assert name in typed or re.sub(r"_(bucket|sum|count)$", "", name) in typed, line
        values[name + (match.group(2) or "")] = float(match.group(3))
    return values


def test_metrics_count_what_the_responses_reported(base_url, engine) -> None:
    before = parse_metrics(httpx.get(base_url + "/metrics", timeout=5).text)
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=30)
    usages = [client.completions.create(model=engine.model_id, prompt=p, max_tokens=n, temperature=0).usage
              for p, n in (("hello world", 5), ("the engine", 9), ("café", 3))]
    response = httpx.get(base_url + "/metrics", timeout=5)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = parse_metrics(response.text)

    def grew(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert grew('orion_requests_total{outcome="completed"}') == 3
    assert grew("orion_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert grew("orion_generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert grew("orion_time_to_first_token_seconds_count") == 3
    assert grew('orion_time_to_first_token_seconds_bucket{le="+Inf"}') == 3
    assert grew("orion_time_to_first_token_seconds_sum") > 0
    assert grew("orion_time_per_output_token_seconds_count") == 3  # every request made more than one token
    buckets = [v for k, v in after.items() if k.startswith("orion_time_to_first_token_seconds_bucket")]
    assert buckets == sorted(buckets)  # cumulative
    assert after["orion_requests_waiting"] == 0 and after["orion_requests_running"] == 0
    assert after["orion_generation_tokens_per_second"] > 0
