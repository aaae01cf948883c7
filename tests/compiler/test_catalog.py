"""The constraint catalog: complete, printable, and each entry's handling shown by a test."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import orion.legalize.rewrite
from orion import constraints, ops
from orion.compiler import lower_graph
from orion.errors import ConstraintError
from orion.graph import DIALECT_OPS, HIGH_LEVEL_OPS, Graph

ROOT = Path(__file__).resolve().parents[2]
CITED = [c for c in constraints.CATALOG if c.test.startswith("tests/")]
# ANE-35's cited test is being replaced by the C++ op table's (issue 8); once the citation changes, it is checked.
REPLACED = {"ANE-35": "tests/compiler/test_catalog.py::test_ane35_no_quantized_ops"}


def test_catalog_covers_every_native_constraint_id_once() -> None:
    assert [c.id for c in constraints.CATALOG] == list(constraints.TITLES)
    assert len(constraints.TITLES) >= 36


def test_every_entry_is_complete_and_points_at_a_test() -> None:
    for c in constraints.CATALOG:
        assert c.title and c.where and c.symptom in {"compile fail", "eval fail", "crash", "silent wrong data", "slow"}
        assert re.fullmatch(r"(\[(?:O|M|E|AN|CT)\]\s*)+(\(.*\))?", c.sources), c  # docs/hardware.md's tags
        assert all(h in {constraints.REJECTED, constraints.LEGALIZED, constraints.RUNTIME, constraints.REPORTED}
                   for h in c.handling.split(" + ")), c
        assert c.test.startswith("tests/") and "::" in c.test, c


def cited_function(c: constraints.Constraint) -> ast.FunctionDef:
    """The top-level test function an entry cites, parsed from its file."""
    path, _, name = c.test.partition("::")
    tree = ast.parse((ROOT / path).read_text())
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"{c.id}: {c.test} does not exist"
    return found[0]


def mentions(fn: ast.FunctionDef, cid: str) -> bool:
    """The function's name (ane08_...) or any string in it (docstring, assertion) names the id."""
    strings = [n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return cid.replace("-", "").lower() in fn.name or any(cid in text for text in strings)


def checks_something(fn: ast.FunctionDef) -> bool:
    """The body asserts, or expects an error or a warning."""
    calls = {n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    return any(isinstance(n, ast.Assert) for n in ast.walk(fn)) or bool(calls & {"raises", "warns", "fail"}) \
        or any(isinstance(n, ast.Call) and getattr(n.func, "attr", "").startswith("assert_") for n in ast.walk(fn))


def runnable(c: constraints.Constraint, monkeypatch: pytest.MonkeyPatch) -> tuple[Callable[..., Any], dict[str, Any]] | None:
    """The cited compiler test and arguments to call it with (the "ir" mode, each parameter's first
    value), or None when it is not a compiler test. The module's random generators are copied for the
    run, so the test's own run later draws the same data."""
    path, _, name = c.test.partition("::")
    if not path.startswith("tests/compiler/"):
        return None
    module = importlib.import_module(path[len("tests/"):-3].replace("/", "."))
    for attr, value in vars(module).items():
        if isinstance(value, np.random.Generator):
            monkeypatch.setattr(module, attr, copy.deepcopy(value))
    fn = getattr(module, name)
    firsts = {arg: values[0] for mark in getattr(fn, "pytestmark", []) if mark.name == "parametrize"
              for arg, values in [mark.args]}
    kwargs = {}
    for param in inspect.signature(fn).parameters:
        assert param == "mode" or param in firsts, f"{c.id}: {c.test} needs fixture '{param}'; cite a plain test"
        kwargs[param] = "ir" if param == "mode" else firsts[param]
    return fn, kwargs


@pytest.mark.parametrize("c", CITED, ids=[c.id for c in CITED])
def test_every_cited_test_exercises_its_constraint(c: constraints.Constraint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cited test names its id and checks something; a compiler test is also run, and must raise the id
    (rejected constraints) or legalize the ops whose MIL form the id bans (legalized ones)."""
    if REPLACED.get(c.id) == c.test:
        pytest.skip(f"{c.id}: its test moves to the C++ op table's (issue 8)")
    fn = cited_function(c)
    assert mentions(fn, c.id), f"{c.test} never names {c.id}: say in its docstring what it shows"
    assert checks_something(fn), f"{c.test} asserts nothing"
    legalized_ops = {name for name, op in ops.REGISTRY.ops.items() if op.rule == c.id}
    run = runnable(c, monkeypatch) if constraints.REJECTED in c.handling or legalized_ops else None
    if run is None:
        return
    raised: list[str] = []
    expanded: list[str] = []
    init, expand = ConstraintError.__init__, orion.legalize.rewrite.expand

    def recording_init(self: ConstraintError, message: str, constraint: str) -> None:
        raised.append(constraint)
        init(self, message, constraint)

    def recording_expand(L: Any, node: Any) -> Any:
        expanded.append(node.op)
        return expand(L, node)

    monkeypatch.setattr(ConstraintError, "__init__", recording_init)
    monkeypatch.setattr(orion.legalize.rewrite, "expand", recording_expand)
    fn_, kwargs = run
    fn_(**kwargs)
    if constraints.REJECTED in c.handling:
        assert c.id in raised, f"{c.test} never raised {c.id} (raised {raised})"
    if constraints.LEGALIZED in c.handling and legalized_ops:
        assert legalized_ops & set(expanded), f"{c.test} legalized none of {sorted(legalized_ops)}"


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
