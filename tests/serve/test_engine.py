"""The GPT-2 engine: logits processors against transformers, chat prompts, generation, cancellation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orion.generation.chat import ChatTemplate, ChatTemplateError
from orion.serve.engine import Engine, PromptError, SamplingParams
from orion.serve.logits import LogitsProcessor
from orion.serve.model_engine import ModelEngine
from support import references

from .conftest import EOS, write_model

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    "{# {{ messages | tojson }} #}"
)
MESSAGES = [{"role": "system", "content": "you are terse"}, {"role": "user", "content": "café 🙂 \"quoted\""},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]


def test_engine_satisfies_the_protocol(engine) -> None:
    assert isinstance(engine, Engine)
    config = engine.model.config
    assert (engine.context_length, engine.vocab_size) == (config.n_positions, config.vocab_size)
    assert engine.chat_template is engine.tokenizer.chat_template  # the model's own
    assert engine.eos_token_id == engine.tokenizer.encode(EOS)[0]


def test_repetition_penalty_matches_transformers() -> None:
    torch, transformers = references.require("torch", "transformers")
    rng = np.random.default_rng(0)
    vocab, prompt, new = 50, [3, 4, 4, 9], [9, 17, 3]
    logits = rng.normal(0, 3, vocab).astype(np.float32)
    process = LogitsProcessor(SamplingParams(max_tokens=8, temperature=0.7, repetition_penalty=1.3), prompt, vocab)
    for token in new:
        process.record(token)
    want = transformers.RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + new]), torch.tensor(logits)[None])
    np.testing.assert_allclose(process(logits), want[0].numpy(), rtol=1e-6)


def test_frequency_and_presence_penalties_follow_openai() -> None:
    logits = np.linspace(-2, 2, 10, dtype=np.float32)
    params = SamplingParams(max_tokens=4, frequency_penalty=0.5, presence_penalty=0.25)
    process = LogitsProcessor(params, prompt_ids=[1, 2], vocab_size=10)  # the prompt does not count
    for token in (7, 7, 3):
        process.record(token)
    want = logits.astype(np.float64).copy()
    for token, count in ((7, 2), (3, 1)):
        want[token] -= count * 0.5 + 0.25
    np.testing.assert_allclose(process(logits), want, rtol=0, atol=1e-6)


def test_no_processor_leaves_logits_alone() -> None:
    logits = np.arange(5, dtype=np.float32)
    assert LogitsProcessor(SamplingParams(max_tokens=1, min_p=0.5, temperature=0), [0], 5)(logits) is logits


def test_chat_template_renders_as_transformers_does(tmp_path) -> None:
    (transformers,) = references.require("transformers")
    directory = write_model(tmp_path, chat_template=CHATML)
    engine = ModelEngine.from_directory(directory, progress=False)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                 **json.loads((directory / "tokenizer_config.json").read_text()))
    assert engine.chat_prompt(MESSAGES) == hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


def test_plain_chat_format_without_a_template(tmp_path) -> None:
    engine = ModelEngine.from_directory(write_model(tmp_path, chat_template=None), progress=False)
    assert engine.chat_template is None
    assert engine.chat_prompt(MESSAGES[:2]) == 'system: you are terse\nuser: café 🙂 "quoted"\nassistant:'


def test_a_refusing_or_broken_template_is_a_prompt_error(engine) -> None:
    with pytest.raises(PromptError, match="start with a user or system message"):
        engine.chat_prompt([{"role": "assistant", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="chat_template line 1"):
        ChatTemplate("{% for %}", engine.tokenizer.path)
    missing = ChatTemplate("{{ messages[5]['content'] }}", engine.tokenizer.path)  # no 6th message
    with pytest.raises(PromptError, match="refused these messages"):
        ModelEngine(engine.model, "m", chat_template=missing).chat_prompt(MESSAGES)


def test_greedy_and_seeded_generation_equal_the_model(engine, reference) -> None:
    ids = reference.tokenizer.encode("hello world")
    never = lambda: False
    for sampling in ({"temperature": 0.0}, {"temperature": 1.1, "top_k": 20, "seed": 4}):
        params = SamplingParams(max_tokens=20, **sampling)
        assert list(engine.generate(ids, params, never)) == list(reference.generate(ids, 20, **sampling))


def test_interleaved_sequences_do_not_mix(engine, reference) -> None:
    prompts = [reference.tokenizer.encode(p) for p in ("hello world", "the engine", "café")]
    params = SamplingParams(max_tokens=15, temperature=0.0)
    gens = [engine.generate(p, params, lambda: False) for p in prompts]
    got: list[list[int]] = [[] for _ in prompts]
    for _ in range(15 + len(prompts)):  # rounds; a prompt waiting for its turn to be read yields None
        for out, gen in zip(got, gens, strict=True):
            token = next(gen, None)
            if token is not None:
                out.append(token)
    assert got == [list(reference.generate(p, 15)) for p in prompts]


def test_joining_prompts_are_read_one_chunk_a_round(engine, reference, monkeypatch) -> None:
    """Prompts read one at a time (a model that cannot pack them): one prefill piece a round."""
    monkeypatch.setattr(type(engine.batch._models[None]), "packs_prompts", property(lambda self: False))
    pieces = [0]  # prefill pieces run so far
    original = type(engine.model)._append_pieces

    def counting(self, *args):  # noqa: ANN001, ANN202
        inner = original(self, *args)
        while True:
            try:
                next(inner)
            except StopIteration as done:
                pieces[0] += 1
                return done.value
            pieces[0] += 1
            yield

    monkeypatch.setattr(type(engine.model), "_append_pieces", counting)
    prompts = [reference.tokenizer.encode(p) for p in ("hello world", "the engine", "café", "stop here")]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    first = engine.generate(prompts[0], params, lambda: False)
    got = [[next(first)]]
    gens = [first, *(engine.generate(p, params, lambda: False) for p in prompts[1:])]  # three join mid-stream
    got += [[] for _ in prompts[1:]]
    per_round = []
    for _ in range(len(prompts) + 7):
        before = pieces[0]
        for out, gen in zip(got, gens, strict=True):
            token = next(gen, None)
            if token is not None:
                out.append(token)
        per_round.append(pieces[0] - before)
        if len(per_round) < len(prompts):
            assert len(got[0]) == len(per_round) + 1  # the decoding stream gets a token every round
    assert per_round[:len(prompts) - 1] == [1, 1, 1] and sum(per_round) == len(prompts) - 1  # one prompt a round
    assert got == [list(reference.generate(p, 8)) for p in prompts]


def test_prompts_joining_together_are_read_in_one_round(engine, reference, monkeypatch) -> None:
    """Three prompts joining a decoding stream are read in one packed pass, in the round after they join: the
    decoding stream still gets a token every round, and every stream the tokens of a separate run."""
    passes = []  # prompts of each packed read
    original = type(engine.model)._read_packed

    def counting(self, prompts):  # noqa: ANN001, ANN202
        passes.append(len(prompts))
        return original(self, prompts)

    monkeypatch.setattr(type(engine.model), "_read_packed", counting)
    prompts = [reference.tokenizer.encode(p) for p in ("hello world", "the engine", "café", "stop here")]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    first = engine.generate(prompts[0], params, lambda: False)
    got = [[next(first)]]  # read alone: nothing joined with it
    gens = [first, *(engine.generate(p, params, lambda: False) for p in prompts[1:])]  # three join mid-stream
    got += [[] for _ in prompts[1:]]
    for round_ in range(8):
        for out, gen in zip(got, gens, strict=True):
            token = next(gen, None)
            if token is not None:
                out.append(token)
        if round_ == 0:
            assert passes == [3] and [len(out) for out in got] == [2, 1, 1, 1]  # all three read in the first round
    assert got == [list(reference.generate(p, 8)) for p in prompts]


def test_cancellation_stops_before_the_next_token(engine) -> None:
    produced: list[int] = []
    tokens = engine.generate([1, 2, 3], SamplingParams(max_tokens=50, temperature=0.0), lambda: len(produced) >= 3)
    for token in tokens:
        produced.append(token)
    assert len(produced) == 3


def test_a_failed_step_fails_its_sequences_and_frees_their_lanes(engine, monkeypatch) -> None:
    calls = {"n": 0}
    original = type(engine.model)._decode_lanes

    def failing(self, tokens):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("device fault")
        return original(self, tokens)

    monkeypatch.setattr(type(engine.model), "_decode_lanes", failing)
    with pytest.raises(RuntimeError, match="device fault"):
        list(engine.generate([1, 2], SamplingParams(max_tokens=10, temperature=0.0), lambda: False))
    monkeypatch.undo()
    assert engine.batch.active == 0  # its lane is free again
    assert len(list(engine.generate([1, 2], SamplingParams(max_tokens=10, temperature=0.0), lambda: False))) == 10


def test_a_prefix_cache_engine_reuses_a_shared_system_prompt_with_the_models_tokens(model_dir, reference) -> None:
    """``--prefix-cache-mb``: requests sharing a long system prompt give the model's own greedy tokens, and
    the later one reads the shared positions from the cache instead of recomputing them."""
    from orion.models import GPT2

    engine = ModelEngine(GPT2.from_pretrained(model_dir, progress=False), "prefix", max_sequences=2,
                         prefix_cache_bytes=1 << 22)
    system = reference.tokenizer.encode("the neural engine runs the model one token at a time. " * 3)
    params = SamplingParams(max_tokens=10, temperature=0.0)
    for user in ("hello world", "the engine"):
        ids = system + reference.tokenizer.encode(user)
        got = [t for t in engine.generate(ids, params, lambda: False) if t is not None]
        assert got == list(reference.generate(ids, 10)), user
    cache = engine.model.prefix_cache
    assert cache.stats.hits == 1 and cache.stats.reused_tokens >= len(system)


def test_the_turns_scheduler_steps_each_sequence_alone_with_the_models_tokens(model_dir, reference) -> None:
    turns = ModelEngine.from_directory(model_dir, progress=False, max_sequences=2, scheduler="turns")
    prompts = [reference.tokenizer.encode(p) for p in ("hello world", "the engine")]
    params = SamplingParams(max_tokens=6, temperature=0.0)
    gens = [turns.generate(p, params, lambda: False) for p in prompts]
    got: list[list[int]] = [[], []]
    for _ in range(6):  # in turns: each next() runs that sequence's own step
        for out, gen in zip(got, gens, strict=True):
            out.append(next(gen))
    assert got == [list(reference.generate(p, 6)) for p in prompts]
    with pytest.raises(PromptError, match="one choice per request"):
        turns.generate_choices(prompts[0], params, lambda: False, 2)
    with pytest.raises(ValueError, match="scheduler='lanes'"):
        ModelEngine(reference, "x", scheduler="lanes")
