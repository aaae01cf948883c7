"""The constraint catalog: complete, printable, and each entry's handling shown by a test."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from orion import constraints
from orion.compiler import lower_graph
from orion.errors import ConstraintError
from orion.graph import DIALECT_OPS, HIGH_LEVEL_OPS, Graph

ROOT = Path(__file__).resolve().parents[2]


def test_catalog_covers_every_native_constraint_id_once() -> None:
    assert [c.id for c in constraints.CATALOG] == list(constraints.TITLES)
    assert len(constraints.TITLES) >= 36


def test_every_entry_is_complete_and_points_at_a_test() -> None:
    for c in constraints.CATALOG:
        assert c.title and c.where and c.symptom in {"compile fail", "eval fail", "crash", "silent wrong data", "slow"}
        assert re.fullmatch(r"(\[[OME]\]\s*)+(\(.*\))?", c.sources), c
        assert all(h in {constraints.REJECTED, constraints.LEGALIZED, constraints.RUNTIME, constraints.REPORTED}
                   for h in c.handling.split(" + ")), c
        if c.test.startswith("tests/"):
            path, _, name = c.test.partition("::")
            text = (ROOT / path).read_text()
            assert f"def {name}(" in text, c
        else:
            assert c.test.startswith("runtime tests"), c


def test_format_table_lists_every_entry(capsys: pytest.CaptureFixture[str]) -> None:
    table = constraints.format_table()
    assert all(c.id in table and c.title in table for c in constraints.CATALOG)
    assert constraints.main() == 0
    assert capsys.readouterr().out.strip() == table


def test_violation_names_entry_node_and_fix() -> None:
    err = constraints.violation("ANE-08", "probs", "softmax over an extent of 257", "pad it")
    assert isinstance(err, ConstraintError) and err.constraint == "ANE-08"
    assert str(err).startswith("ANE-08 (") and "'probs'" in str(err) and "Fix: pad it" in str(err)


def test_ane08_softmax_extent() -> None:
    g = Graph("sm")
    x = g.input("x", [1, 64, 1, 257])
    with pytest.raises(ConstraintError) as err:
        g.softmax(x, axis=-1, name="probs")
    assert err.value.constraint == "ANE-08" and "'probs'" in str(err.value) and "512" in str(err.value)
    with pytest.raises(ConstraintError, match="ANE-08"):
        g.attention(x, x, x, heads=4, name="att")
    g.softmax(g.input("ok", [1, 64, 1, 256]), axis=-1)


def test_ane09_fusion_depth() -> None:
    g = Graph("layers")
    x = g.input("x", [1, 64, 1, 32])
    for i in range(2):
        x = g.attention(x, x, x, heads=2, name=f"attn{i}")
    g.output(x, "y")
    with pytest.raises(ConstraintError) as err:
        lower_graph(g)
    assert err.value.constraint == "ANE-09" and "'attn1'" in str(err.value) and "Fix" in str(err.value)


def test_ane10_conv_channels() -> None:
    g = Graph("wide")
    x = g.input("x", [1, 32_000, 1, 32])
    with pytest.raises(ConstraintError) as err:
        g.linear(x, np.zeros((8, 32_000)), name="head")
    assert err.value.constraint == "ANE-10" and "'head'" in str(err.value) and "chunks" in str(err.value)
    g.linear(g.input("ok", [1, 31_999, 1, 32]), np.zeros((8, 31_999)))


def test_ane25_const_overflow() -> None:
    g = Graph("big")
    with pytest.raises(ConstraintError) as err:
        g.const("w", np.array([1.0, 70000.0]))
    assert err.value.constraint == "ANE-25" and "'w'" in str(err.value)
    with pytest.raises(ConstraintError, match="ANE-25"):
        g.mul(g.input("x", [1, 64, 1, 32]), float("inf"))


def test_ane32_linear_weight_must_be_const() -> None:
    g = Graph("dyn")
    x = g.input("x", [1, 64, 1, 32])
    w = g.reshape(g.input("w", [1, 64, 1, 64]), [64, 64])
    with pytest.raises(ConstraintError) as err:
        g.linear(x, w, name="proj")
    assert err.value.constraint == "ANE-32" and "'proj'" in str(err.value) and "matmul" in str(err.value)


def test_ane32_conv_gets_all_seven_args() -> None:
    g = Graph("conv")
    g.output(g.linear(g.input("x", [1, 64, 1, 32]), np.zeros((64, 64)), name="fc"), "y")
    line = next(ln for ln in lower_graph(g).mil.splitlines() if "= conv(" in ln)
    args = re.findall(r"(\w+)=", line.split("conv(")[1].split(")[")[0])
    assert args == ["dilations", "groups", "pad", "pad_type", "strides", "weight", "x"]


def test_ane35_no_quantized_ops() -> None:
    assert not {"quantize", "dequantize", "constexpr_affine_dequantize"} & (DIALECT_OPS | HIGH_LEVEL_OPS)
