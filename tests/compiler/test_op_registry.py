"""The op registry (orion.ops), op by op: it agrees with the C++ op table, and every op has a builder
method, a MIL emission (dialect ops) or legalization (high-level ops) that runs on the emulator and
matches the op's numpy reference, and a hardware status that is enforced (banned ops raise their id).

Adding an op means adding its sample to SAMPLES below (the coverage test fails until you do)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import numpy as np
import pytest

import orion
from orion import _core, ops
from orion.compiler import Lowered, compile_lowered, lower_graph
from orion.emit import to_program
from orion.errors import CompileError, ConstraintError
from orion.graph import Graph, Node
from orion.legalize import legalize, prepare_io
from orion.passes import PassContext, io_packing, io_padding
from support.compiler.dialect_eval import evaluate

C, S = 16, 32
RNG = np.random.default_rng(8)
INPUTS = {"x": RNG.standard_normal((1, C, 1, S)), "z": RNG.uniform(0.5, 1.5, (1, C, 1, S))}  # z > 0 for pow/div
W = RNG.standard_normal((8, C)) * 0.3
GAMMA, BETA = RNG.uniform(0.5, 1.5, C), RNG.standard_normal(C) * 0.1

# One tiny use of every registered op, on inputs x (any sign) and z (positive), both [1, 16, 1, 32].
SAMPLES: dict[str, Callable[[Graph, Node, Node], Node]] = {
    "add": lambda g, x, z: g.add(x, z),
    "sub": lambda g, x, z: g.sub(x, z),
    "mul": lambda g, x, z: g.mul(x, z),
    "pow": lambda g, x, z: g.pow(z, 1.5),
    "tanh": lambda g, x, z: g.tanh(x),
    "sigmoid": lambda g, x, z: g.sigmoid(x),
    "exp": lambda g, x, z: g.exp(x),
    "relu": lambda g, x, z: g.relu(x),
    "identity": lambda g, x, z: g.identity(x),
    "conv": lambda g, x, z: g.add_node("conv", [x, g.const("w", W.reshape(8, C, 1, 1))], name="conv"),
    "matmul": lambda g, x, z: g.reshape(g.matmul(g.reshape(x, [1, 1, C, S]), g.reshape(z, [1, 1, C, S]),
                                                 transpose_x=True), [1, S, 1, S]),
    "softmax": lambda g, x, z: g.softmax(x, axis=3),
    "reduce_sum": lambda g, x, z: g.reduce_sum(x, axis=1),
    "reduce_max": lambda g, x, z: g.reduce_max(x, axis=1),
    "reshape": lambda g, x, z: g.reshape(x, [1, 2 * C, 1, S // 2]),
    "transpose": lambda g, x, z: g.transpose(x, [0, 3, 2, 1]),
    "cast": lambda g, x, z: g.cast(x, "fp32"),
    "slice_by_size": lambda g, x, z: g.add_node("slice_by_size", [x], {"begin": [0, 2, 0, 4], "size": [1, 8, 1, 16]},
                                                name="block"),
    "neg": lambda g, x, z: g.neg(x),
    "div": lambda g, x, z: g.div(x, z),
    "gelu": lambda g, x, z: g.gelu(x),
    "silu": lambda g, x, z: g.silu(x),
    "rsqrt": lambda g, x, z: g.rsqrt(z),
    "sqrt": lambda g, x, z: g.sqrt(z),
    "reduce_mean": lambda g, x, z: g.reduce_mean(x, axis=1),
    "layer_norm": lambda g, x, z: g.layer_norm(x, GAMMA, BETA),
    "rms_norm": lambda g, x, z: g.rms_norm(x, GAMMA),
    "attention": lambda g, x, z: g.attention(x, z, x, heads=4),
    "linear": lambda g, x, z: g.linear(x, W, BETA[:8]),
    "slice": lambda g, x, z: g.slice(x, 3, 4, 20),
    "pad": lambda g, x, z: g.pad(x, 1, 2, 3),
    "concat": lambda g, x, z: g.concat([x, z], axis=3),
}
# Dialect ops no builder method makes directly: the legalization of this high-level op emits them.
LEGALIZATION_TARGETS = {"conv": "linear", "slice_by_size": "slice"}
ALL_OPS = sorted(ops.REGISTRY.ops)
NOT_ALLOWED = sorted(name for name, m in ops.REGISTRY.mil_ops().items() if m.status != ops.ALLOWED)


def sample(op: str) -> tuple[Graph, Node]:
    """The sample graph of ``op`` (output ``y``) and its node under test."""
    g = Graph(f"sample_{op}")
    node = SAMPLES[op](g, g.input("x", [1, C, 1, S]), g.input("z", [1, C, 1, S]))
    g.output(node, "y")
    return g, next(n for n in g.nodes if n.op == op)


def reference(g: Graph) -> np.ndarray:
    """The sample's output by the registry references, on the fp16-rounded inputs the emulator sees."""
    rounded = {k: v.astype(np.float16).astype(np.float64) for k, v in INPUTS.items()}
    return evaluate(g, dialect_only=False, **rounded)["y"]


def lower_unoptimized(g: Graph) -> Lowered:
    """The compiler's stages without the optimizations, so an op the optimizer removes (identity, a cast)
    still reaches the emitter and the emulator."""
    legal = legalize(g)
    ctx = PassContext(prepare_io(legal, "fp16"))
    io_packing.run(legal, ctx)
    io_padding.run(legal, ctx)
    program, weights = to_program(legal)
    return Lowered(orion.mil.emit(program), weights, ctx.layout, None)


