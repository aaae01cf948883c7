"""The server over HTTP with the official openai client and raw httpx: outputs equal the model's own."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from support import references

PROMPTS = ["hello world", "the neural engine", "café 🙂", "stop strings end", "the server answers", "emoji 🚀 in",
           "one token at", "日本語の"]


def expected(reference, prompt_ids: list[int], max_tokens: int, **sampling) -> tuple[str, str, int]:
    """(text, finish_reason, completion_tokens) from the model's own generate."""
    eos = reference.tokenizer.eos_token_id
    tokens = list(reference.generate(prompt_ids, max_tokens, stop=eos, **sampling))
    if tokens and tokens[-1] == eos:
        return reference.tokenizer.decode(tokens[:-1]), "stop", len(tokens)
    return reference.tokenizer.decode(tokens), "length", len(tokens)


def chat_ids(reference, model_dir, messages) -> list[int]:
    """The chat prompt as transformers renders the directory's template (an independent renderer)."""
    (transformers,) = references.require("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"),
                                 **json.loads((model_dir / "tokenizer_config.json").read_text()))
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return reference.tokenizer.encode(text)


@pytest.fixture
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_and_health(client, base_url, engine) -> None:
    assert [m.id for m in client.models.list().data] == [engine.model_id]
    assert client.models.retrieve(engine.model_id).id == engine.model_id
    health = httpx.get(base_url + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_completion_equals_generate(client, engine, reference, prompt) -> None:
    ids = reference.tokenizer.encode(prompt)
    text, reason, n = expected(reference, ids, 24, temperature=0.0)
    out = client.completions.create(model=engine.model_id, prompt=prompt, max_tokens=24, temperature=0)
    assert out.choices[0].text == text and out.choices[0].finish_reason == reason
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (len(ids), n, len(ids) + n)


def test_token_id_prompt_and_default_max_tokens(client, engine, reference) -> None:
    ids = reference.tokenizer.encode("hello engine")
    text, reason, n = expected(reference, ids, 16, temperature=0.0)  # OpenAI's default max_tokens is 16
    out = client.completions.create(model=engine.model_id, prompt=ids, temperature=0)
    assert (out.choices[0].text, out.choices[0].finish_reason, out.usage.completion_tokens) == (text, reason, n)


def test_seeded_sampling_equals_generate(client, engine, reference) -> None:
    ids = reference.tokenizer.encode("the model")
    text, _, _ = expected(reference, ids, 20, temperature=0.9, top_k=50, top_p=0.95, seed=7)
    out = client.completions.create(model=engine.model_id, prompt="the model", max_tokens=20, temperature=0.9,
                                    top_p=0.95, seed=7, extra_body={"top_k": 50})
    assert out.choices[0].text == text


def test_chat_completion_equals_generate(client, engine, reference, model_dir) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello engine"}]
    ids = chat_ids(reference, model_dir, messages)
    text, reason, n = expected(reference, ids, 20, temperature=0.0)
    out = client.chat.completions.create(model=engine.model_id, messages=messages, max_tokens=20, temperature=0)
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == text
    assert out.choices[0].finish_reason == reason and out.usage.prompt_tokens == len(ids)
    assert out.usage.completion_tokens == n


def test_streamed_completion_equals_whole(client, engine, reference) -> None:
    ids = reference.tokenizer.encode("café 🙂")
    text, reason, n = expected(reference, ids, 30, temperature=0.0)
    chunks = list(client.completions.create(model=engine.model_id, prompt="café 🙂", max_tokens=30, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == n


def test_streamed_chat_ends_in_done(base_url, engine, reference, model_dir) -> None:
    messages = [{"role": "user", "content": "emoji 🚀 in the stream"}]
    text, reason, _ = expected(reference, chat_ids(reference, model_dir, messages), 25, temperature=0.0)
    body = {"model": engine.model_id, "messages": messages, "max_tokens": 25, "temperature": 0, "stream": True}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == reason
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_before_the_match(client, engine, reference, stream) -> None:
    ids = reference.tokenizer.encode("hello world")
    full, _, _ = expected(reference, ids, 40, temperature=0.0)
    # three characters in the middle, possibly across token boundaries, with no replacement character
    stop = next((full[i:i + 3] for i in range(6, len(full) - 3) if "\ufffd" not in full[i:i + 3]), None)
    assert stop is not None, f"the test model's greedy text has nothing to cut on: {full!r}"
    kwargs = dict(model=engine.model_id, prompt="hello world", max_tokens=40, temperature=0, stop=["<never>", stop])
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(**kwargs)
        text, reason = out.choices[0].text, out.choices[0].finish_reason
    assert text == full[:full.find(stop)] and reason == "stop"


def test_length_finish_reason(client, engine, reference) -> None:
    ids = reference.tokenizer.encode("one token at")
    _, reason, _ = expected(reference, ids, 3, temperature=0.0)
    assert reason == "length", "the reference ended on its end-of-text token: pick another prompt"
    out = client.completions.create(model=engine.model_id, prompt="one token at", max_tokens=3, temperature=0)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3


def test_generation_ends_at_the_context(client, engine, reference) -> None:
    ids = (reference.tokenizer.encode("the neural engine ") * engine.context_length)[: engine.context_length - 2]
    out = client.completions.create(model=engine.model_id, prompt=ids, max_tokens=50, temperature=0)
    text, reason, n = expected(reference, ids, 50, temperature=0.0)
    assert n <= 3 and out.usage.completion_tokens == n  # the last position's logits give one token more
    assert (out.choices[0].text, out.choices[0].finish_reason) == (text, reason)


def test_repetition_penalty_and_min_p_apply(client, engine, reference) -> None:
    """A repetition penalty changes greedy text as a transformers logits processor over the model's logits does."""
    torch, transformers = references.require("torch", "transformers")
    ids = reference.tokenizer.encode("hello world, hello")
    penalty = transformers.RepetitionPenaltyLogitsProcessor(1.5)
    seq, logits, new = list(ids), reference.prefill(ids), []
    for _ in range(12):
        scores = penalty(torch.tensor([seq]), torch.tensor(logits, dtype=torch.float32)[None])
        token = int(scores.argmax())
        new.append(token)
        seq.append(token)
        logits = reference.decode_step(token)
    plain, _, _ = expected(reference, ids, 12, temperature=0.0)
    out = client.completions.create(model=engine.model_id, prompt=ids, max_tokens=12, temperature=0,
                                    extra_body={"repetition_penalty": 1.5, "min_p": 0.1})  # min_p: no effect greedy
    assert reference.tokenizer.eos_token_id not in new
    assert out.choices[0].text == reference.tokenizer.decode(new) != plain


@pytest.mark.parametrize("clients", [2, 8])
def test_concurrent_streams_get_their_own_tokens(base_url, engine, reference, clients) -> None:
    prompts = PROMPTS[:clients]
    wanted = [expected(reference, reference.tokenizer.encode(p), 30, temperature=0.0)[0] for p in prompts]
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)

    async def one(prompt: str) -> tuple[str, int]:
        stream = await client.completions.create(model=engine.model_id, prompt=prompt, max_tokens=30, temperature=0,
                                                 stream=True)
        pieces = [chunk.choices[0].text async for chunk in stream]
        return "".join(pieces), len(pieces)

    async def all_of_them() -> list[tuple[str, int]]:
        async with client:
            return await asyncio.gather(*(one(p) for p in prompts))

    results = asyncio.run(asyncio.wait_for(all_of_them(), 60))
    assert [text for text, _ in results] == wanted
    assert all(chunks > 1 for _, chunks in results)  # really streamed


def test_slow_reader_gets_everything(base_url, engine, reference) -> None:
    import time

    text, _, _ = expected(reference, reference.tokenizer.encode("hello world"), 40, temperature=0.0)
    body = {"model": engine.model_id, "prompt": "hello world", "max_tokens": 40, "temperature": 0, "stream": True}
    pieces = []
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            time.sleep(0.01)
            if line.startswith("data: {"):
                pieces.append(json.loads(line[6:])["choices"][0]["text"])
    assert "".join(pieces) == text
