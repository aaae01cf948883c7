"""The server over batched lanes: concurrent requests give what the model gives alone, ``n`` choices run
as forked lanes of one prompt, ``logprobs``/``top_logprobs`` in OpenAI's completions and chat shapes, and
per-request usage (token counts, time to first token, tok/s), and speculative requests (drafts checked in
their lanes' chunk runs while plain requests decode beside them) giving plain decoding's tokens.

References: the model's own ``generate`` (an instance independent of the server's) for tokens, and the
log-softmax in float64 of its full-sequence logits (``logits(prompt + tokens)``, the prefill programs)
for log-probabilities, within 0.05 (fp16 rounding of decode against prefill logits)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from orion.generation import batch as batch_module
from orion.generation import speculative

LOGPROB_TOLERANCE = 0.05


def post(base_url: str, path: str, body: dict) -> dict:
    response = httpx.post(base_url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    return z - (z.max(axis=-1, keepdims=True) + np.log(np.exp(z - z.max(axis=-1, keepdims=True)).sum(-1, keepdims=True)))


def test_concurrent_requests_match_the_model_alone(base_url, engine, reference) -> None:
    prompts = ["hello world", "the engine", "café naïve", "stop strings end the text", "the server answers"]
    want = [reference.tokenizer.decode(list(reference.generate(reference.tokenizer.encode(p), 10, temperature=0,
                                                                 ignore_eos=True))) for p in prompts]
    body = {"model": engine.model_id, "max_tokens": 10, "temperature": 0, "logit_bias": {str(engine.eos_token_id): -100}}
    with ThreadPoolExecutor(len(prompts)) as pool:  # more requests than lanes: some wait, then join mid-batch
        got = list(pool.map(lambda p: post(base_url, "/v1/completions", body | {"prompt": p}), prompts))
    assert [g["choices"][0]["text"] for g in got] == want


def test_n_choices_are_forked_lanes_of_one_prompt(base_url, engine, reference) -> None:
    ids = reference.tokenizer.encode("hello engine")
    body = {"model": engine.model_id, "prompt": "hello engine", "max_tokens": 8, "n": 3, "temperature": 1.0,
            "seed": 11, "logit_bias": {str(engine.eos_token_id): -100}}
    got = post(base_url, "/v1/completions", body)
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    want = [reference.tokenizer.decode(list(reference.generate(ids, 8, temperature=1.0, seed=11 + i, ignore_eos=True)))
            for i in range(3)]
    assert [c["text"] for c in got["choices"]] == want  # choice i samples with seed + i
    assert got["usage"]["prompt_tokens"] == len(ids) and got["usage"]["completion_tokens"] == 24


def test_completion_logprobs_are_the_models_log_softmax(base_url, engine, reference) -> None:
    ids = reference.tokenizer.encode("the neural engine")
    body = {"model": engine.model_id, "prompt": ids, "max_tokens": 6, "temperature": 0, "logprobs": 3,
            "logit_bias": {str(engine.eos_token_id): -100}}
    got = post(base_url, "/v1/completions", body)["choices"][0]
    tokens = list(reference.generate(ids, 6, temperature=0, ignore_eos=True))
    want = log_softmax(reference.logits(ids + tokens[:-1])[len(ids) - 1:])
    lp = got["logprobs"]
    assert lp["tokens"] == [reference.tokenizer.decode([t]) for t in tokens]
    np.testing.assert_allclose(lp["token_logprobs"], want[np.arange(6), tokens], atol=LOGPROB_TOLERANCE)
    for row, top in zip(want, lp["top_logprobs"]):  # keyed by text: two byte pieces may both read '\ufffd'
        best = row[np.argsort(-row)[:3]]
        assert 1 <= len(top) <= 3 and all(np.abs(best - v).min() < LOGPROB_TOLERANCE for v in top.values())
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])


def test_chat_logprobs_stream_and_usage(base_url, engine, reference) -> None:
    messages = [{"role": "user", "content": "hello"}]
    ids = reference.tokenizer.encode(engine.chat_prompt(messages), add_special_tokens=False)
    body = {"model": engine.model_id, "messages": messages, "max_tokens": 5, "temperature": 0, "logprobs": True,
            "top_logprobs": 2, "logit_bias": {str(engine.eos_token_id): -100}}
    whole = post(base_url, "/v1/chat/completions", body)
    content = whole["choices"][0]["logprobs"]["content"]
    tokens = list(reference.generate(ids, 5, temperature=0, ignore_eos=True))
    want = log_softmax(reference.logits(ids + tokens[:-1])[len(ids) - 1:])
    assert [c["token"] for c in content] == [reference.tokenizer.decode([t]) for t in tokens]
    np.testing.assert_allclose([c["logprob"] for c in content], want[np.arange(5), tokens], atol=LOGPROB_TOLERANCE)
    assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"] for c in content)  # greedy
    assert all(c["bytes"] == list(c["token"].encode()) for c in content)
    usage = whole["usage"]
    assert usage["prompt_tokens"] == len(ids) and usage["completion_tokens"] == 5 and usage["total_tokens"] == len(ids) + 5
    assert usage["time_to_first_token_s"] > 0 and usage["tokens_per_second"] > 0
    # Streamed: the same tokens' log-probabilities over the chunks, and the usage chunk last.
    with httpx.stream("POST", base_url + "/v1/chat/completions", timeout=60,
                      json=body | {"stream": True, "stream_options": {"include_usage": True}}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    streamed = [c for e in events for choice in e["choices"] for c in (choice["logprobs"] or {}).get("content", [])]
    assert [c["token"] for c in streamed] == [c["token"] for c in content]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5


def test_speculative_requests_give_plain_decodings_tokens(base_url, engine, reference, monkeypatch) -> None:
    """Two speculative and two plain greedy requests at once. Drafts come from an oracle (the reference's own
    continuation, every third token wrong), so checks accept runs of drafts and reject some mid-way; every
    reply must be the reference's plain greedy one, and the speculative lanes must have checked drafts."""
    prompts = [[5, 9, 14, 3] * 3, [7, 2, 8] * 4, [11, 4] * 5, [6, 6, 1, 12, 3]]
    new = 14
    truths = [ids + list(reference.generate(ids, new, temperature=0, ignore_eos=True)) for ids in prompts]

    def oracle(history: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
        truth = next(t for t in truths if t[:len(history)] == list(history))
        drafts = truth[len(history):len(history) + num_tokens]
        return [(t + 1) % engine.vocab_size if (len(history) + i) % 3 == 0 else t for i, t in enumerate(drafts)]

    checks: list[int] = []
    check = batch_module.Batch.check

    def counted(self, sequence: int, tokens: list[int]) -> np.ndarray:
        checks.append(len(tokens))
        return check(self, sequence, tokens)

    monkeypatch.setattr(speculative, "prompt_lookup", oracle)
    monkeypatch.setattr(batch_module.Batch, "check", counted)
    body = {"model": engine.model_id, "max_tokens": new, "temperature": 0,
            "logit_bias": {str(engine.eos_token_id): -100}}
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda i: post(base_url, "/v1/completions", body | {"prompt": prompts[i],
                                                                                  "speculative": i < 2}),
                            range(len(prompts))))
    assert [g["choices"][0]["text"] for g in got] == [reference.tokenizer.decode(t[len(ids):])
                                                      for t, ids in zip(truths, prompts)]
    assert all(g["usage"]["completion_tokens"] == new for g in got)
    assert checks and max(checks) > 1  # drafts were checked, several per chunk run


def test_speculative_must_be_a_boolean(base_url, engine) -> None:
    response = httpx.post(base_url + "/v1/completions", json={"model": engine.model_id, "prompt": "hi",
                                                               "speculative": "yes"}, timeout=60)
    assert response.status_code == 400 and "speculative" in response.text
