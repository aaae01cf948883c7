"""Structured output and logit_bias over HTTP with the official openai client, on the random-weight GPT-2:
every JSON reply parses and validates against its schema (jsonschema, an independent validator); logit_bias
equals the model's own generate with the same bias added (a logits processor); bad values are 400s."""

from __future__ import annotations

import json

import httpx
import jsonschema
import numpy as np
import openai
import pytest

from .test_bad_input import assert_error, chat, completion, post

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
    "additionalProperties": False,
}


@pytest.fixture
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_reply_validates(client, engine, seed) -> None:
    reply = client.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": "who?"}],
                                           max_tokens=80, temperature=1.0, seed=seed,
                                           response_format=schema_format(SCHEMA))
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_schema_stream_validates(client, engine) -> None:
    stream = client.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=80, temperature=0.9, seed=11, stream=True,
                                            response_format=schema_format(SCHEMA))
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_reply_is_an_object(client, engine) -> None:
    for seed in (3, 4):
        reply = client.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": "x"}],
                                               max_tokens=100, temperature=0.7, seed=seed,
                                               response_format={"type": "json_object"})
        assert reply.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_logit_bias_equals_generate_with_the_bias(client, engine, reference) -> None:
    tok = reference.tokenizer
    prompt_ids = tok.encode("hello world")
    greedy = list(reference.generate(prompt_ids, 6))
    bias = {greedy[0]: -100.0, tok.encode(" engine", add_special_tokens=False)[0]: 5.0}

    def biased(history: list[int], logits: np.ndarray) -> np.ndarray:
        for token, value in bias.items():
            logits[token] += value
        return logits

    tokens = list(reference.generate(prompt_ids, 6, logits_processor=biased))
    eos = tok.eos_token_id
    want = tok.decode([t for t in tokens if t != eos])
    reply = client.completions.create(model=engine.model_id, prompt="hello world", max_tokens=6, temperature=0,
                                      logit_bias={str(k): v for k, v in bias.items()})
    assert reply.choices[0].text == want and tokens[0] != greedy[0]


@pytest.mark.parametrize(("value", "says"), [
    ({"abc": 1}, "not a token id"), ({"99999999": 1}, "not a token id"), ({"9" * 5000: 1}, "not a token id"), ({"5": 101}, "[-100, 100]"),
    ({"5": "x"}, "[-100, 100]"), ([5], "object"),
])
def test_bad_logit_bias(base_url, engine, value, says) -> None:
    assert_error(post(base_url, "/v1/completions", completion(engine, logit_bias=value)), 400, "logit_bias", says)


@pytest.mark.parametrize(("value", "param", "says"), [
    ({"type": "json"}, "response_format", "json_schema"),
    ({"type": "json_schema"}, "response_format.json_schema", "schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}, "response_format",
     "nonsense"),
])
def test_bad_response_format(base_url, engine, value, param, says) -> None:
    assert_error(post(base_url, "/v1/chat/completions", chat(engine, response_format=value)), 400, param, says)
    assert httpx.get(base_url + "/health", timeout=5).status_code == 200
