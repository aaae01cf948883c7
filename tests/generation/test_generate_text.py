"""generate / generate_text on a real (small) model: stop strings and ids, incremental UTF-8, finish
reasons, prompt checks, sampling options against transformers' processors, generation_config.json
defaults and chat templates against transformers' apply_chat_template.

The text model's tokens are forced with a logits processor where a test needs a given text, so the
expected output is the tokenizer's own decode of those ids (the independent reference)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orion
from orion import models
from orion.generation.defaults import GenerationConfigWarning, GenerationDefaults
from orion.generation.loop import ContextLengthWarning, GenerationError
from orion.generation.sampling import apply_repetition_penalty, sampling_probs
from orion.generation.tokenizer import TokenizerError
from support import references
from support.text_fixtures import CONFIG, EOS, write_model_dir

CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("gpt2"), chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def model(model_dir):
    return models.load(model_dir, progress=False)


def forcing(ids: list[int]):
    """A logits processor that makes greedy decoding produce ``ids`` (then repeats the last)."""
    def force(history: list[int], logits: np.ndarray) -> np.ndarray:
        step = len(history) - force.prompt_len
        out = np.full_like(logits, -1e4)
        out[ids[min(step, len(ids) - 1)]] = 0.0
        return out
    force.prompt_len = 0
    return force


def forced_text(model, prompt: str, target: list[int], **options):
    force = forcing(target)
    force.prompt_len = len(model.prompt_ids(prompt))
    return model.generate_text(prompt, len(target), logits_processor=force, **options)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8", exclude_characters=EOS), min_size=1, max_size=12))
def test_streamed_text_equals_decode_of_all_ids_for_any_unicode(model, text) -> None:
    tok = model.tokenizer
    target = tok.encode(text, add_special_tokens=False)[:40]
    pieces = list(forced_text(model, "hello", target))
    assert "".join(pieces) == tok.decode(target)
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text


def test_multibyte_text_streams_whole_characters(model) -> None:
    text = " café 🙂 naïve 日本語"
    target = model.tokenizer.encode(text, add_special_tokens=False)
    pieces = list(forced_text(model, "hello", target))
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    assert len(target) > len(text.split())  # the emoji and CJK really span several tokens


@pytest.mark.parametrize("stop", ["\n", ["zzz", "\n"], ["wor"]])
def test_stop_strings_end_the_text_before_the_match(model, stop) -> None:
    text = " hello\nworld, hello engine"
    target = model.tokenizer.encode(text, add_special_tokens=False)
    run = forced_text(model, "the", target, stop=stop)
    out = "".join(run)
    first = min(text.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s in text)
    assert out == text[:first]
    assert run.finish_reason == "stop" and run.stopped_by in (stop if isinstance(stop, list) else [stop])
    assert len(run.token_ids) < len(target)


def test_stop_string_split_over_tokens_leaves_no_partial_match(model) -> None:
    tok = model.tokenizer
    target = [tok.encode(c, add_special_tokens=False)[0] for c in " abXYcd"]  # one token per character
    run = forced_text(model, "the", target, stop="XYc")
    assert "".join(run) == " ab" and run.finish_reason == "stop"
    run = forced_text(model, "the", target, stop="XYz")  # a partial match is released once it fails
    assert "".join(run) == " abXYcd" and run.finish_reason == "length"


def test_stop_token_ids_and_eos(model) -> None:
    tok = model.tokenizer
    target = tok.encode(" hello world", add_special_tokens=False)
    run = forced_text(model, "the", target, stop=target[1])
    assert "".join(run) == tok.decode(target[:1]) and run.stopped_by == target[1] and run.finish_reason == "stop"
    eos = tok.token_to_id(EOS) if hasattr(tok, "token_to_id") else tok.eos_token_id
    run = forced_text(model, "the", [*target[:2], tok.eos_token_id, *target[2:]])
    assert "".join(run) == tok.decode(target[:2]) and run.stopped_by == eos  # the EOS text is not output
    ids = model.generate([1, 2, 3], 10, stop=[target[0], "never"])  # generate: ids and strings too
    assert list(ids) and ids.finish_reason in ("stop", "length")


def test_generate_on_ids_stops_at_eos_unless_ignore_eos(model) -> None:
    """transformers' generate stops at the model's EOS ids, and so does generate on token ids (the EOS id is
    the last one yielded); ignore_eos=True runs on to max_new_tokens."""
    tok = model.tokenizer
    target = tok.encode(" hello world engine", add_special_tokens=False)
    forced = [*target[:2], tok.eos_token_id, *target[2:]]
    force = forcing(forced)
    force.prompt_len = 3
    run = model.generate([1, 2, 3], len(forced), logits_processor=force)
    assert list(run) == forced[:3] and run.finish_reason == "stop" and run.stopped_by == tok.eos_token_id
    run = model.generate([1, 2, 3], len(forced), logits_processor=force, ignore_eos=True)
    assert list(run) == forced and run.finish_reason == "length"
    text = forced_text(model, "the", forced, ignore_eos=True)
    assert "".join(text) == tok.decode(forced) and text.finish_reason == "length"


def test_generate_with_stop_string_includes_the_tokens_that_complete_it(model) -> None:
    tok = model.tokenizer
    target = [tok.encode(c, add_special_tokens=False)[0] for c in " abXYcd"]
    force = forcing(target)
    force.prompt_len = 3
    run = model.generate([1, 2, 3], 7, stop="XY", logits_processor=force)
    assert list(run) == target[:5] and run.stopped_by == "XY"


def test_finish_reason_length_and_context_end_warns(model) -> None:
    run = model.generate([1, 2, 3], 5)
    assert len(list(run)) == 5 and run.finish_reason == "length" and not run.context_full
    prompt = list(range(1, CONFIG.n_positions - 2))
    run = model.generate(prompt, 20)
    with pytest.warns(ContextLengthWarning, match=r"stopped after 4 of 20 new tokens: .*context length 128"):
        assert len(list(run)) == 4
    assert run.finish_reason == "length" and run.context_full
    zero = model.generate([1], 0)
    assert list(zero) == [] and zero.finish_reason == "length"


@pytest.mark.parametrize("bad, message", [
    ([1.7, 2.2], r"token ids are integers, got 1.7 \(float\)"),
    (np.array([1.0, 2.0]), r"token ids are integers, got 1.0"),
    ([[1, 2], [3, 4]], "batched prompts are not supported"),
    (np.array([[1, 2], [3, 4]]), r"batched prompts are not supported \(got an array of shape \(2, 2\)\)"),
    (["a b", "c"], "batched prompts are not supported"),
    ([True, 2], "got True"),
])
def test_bad_token_ids_are_refused(model, bad, message) -> None:
    for call in (model.logits, model.prefill, lambda ids: model.generate(ids, 2)):
        with pytest.raises(GenerationError, match=message):
            call(bad)
    with pytest.raises(GenerationError, match="token ids are integers"):
        model.decode_step(2.5)


def test_text_prompts_and_empty_prompts_start_from_bos(model) -> None:
    tok = model.tokenizer
    ids = tok.encode("hello world")
    np.testing.assert_array_equal(model.logits("hello world"), model.logits(ids))
    assert list(model.generate("hello world", 4)) == list(model.generate(ids, 4))
    assert model.prompt_ids("") == [tok.bos_token_id]
    assert "".join(model.generate_text("", 4)) == tok.decode(list(model.generate([tok.bos_token_id], 4)))
    bare = models.random(CONFIG, progress=False)
    with pytest.raises(GenerationError, match="prompt is empty and this model names no BOS"):
        bare.generate([], 3)
    with pytest.raises(orion.OrionError, match="no tokenizer"):
        bare.generate("text", 3)


def test_a_tokenizer_smaller_than_the_vocabulary_never_samples_an_id_without_text(model, tmp_path) -> None:
    """Issue 22: real Qwen checkpoints have 151,936 embedding rows and 151,665 tokens. Here the model's
    own favourite ids are beyond the tokenizer (its rows scaled copies of the greedy choice's): they are
    masked, so generation goes on with text (it stopped with TokenizerError before)."""
    tok = model.tokenizer
    with pytest.raises(TokenizerError, match=r"token ids \[600\] are beyond .*tokenizer.json's 512 tokens"):
        tok.decode([5, 600])
    from orion.models import GPT2Config
    from orion.models.gpt2.weights import save_hf
    from support.gpt2_fixtures import lively_weights
    from support.text_fixtures import byte_level_tokenizer

    big = GPT2Config(n_layer=1, n_head=4, n_embd=64, vocab_size=640, n_positions=64)
    weights = lively_weights(big, seed=1)
    save_hf(tmp_path / "plain", big, weights)
    byte_level_tokenizer(512).save(str(tmp_path / "plain" / "tokenizer.json"))
    plain = models.load(tmp_path / "plain", progress=False)
    ids = plain.prompt_ids("hello")
    favourite = int(np.argmax(plain.logits(ids)[-1][:512]))
    weights.wte[512:] = 3 * weights.wte[favourite]  # every id without text now outscores the favourite
    save_hf(tmp_path / "m", big, weights)
    byte_level_tokenizer(512).save(str(tmp_path / "m" / "tokenizer.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wide = models.load(tmp_path / "m", progress=False)
    assert int(np.argmax(wide.logits(ids)[-1])) >= 512  # unmasked, greedy would pick an id without text
    text = wide.generate_text("hello", 6, temperature=0)
    assert isinstance("".join(text), str) and text.token_ids and max(text.token_ids) < 512
    sampled = list(wide.generate("hello", 6, temperature=1.5, seed=3))
    assert max(sampled) < 512
    force = forcing([600])  # a logits processor that insists gets the id, and decoding it is the clear error
    force.prompt_len = 1
    with pytest.raises(TokenizerError, match=r"\[600\] are beyond"):
        list(wide.generate_text("a", 2, logits_processor=force))


def test_repetition_penalty_and_min_p_match_transformers() -> None:
    torch, transformers = references.require("torch", "transformers")
    from transformers.generation import logits_process as lp

    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(64) * 3).astype(np.float32)
    history = [3, 5, 5, 9, 40]
    got = apply_repetition_penalty(logits, history, 1.3)
    want = lp.RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([history]), torch.tensor(logits[None]))[0]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    for temperature, top_k, top_p, min_p in [(0.7, None, None, 0.1), (1.0, 10, 0.9, 0.05), (1.3, None, 0.8, None)]:
        scores = torch.tensor(logits[None])
        scores = lp.TemperatureLogitsWarper(temperature)(None, scores)
        if top_k:
            scores = lp.TopKLogitsWarper(top_k)(None, scores)
        if top_p:
            scores = lp.TopPLogitsWarper(top_p)(None, scores)
        if min_p:
            scores = lp.MinPLogitsWarper(min_p)(None, scores)
        want = torch.softmax(scores.double(), -1)[0].numpy()
        np.testing.assert_allclose(sampling_probs(logits, temperature, top_k, top_p, min_p), want, atol=1e-6)


def test_repetition_penalty_changes_greedy_output(model) -> None:
    plain = list(model.generate([1, 2, 3], 24))
    penalised = list(model.generate([1, 2, 3], 24, repetition_penalty=5.0))
    assert len(set(penalised)) > len(set(plain)) or penalised != plain


def test_generation_config_json_gives_the_defaults(tmp_path) -> None:
    write_model_dir(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 5, "repetition_penalty": 1.1,
         "transformers_version": "4.40"}))
    model = models.load(tmp_path, progress=False)
    source = str(tmp_path / "generation_config.json")
    assert model.generation_defaults == GenerationDefaults(0.7, 50, 0.9, None, 1.1, 5, source)
    run = model.generate([1, 2, 3], seed=4)
    tokens = list(run)
    assert len(tokens) == 5  # max_new_tokens from the file
    assert tokens == list(model.generate([1, 2, 3], 5, temperature=0.7, top_k=50, top_p=0.9, seed=4,
                                         repetition_penalty=1.1))
    assert list(model.generate([1, 2, 3], 5, temperature=0)) == list(
        model.generate([1, 2, 3], 5, temperature=0, repetition_penalty=1.1))
    (tmp_path / "generation_config.json").write_text(json.dumps({"num_beams": 4, "do_sample": False}))
    with pytest.warns(GenerationConfigWarning, match=r"does not implement \{'num_beams': 4\}"):
        assert models.load(tmp_path, progress=False).generation_defaults.temperature == 0.0
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": -1}))
    with pytest.raises(orion.OrionError, match=r"generation_config.json: temperature=-1"):
        models.load(tmp_path, progress=False)


def test_chat_template_matches_transformers(model, model_dir) -> None:
    (transformers,) = references.require("transformers")
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"),
                                              eos_token=EOS, bos_token=EOS)
    hf.chat_template = CHAT_TEMPLATE
    text = model.tokenizer.apply_chat_template(messages)
    assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert model.prompt_ids(messages) == list(hf.apply_chat_template(messages, tokenize=True,
                                                                    add_generation_prompt=True, return_dict=False))
    assert list(model.generate(messages, 4)) == list(model.generate(model.prompt_ids(messages), 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance("".join(model.generate_text(messages, 4)), str)


def test_chat_errors_are_clear(tmp_path) -> None:
    write_model_dir(tmp_path)
    model = models.load(tmp_path, progress=False)
    with pytest.raises(orion.OrionError, match="no chat_template"):
        model.generate_text([{"role": "user", "content": "hi"}], 2)
    write_model_dir(tmp_path, chat_template="{% if %}")
    with pytest.raises(orion.OrionError, match="chat_template line 1"):
        models.load(tmp_path, progress=False)


def test_bad_options_fail_before_any_work(model, monkeypatch) -> None:
    monkeypatch.setattr(model, "prefill", lambda ids: pytest.fail("prefill ran"))
    for options, message in [({"temperature": -1}, "temperature=-1"), ({"top_p": 1.5}, "top_p=1.5"),
                             ({"min_p": 2}, "min_p=2"), ({"repetition_penalty": 0}, "repetition_penalty=0"),
                             ({"stop": ""}, "empty string"), ({"logits_processor": 3}, "not callable")]:
        with pytest.raises(orion.OrionError, match=message):
            model.generate([1, 2], 3, **options)
