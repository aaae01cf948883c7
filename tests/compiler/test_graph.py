"""Graph IR: shapes and dtypes are inferred when a node is built; mistakes fail there, naming node and fix."""

from __future__ import annotations

import numpy as np
import pytest

from orion.graph import Graph, GraphError


def test_mlp_shapes_inferred_at_build_time() -> None:
    g = Graph("mlp")
    x = g.input("x", [1, 768, 1, 32])
    h = g.linear(x, np.zeros((3072, 768)), np.zeros(3072), name="fc")
    y = g.linear(g.gelu(h), np.zeros((768, 3072)))
    g.output(y, "y")
    assert h.shape == (1, 3072, 1, 32) and h.dtype == "fp16"
    assert y.shape == (1, 768, 1, 32)
    assert [n.name for n in g.inputs] == ["x"] and list(g.outputs) == ["y"]


def test_head_reshapes_and_matmul() -> None:
    g = Graph("heads")
    q = g.input("q", [1, 64, 1, 16])
    qh = g.reshape(q, [1, 4, 16, 16])
    scores = g.matmul(qh, qh, transpose_x=True)
    assert scores.shape == (1, 4, 16, 16)
    assert g.transpose(qh, [0, 1, 3, 2]).shape == (1, 4, 16, 16)
    assert g.softmax(scores, axis=-1).shape == (1, 4, 16, 16)
    assert g.reduce_sum(q, axis=1).shape == (1, 1, 1, 16)
    assert [p.shape for p in g.split(q, [16, 48], axis=1)] == [(1, 16, 1, 16), (1, 48, 1, 16)]
    assert g.concat([q, q], axis=3).shape == (1, 64, 1, 32)
    assert g.pad(q, axis=3, before=1, after=15).shape == (1, 64, 1, 32)
    assert g.cast(q, "fp32").dtype == "fp32"
    assert g.attention(q, q, q, heads=4).shape == (1, 64, 1, 16)


@pytest.mark.parametrize("build, words", [
    (lambda g, x: g.linear(x, np.zeros((8, 5)), name="fc"), ["'fc'", "5 input channels", "Fix"]),
    (lambda g, x: g.add(x, g.input("z", [1, 7, 1, 32]), name="s"), ["'s'", "do not broadcast", "Fix"]),
    (lambda g, x: g.reshape(x, [1, 3, 1, 32], name="r"), ["'r'", "cannot reshape", "Fix"]),
    (lambda g, x: g.matmul(x, x, name="m"), ["'m'", "inner dimensions", "Fix"]),
    (lambda g, x: g.slice(x, 1, 4, 99, name="sl"), ["'sl'", "slice [4:99]", "Fix"]),
    (lambda g, x: g.add(x, g.cast(x, "fp32"), name="mix"), ["'mix'", "dtypes differ", "Fix"]),
    (lambda g, x: g.attention(x, x, x, heads=3, name="att"), ["'att'", "heads", "Fix"]),
    (lambda g, x: g.transpose(x, [0, 1, 1, 3], name="t"), ["'t'", "permutation", "Fix"]),
    (lambda g, x: g.concat([x, g.input("z", [1, 16, 1, 8])], axis=1, name="c"), ["'c'", "differ", "Fix"]),
    (lambda g, x: g.split(x, [4, 4], axis=1, name="sp"), ["'sp'", "add up", "Fix"]),
    (lambda g, x: g.layer_norm(x, np.ones(3), np.zeros(3), name="ln"), ["'ln'", "const [16]", "Fix"]),
])
def test_mistakes_fail_where_written(build, words) -> None:
    g = Graph("bad")
    x = g.input("x", [1, 16, 1, 32])
    with pytest.raises(GraphError) as err:
        build(g, x)
    for w in words:
        assert w in str(err.value)


def test_io_shapes_and_names_checked() -> None:
    g = Graph("io")
    with pytest.raises(GraphError, match=r"\[1, C, 1, S\]"):
        g.input("x", [16, 32])
    x = g.input("x", [1, 16, 1, 32])
    with pytest.raises(GraphError, match="already used"):
        g.input("x", [1, 16, 1, 32])
    with pytest.raises(GraphError, match="identifier"):
        g.input("bad name", [1, 16, 1, 32])
    with pytest.raises(GraphError, match="reshape it"):
        g.output(g.reshape(x, [1, 4, 4, 32]), "y")
    g.output(x, "y")
    with pytest.raises(GraphError, match="already used"):
        g.output(x, "y")


def test_scalars_become_named_consts() -> None:
    g = Graph("s")
    x = g.input("x", [1, 16, 1, 32])
    y = g.mul(x, 0.5, name="half")
    assert y.inputs[1].op == "const" and y.inputs[1].name == "half_y" and y.inputs[1].shape == ()


def test_auto_names_are_unique_and_deterministic() -> None:
    def build() -> list[str]:
        g = Graph("n")
        x = g.input("x", [1, 16, 1, 32])
        g.relu(g.relu(g.add(x, 1.0)))
        return [n.name for n in g.nodes]
    names = build()
    assert names == build() and len(set(names)) == len(names)


def test_scope_prefixes_node_and_const_names_but_not_io():
    g = Graph("scoped")
    x = g.input("x", [1, 8, 1, 32])
    with g.scope("h3.attn"):
        q = g.linear(x, np.ones((8, 8)), name="q")
        with g.scope("inner"):
            c = g.const("table", np.ones(8))
            auto = g.relu(q)
    g.output(q, "y")
    assert q.name == "h3_attn_q" and q.inputs[1].name == "h3_attn_q_weight"
    assert c.name == "h3_attn_inner_table" and auto.name.startswith("h3_attn_inner_relu_")
    assert x.name == "x" and list(g.outputs) == ["y"]
    assert g.relu(x, name="after").name == "after"  # the scope ended
    with pytest.raises(GraphError, match="scope name"), g.scope("bad name"):
        pass


def test_first_operand_must_be_a_node():
    g = Graph("first")
    x = g.input("x", [1, 16, 1, 32])
    with pytest.raises(GraphError, match=r"'s' \(add\): the first operand is not a graph node.*Fix"):
        g.add(2.0, x, name="s")


def test_graph_errors_are_orion_errors():
    import orion

    g = Graph("bad")
    with pytest.raises(orion.OrionError, match="not \\[1, C, 1, S\\]"):
        g.input("x", [2, 8, 1, 32])
