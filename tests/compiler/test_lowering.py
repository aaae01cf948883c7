"""Lowering to MIL text: named consts only, live outputs, I/O names, weight files, determinism."""

from __future__ import annotations

import re
import struct

import numpy as np

from orion.compiler import lower, lower_graph
from orion.graph import Graph
from orion.legalize import io_names


def mlp() -> Graph:
    rng = np.random.default_rng(0)
    g = Graph("mlp")
    x = g.input("x", [1, 64, 1, 32])
    h = g.gelu(g.linear(x, rng.standard_normal((128, 64)) * 0.1, rng.standard_normal(128) * 0.1, name="fc1"))
    g.output(g.linear(h, rng.standard_normal((64, 128)) * 0.1, name="fc2"), "y")
    g.output(h, "hidden")
    return g


def statements(mil: str) -> list[str]:
    return [ln.strip() for ln in mil.splitlines() if re.match(r"^\s*[^=\n]*=\s*[a-z_]+\(", ln)]


def test_io_names_sort_in_natural_order() -> None:
    """ANE-20: I/O names sort alphabetically in declaration order."""
    names = ["x", "mask", "a", "kv"]
    assert sorted(io_names("in", names)) == io_names("in", names)
    many = io_names("out", [f"o{i}" for i in range(150)])
    assert sorted(many) == many and many[0] == "out_000_o0"


def test_no_inline_literals() -> None:
    """ANE-05: every op argument is a named const, never an inline literal."""
    for stmt in statements(lower(mlp())[0]):
        if "= const()" in stmt:
            continue
        args = stmt.split("(", 1)[1].split(")[", 1)[0]
        for value in re.findall(r"\w+=([^,]+)", args):
            assert re.fullmatch(r"[A-Za-z_]\w*", value.strip()), stmt  # a reference, not a literal
        assert re.search(r'\[name=string\("\w+"\)\]', stmt)


def test_outputs_are_live_ops() -> None:
    """ANE-06: every returned name is a value the function computes (aliases get an identity)."""
    g = Graph("alias")
    x = g.input("x", [1, 64, 1, 32])
    r = g.relu(x)
    g.output(r, "a")
    g.output(r, "b")  # the same value twice
    g.output(x, "c")  # an input returned as is
    mil = lower(g)[0]
    returned = re.search(r"->\s*\(([^)]*)\)", mil).group(1).replace(" ", "").split(",")
    assert returned == ["out_00_a", "out_01_b", "out_02_c"]
    defined = {re.match(r"^[^=]*\s(\w+)\s*=", s).group(1) for s in statements(mil)}
    assert set(returned) <= defined


def test_weights_one_file_offset_64() -> None:
    """ANE-22, ANE-34: one BLOBFILE per weight at @model_path/weights/<name>.bin, offset 64."""
    mil, weights = lower(mlp())
    paths = re.findall(r'BLOBFILE\(path=string\("([^"]+)"\), offset=uint64\((\d+)\)\)', mil)
    assert paths and all(off == "64" for _, off in paths)
    assert sorted(p for p, _ in paths) == sorted(weights) and len(set(weights)) == len(weights)
    for path, data in weights.items():
        assert re.fullmatch(r"@model_path/weights/\w+\.bin", path)
        assert data[0] == 1 and struct.unpack_from("<I", data, 64)[0] == 0xDEADBEEF
        assert struct.unpack_from("<I", data, 80)[0] == 128
    w = np.frombuffer(weights["@model_path/weights/fc1_weight.bin"][128:], np.float16).reshape(128, 64)
    expected = (np.random.default_rng(0).standard_normal((128, 64)) * 0.1).astype(np.float16)
    np.testing.assert_array_equal(w, expected)


def test_weights_dict_empty_not_none() -> None:
    """ANE-18: a program without weights gets an empty dict, never None."""
    g = Graph("noweights")
    g.output(g.relu(g.input("x", [1, 768, 1, 32])), "y")
    mil, weights = lower(g)
    assert weights == {} and "BLOBFILE" not in mil


def test_deterministic_bytes_and_hash() -> None:
    a, b = lower_graph(mlp()), lower_graph(mlp())
    assert a.mil == b.mil and a.weights == b.weights and a.content_hash == b.content_hash
    assert lower_graph(mlp(), io_dtype="fp32").content_hash != a.content_hash


def test_fp32_io_casts_at_the_edges() -> None:
    mil = lower(mlp(), io_dtype="fp32")[0]
    header = re.search(r"main<ios18>\(([^)]*)\)", mil).group(1)
    assert header.startswith("tensor<fp32,")
    assert len(re.findall(r"= cast\(", mil)) == 3  # one input, two outputs


def test_input_graph_not_modified_by_lowering() -> None:
    g = mlp()
    before = [(n.name, n.op, n.shape) for n in g.nodes]
    lower_graph(g)
    assert [(n.name, n.op, n.shape) for n in g.nodes] == before
