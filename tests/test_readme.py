"""The README's Python examples run as written and compute what they say.

Each block is matched to a check of its results by a line it contains; the references are
independent (the numpy GPT-2 of support.gpt2_reference at 3% of the largest logit, numpy tanh at
fp16 tolerance, and the attention block's own numpy reference)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.gpt2_reference import reference_logits

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


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "GPT2.random(": check_gpt2,
    'orion.Graph("attn_block")': check_attention,
    "program = orion.compile(mil)": check_tanh,
}


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_and_is_right(index: int) -> None:
    block = BLOCKS[index]
    checks = [check for marker, check in CHECKS.items() if marker in block]
    assert len(checks) == 1, f"README python block {index} needs exactly one check in tests/test_readme.py"
    namespace: dict[str, Any] = {}
    exec(compile(block, f"README.md python block {index}", "exec"), namespace)
    checks[0](namespace)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 3
