"""SRAM-budget warnings: one summary per compile batch for model users, per-graph detail for
compiler users, both attributed to the caller's line."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import orion
from orion import compiler
from orion.models import GPT2, GPT2Config
from orion.passes.sram import SRAMBudgetWarning
from support.gpt2_fixtures import lively_weights

CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)


@pytest.fixture
def tiny_sram(monkeypatch):
    """Every program over budget: a 64 KB SRAM."""
    monkeypatch.setenv("ORION_CACHE_DIR", "off")
    monkeypatch.setattr(compiler, "lower_graph", functools.partial(compiler.lower_graph, sram_budget=64 << 10))


def test_model_users_get_one_summary_warning_per_batch(tiny_sram, capsys) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = GPT2(CONFIG, lively_weights(CONFIG), fusion_depth=1)
        model.prefill([1, 2, 3])
        model.decode_step(4)
    sram = [w for w in caught if issubclass(w.category, SRAMBudgetWarning)]
    # The LM head with the model, the prompt's bucket, then the decode layers (at depth 1, on the first step).
    assert len(sram) == 3, [str(w.message) for w in sram]
    assert str(sram[0].message).startswith("1 of 1 programs for GPT-2")
    assert "ANE-26" in str(sram[0].message) and "fusion_depth" in str(sram[0].message)
    assert str(sram[1].message).startswith("2 of 2 programs for GPT-2 prompts up to 32 tokens")
    assert str(sram[2].message).startswith("2 of 2 programs for decode with a KV cache of")
    assert all(w.filename == __file__ for w in sram)
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet = GPT2(CONFIG, lively_weights(CONFIG), fusion_depth=1, progress=False)
        quiet.prefill([1, 2, 3])
        quiet.decode_step(4)
    assert caught == [], [(w.category, str(w.message)[:300], w.filename) for w in caught]
    assert capsys.readouterr().err == ""  # progress=False: silent


def test_compiler_users_get_the_per_graph_detail_at_their_line() -> None:
    g = orion.Graph("big")
    g.output(g.linear(g.input("x", [1, 64, 1, 32]), np.ones((64, 64), np.float32)), "y")
    with pytest.warns(SRAMBudgetWarning, match=r"graph 'big': weights .* OVER BUDGET") as record:
        orion.compile_graph(g, sram_budget=4096)
    assert record[0].filename == __file__
