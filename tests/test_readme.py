"""The README's Python examples run as written and compute what they say.

Each block is matched to a check of its results by a line it contains; the references are
independent (the numpy GPT-2 of support.gpt2_reference at 3% of the largest logit, numpy tanh at
fp16 tolerance, the attention block's own numpy reference, the tokenizer's own decode, and
transformers' apply_chat_template). The text examples run in a directory holding ``gpt2-dir``, a small
Hugging Face GPT-2 directory with a byte-level tokenizer and a chat template."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.gpt2_reference import reference_logits
from support.text_fixtures import write_model_dir

CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def close(got: np.ndarray, want: np.ndarray, fraction: float = 0.03) -> None:
    np.testing.assert_allclose(got, want, rtol=0, atol=fraction * float(np.abs(want).max()))


def check_gpt2(ns: dict[str, Any]) -> None:
    model, ids, tokens = ns["model"], ns["ids"], ns["tokens"]
    want = reference_logits(model.config, model.weights, ids + [tokens[0]])
    assert ns["logits"].shape == (len(ids), model.config.vocab_size) and ns["logits"].dtype == np.float32
    close(ns["logits"], want[: len(ids)])
    assert len(tokens) == 8 and all(0 <= t < model.config.vocab_size for t in tokens)
    close(ns["next_logits"], want[len(ids)])
    assert (model.cache.length, ns["branch"].cache.length) == (len(ids), len(ids) + 1)


def check_attention(ns: dict[str, Any]) -> None:
    want = ns["X"] + ns["wo"] @ ns["out"]
    assert ns["y"].shape == (1, ns["d"], 1, ns["s"])
    np.testing.assert_allclose(ns["y"][0, :, 0, :], want, rtol=0, atol=3e-2)


def check_tanh(ns: dict[str, Any]) -> None:
    np.testing.assert_allclose(ns["y"].astype(np.float32), np.full((1, 64, 1, 32), np.tanh(1.0)), rtol=0, atol=2e-3)
    np.testing.assert_allclose(ns["outputs"]["y"].array.astype(np.float32), np.tanh(0.5), rtol=0, atol=2e-3)


def check_text(ns: dict[str, Any]) -> None:
    run, tok = ns["run"], ns["model"].tokenizer
    full = tok.decode(run.token_ids)
    if isinstance(run.stopped_by, str):  # the text ends right before the first stop string
        assert run.finish_reason == "stop" and full.find(run.stopped_by) == len(run.text) and full.startswith(run.text)
    elif run.stopped_by is not None:  # an end-of-sequence id: its own text is not output
        assert run.finish_reason == "stop" and run.text == tok.decode(run.token_ids[:-1])
    else:
        assert run.finish_reason == "length" and run.text == full and len(run.token_ids) == 24
    assert "\n" not in run.text and "engine" not in run.text
    assert ns["reason"] == run.finish_reason and ns["text"] == run.text
    assert ns["ids"] == list(ns["model"].generate(tok.encode("hello world"), 8))


def check_chat(ns: dict[str, Any]) -> None:
    model = ns["model"]
    assert ns["prompt"] == "<|user|>Say hello.<|endoftext|><|assistant|>"
    assert ns["reply"] == "".join(model.generate_text(model.prompt_ids(ns["chat"]), 16))


def check_embedding(ns: dict[str, Any]) -> None:
    model, ids, steps = ns["model"], ns["ids"], ns["steps"]
    want = reference_logits(model.config, model.weights, ids + steps + [ns["runner_up"]])
    close(ns["logits"], want[len(ids) + len(steps) - 1])
    close(ns["branch_logits"], want[-1])
    assert ns["branch"].cache.length == len(ids) + len(steps) + 1
    assert steps == list(model.generate(ids, 5))
    eos = set(model.tokenizer.eos_token_ids)
    assert len(ns["tokens"]) == 6 and not eos & set(ns["tokens"]) and ns["finish"] == "length"


def check_structured(ns: dict[str, Any]) -> None:
    import jsonschema

    jsonschema.validate(ns["answer"], ns["schema"])  # an independent validator
    assert ns["guide"].accepting


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "GrammarProcessor(Grammar": check_structured,
    'stop=["\\n", "engine"]': check_text,
    'chat = [{"role"': check_chat,
    "def no_eos": check_embedding,
    "GPT2.random(": check_gpt2,
    'orion.Graph("attn_block")': check_attention,
    "program = orion.compile(mil)": check_tanh,
}


@pytest.fixture(scope="module")
def text_models(tmp_path_factory):
    """A working directory holding ``gpt2-dir``, as the text examples expect."""
    root = tmp_path_factory.mktemp("readme")
    write_model_dir(root / "gpt2-dir", chat_template=CHAT_TEMPLATE)
    return root


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_and_is_right(index: int, text_models, monkeypatch) -> None:
    monkeypatch.chdir(text_models)
    block = BLOCKS[index]
    checks = [check for marker, check in CHECKS.items() if marker in block]
    assert len(checks) == 1, f"README python block {index} needs exactly one check in tests/test_readme.py"
    namespace: dict[str, Any] = {}
    exec(compile(block, f"README.md python block {index}", "exec"), namespace)
    checks[0](namespace)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 6