def test_every_op_has_a_sample_reference_and_gradient_rule() -> None:
    assert sorted(SAMPLES) == ALL_OPS
    for name, op in ops.REGISTRY.ops.items():
        assert callable(op.reference) and callable(op.infer) and callable(op.grad), name
        assert op.is_dialect == (op.emit is not None and op.legalize is None), name


@pytest.mark.parametrize("op", ALL_OPS)
def test_builder_method_wraps_the_registry(op: str) -> None:
    definition = ops.get(op)
    method_name = LEGALIZATION_TARGETS.get(op, op)
    method = getattr(Graph, method_name)
    assert method.__doc__, op
    params = inspect.signature(method).parameters
    for attr in definition.attrs:
        if attr.name in params and attr.default is not ops.REQUIRED and method_name == op:
            assert params[attr.name].default == attr.default, (op, attr.name)  # IDE help shows the real default
    g, node = sample(method_name) if op in LEGALIZATION_TARGETS else sample(op)
    built = legalize(g) if op in LEGALIZATION_TARGETS else g
    assert any(n.op == op for n in built.nodes), (op, [n.op for n in built.nodes])
    assert node.op == method_name


@pytest.mark.parametrize("op", ALL_OPS)
def test_op_matches_its_reference_on_the_legalized_ir(op: str) -> None:
    """The legalized graph, evaluated by the dialect ops' references, matches the op's own reference."""
    g, _ = sample(op)
    legal = legalize(g)
    assert {n.op for n in legal.nodes} <= ops.DIALECT_OPS
    np.testing.assert_allclose(evaluate(legal, **INPUTS)["y"], evaluate(g, dialect_only=False, **INPUTS)["y"],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ALL_OPS)
def test_op_compiles_and_runs_on_the_emulator(op: str) -> None:
    g, _ = sample(op)
    lowered = lower_unoptimized(g) if ops.get(op).is_dialect else lower_graph(g)
    if ops.get(op).is_dialect:
        assert f"= {op}(" in lowered.mil  # the emitter wrote the op itself
    y = compile_lowered(lowered)(**{k: v.astype(np.float32) for k, v in INPUTS.items()})["y"]
    np.testing.assert_allclose(y.astype(np.float64), reference(g), atol=3e-2, rtol=3e-2)


def test_unregistered_op_is_an_error_at_lowering_not_a_default() -> None:
    g = Graph("unknown")
    x = g.input("x", [1, C, 1, S])
    g.nodes.append(Node("frobnicate", "frob", [x], {}, x.shape, x.dtype, origin="frob"))
    g.output(g.nodes[-1], "y")
    with pytest.raises(CompileError, match=r"'frob'.*'frobnicate' is not in the op registry.*Fix"):
        lower_graph(g)
    with pytest.raises(CompileError, match="not in the op registry"):
        g.add_node("frobnicate", [x], name="again")


def test_high_level_op_reaching_emission_is_an_error() -> None:
    g = Graph("raw")
    g.output(g.gelu(g.input("x", [1, C, 1, S]), name="act"), "y")
    with pytest.raises(CompileError, match=r"'act' \(gelu\): a high-level op reached MIL emission"):
        to_program(g)


def test_emitted_arguments_are_checked_against_the_mil_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = dataclasses.replace(ops.get("relu"), emit=lambda e, n, out, refs: [("input", refs[0])])
    monkeypatch.setitem(ops.REGISTRY.ops, "relu", wrong)
    g = Graph("bad_emit")
    g.output(g.relu(g.input("x", [1, C, 1, S]), name="r"), "y")
    with pytest.raises(CompileError, match=r"'r' \(relu\).*missing \['x'\].*unknown \['input'\]"):
        lower_graph(g)


def banned_program(name: str) -> str:
    """MIL text calling MIL op ``name`` with every required argument (each a reference to an input)."""
    p = orion.mil.MilProgram()
    t = orion.mil.Type.tensor("fp16", [1, 64, 1, 64])
    p.add_input("x", t)
    p.add_op(name, "y", t, [(arg, "x") for arg in sorted(ops.REGISTRY.mil_ops()[name].required)], name="y")
    p.outputs = ["y"]
    return orion.mil.emit(p)


@pytest.mark.parametrize("name", NOT_ALLOWED)
def test_not_allowed_mil_op_raises_its_constraint_id(name: str) -> None:
    cid = ops.REGISTRY.mil_ops()[name].constraint
    with pytest.raises(ConstraintError) as err:
        orion.compile(banned_program(name), profile="hardware")
    assert err.value.constraint == cid and name in str(err.value)


def test_every_cpp_op_has_a_front_end_type_rule() -> None:
    assert [row["name"] for row in _core.op_table() if not row["type_rule"]] == []


def test_python_registry_agrees_with_the_cpp_op_table() -> None:
    cpp = {row["name"]: row for row in _core.op_table()}
    python = {name: m.row() for name, m in ops.REGISTRY.mil_ops().items()}
    assert sorted(cpp) == sorted(python)
    for name, row in python.items():
        other = cpp[name]
        assert (sorted(other["required"]), sorted(other["optional"]), other["status"], other["constraint"]) == \
               (row["required"], row["optional"], row["status"], row["constraint"]), name
