"""IR -> ``orion.mil.Program``: every argument a named const, args in alphabetical order, one BLOBFILE
per weight tensor at ``@model_path/weights/<name>.bin``, offset 64 (FACTS sections 4 and 5)."""

from __future__ import annotations

from typing import Any

import numpy as np

from orion.graph.builder import Graph
from orion.graph.ir import Node

BLOB_OFFSET = 64
WEIGHT_DIR = "@model_path/weights/"
Arg = tuple[str, Any]


class _Builder:
    """Emits the statements of one program, naming each op's consts ``<var>_<arg>``."""

    def __init__(self, graph: Graph) -> None:
        from orion import blobfile, mil

        self.mil, self.blobfile, self.graph = mil, blobfile, graph
        self.program = mil.Program()
        self.weights: dict[str, bytes] = {}
        self.var: dict[int, str] = {id(n): n.name for n in graph.nodes}

    def type_of(self, node: Node) -> Any:
        return self.mil.Type.tensor(node.dtype, list(node.shape)) if node.shape else self.mil.Type.scalar(node.dtype)

    def const(self, owner: str, arg: str, value: Any) -> str:
        name = f"{owner}_{arg}"
        self.program.add_const(name, value, name=name)
        return name

    def ints(self, owner: str, arg: str, values: list[int]) -> str:
        v = self.mil.Value.list(self.mil.Type.tensor("int32", [len(values)]), [float(x) for x in values])
        return self.const(owner, arg, v)

    def scalar(self, owner: str, arg: str, dtype: str, value: float) -> str:
        return self.const(owner, arg, self.mil.Value.number(dtype, float(value)))

    def constant(self, node: Node) -> None:
        name = self.var[id(node)]
        if not node.shape:
            self.program.add_const(name, self.mil.Value.number(node.dtype, float(node.value)), name=name)
            return
        path = f"{WEIGHT_DIR}{name}.bin"
        self.weights[path] = self.blobfile.write(node.value.astype(np.float16))
        self.program.add_const(name, self.mil.Value.blob(self.type_of(node), path, BLOB_OFFSET), name=name)

    def args(self, node: Node, out: str) -> list[Arg]:
        refs = [self.var[id(i)] for i in node.inputs]
        op, a = node.op, node.attrs
        if op == "conv":
            return [("dilations", self.ints(out, "dilations", [1, 1])),
                    ("groups", self.scalar(out, "groups", "int32", 1)),
                    ("pad", self.ints(out, "pad", [0, 0, 0, 0])),
                    ("pad_type", self.const(out, "pad_type", self.mil.Value.string("valid"))),
                    ("strides", self.ints(out, "strides", [1, 1])), ("weight", refs[1]), ("x", refs[0])]
        if op == "matmul":
            return [("transpose_x", self.scalar(out, "transpose_x", "bool", a["transpose_x"])),
                    ("transpose_y", self.scalar(out, "transpose_y", "bool", a["transpose_y"])),
                    ("x", refs[0]), ("y", refs[1])]
        if op in ("add", "sub", "mul", "pow"):
            return [("x", refs[0]), ("y", refs[1])]
        if op == "softmax":
            return [("axis", self.scalar(out, "axis", "int32", a["axis"])), ("x", refs[0])]
        if op in ("reduce_sum", "reduce_max"):
            return [("axes", self.ints(out, "axes", [a["axis"]])),
                    ("keep_dims", self.scalar(out, "keep_dims", "bool", True)), ("x", refs[0])]
        if op == "reshape":
            return [("shape", self.ints(out, "shape", a["shape"])), ("x", refs[0])]
        if op == "transpose":
            return [("perm", self.ints(out, "perm", a["perm"])), ("x", refs[0])]
        if op == "cast":
            return [("dtype", self.const(out, "dtype", self.mil.Value.string(a["dtype"]))), ("x", refs[0])]
        if op == "slice_by_size":
            return [("begin", self.ints(out, "begin", a["begin"])), ("size", self.ints(out, "size", a["size"])),
                    ("x", refs[0])]
        return [("x", refs[0])]  # tanh, sigmoid, exp, relu, identity

    def operation(self, node: Node) -> None:
        out = self.var[id(node)]
        self.program.add_op(node.op, out, self.type_of(node), self.args(node, out), name=out)

    def build(self) -> tuple[Any, dict[str, bytes]]:
        outputs = self.graph.outputs
        claimed: set[int] = set()
        aliases: list[tuple[str, Node]] = []  # outputs that need an identity to get their own variable
        for mil_name, node in outputs.items():
            if node.op in ("input", "const") or id(node) in claimed:
                aliases.append((mil_name, node))
            else:
                claimed.add(id(node))
                self.var[id(node)] = mil_name
        for node in sorted(self.graph.inputs, key=lambda n: n.name):
            self.program.add_input(node.name, self.type_of(node))
        for node in self.graph.nodes:
            if node.op == "const":
                self.constant(node)
            elif node.op != "input":
                self.operation(node)
        for mil_name, node in aliases:
            self.program.add_op("identity", mil_name, self.type_of(node), [("x", self.var[id(node)])], name=mil_name)
        self.program.outputs = sorted(outputs)
        return self.program, self.weights


def to_program(graph: Graph) -> tuple[Any, dict[str, bytes]]:
    """The ``orion.mil.Program`` of a legalized, I/O-prepared graph and its weight files by path."""
    return _Builder(graph).build()
