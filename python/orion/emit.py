"""Emit: the program's graph -> an ``orion.mil.MilProgram`` (the MIL-program binding) and its weight files.

Every argument is a named const ``<var>_<arg>``, args in alphabetical order, one BLOBFILE per weight
tensor at ``@model_path/weights/<name>.bin``, offset 64 (docs/hardware.md §4, §5); a quantized weight
(orion.quant) is its stored data feeding a constexpr op in coremltools' form. Each op's arguments
come from its registry definition (``OpDef.emit``) and are checked against its MIL signature
(``OpDef.mil``): an op missing from the registry, or not a dialect op, is an error, never a default.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orion import blobfile, mil, ops, quant
from orion.errors import CompileError
from orion.graph import lineage
from orion.graph.builder import Graph
from orion.graph.ir import Node

BLOB_OFFSET = 64
WEIGHT_DIR = "@model_path/weights/"
Arg = tuple[str, Any]
# What is learnt about the fp16 weight file of a const's values, kept under their lineage key (orion.graph.lineage):
# its SHA-256 (Lowered.file_digests), its CRC-32 and where a copy is stored (program_cache._save: a function that
# returns that copy's bytes, checked, or None when it is gone or damaged).
FILE_SHA256, FILE_CRC32, FILE_COPY = "fp16 weight file: SHA-256", "fp16 weight file: CRC-32", "fp16 weight file: copy"


class Emitter:
    """Emits the statements of one program, naming each op's consts ``<var>_<arg>``."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.program = mil.MilProgram()
        self.weights: dict[str, bytes | memoryview] = {}
        self.digests: dict[str, str] = {}  # SHA-256 of the weight files known without hashing them
        self.sources: dict[str, lineage.Key] = {}  # the key of the values of each weight file that has one
        self.var: dict[int, str] = {id(n): n.name for n in graph.nodes}

    # -- argument consts (what OpDef.emit functions call) --------------------------------------
    def const(self, owner: str, arg: str, value: Any) -> str:
        """A named const ``<owner>_<arg>`` holding ``value``; returns its name."""
        name = f"{owner}_{arg}"
        self.program.add_const(name, value, name=name)
        return name

    def ints(self, owner: str, arg: str, values: list[int]) -> str:
        """An int32 list const."""
        v = mil.Value.list(mil.Type.tensor("int32", [len(values)]), [float(x) for x in values])
        return self.const(owner, arg, v)

    def scalar(self, owner: str, arg: str, dtype: str, value: float) -> str:
        """A scalar const of ``dtype`` (int32, bool, fp16, ...)."""
        return self.const(owner, arg, mil.Value.number(dtype, float(value)))

    def string(self, owner: str, arg: str, text: str) -> str:
        """A string const."""
        return self.const(owner, arg, mil.Value.string(text))

    # -- statements -------------------------------------------------------------------------------
    def type_of(self, node: Node) -> Any:
        return mil.Type.tensor(node.dtype, list(node.shape)) if node.shape else mil.Type.scalar(node.dtype)

    def constant(self, node: Node) -> None:
        name = self.var[id(node)]
        if not node.shape:
            self.program.add_const(name, mil.Value.number(node.dtype, float(node.value)), name=name)
            return
        if "quantized" in node.attrs:
            return self.quantized_constant(node, name)
        key = lineage.key_of(node.value)
        if key is not None:
            self.sources[f"{WEIGHT_DIR}{name}.bin"] = key
        found = self.reused(name, key, node.shape)
        if found is not None:
            self.program.add_const(name, found, name=name)
            return
        # C order: a transposed weight (GPT-2's Conv1D view) is converted and laid out in one pass; an fp16
        # C-contiguous one (a view of an F16 checkpoint's map) is not copied here
        self.program.add_const(name, self.blob(name, np.ascontiguousarray(node.value, dtype=np.float16)), name=name)

    def reused(self, name: str, key: lineage.Key | None, shape: tuple[int, ...]) -> Any:
        """The BLOBFILE value of weight ``name`` when the weight file of the same values (``key``) is stored
        (the program cache's blob: ``FILE_COPY``): that copy and its known SHA-256, instead of serializing
        and hashing the values again; else None."""
        digest, stored = lineage.recall(key, FILE_SHA256), lineage.recall(key, FILE_COPY)
        found = stored() if digest is not None and stored is not None else None
        if found is None:
            return None
        path = f"{WEIGHT_DIR}{name}.bin"
        self.weights[path], self.digests[path] = found, digest
        return mil.Value.blob(mil.Type.tensor("fp16", list(shape)), path, BLOB_OFFSET)

    def blob(self, name: str, array: np.ndarray | blobfile.SubByte) -> Any:
        """A BLOBFILE value ``@model_path/weights/<name>.bin`` holding ``array`` (fp16, int8, or a sub-byte
        dtype's values)."""
        path = f"{WEIGHT_DIR}{name}.bin"
        self.weights[path] = blobfile.write(array)
        if isinstance(array, blobfile.SubByte):
            return mil.Value.blob(mil.Type.tensor(array.dtype, list(array.shape)), path, BLOB_OFFSET)
        dtype = {np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8"}.get(array.dtype, "fp16")
        return mil.Value.blob(mil.Type.tensor(dtype, list(array.shape)), path, BLOB_OFFSET)

    def quantized_constant(self, node: Node, name: str) -> None:
        """A quantized weight (``node.attrs["quantized"]``, orion.quant) in the form coremltools serializes it:

        - int8: ``constexpr_affine_dequantize`` (iOS 16) with its parameters as attributes (int8 data, fp16
          per-output-channel scales, axis 0, zero point 0), the form [M]'s int8 benchmark ran (ANE-35);
        - LUT: ``constexpr_lut_to_dense(indices=tensor<uint4|uint6, ...>(BLOBFILE), lut=tensor<fp16,
          [Cout/group, 1, ..., 2^bits, 1]>(BLOBFILE))``: iOS 18 ops take their parameters as inline values;
        - int4: ``constexpr_blockwise_shift_scale(data=uint4, offset=fp16, scale=fp16)``, offset and scale
          ``[Cout, Cin/block, 1, ...]`` (ANE-38)."""
        weight = node.attrs["quantized"]
        shape, rank = list(node.shape), len(node.shape)
        if isinstance(weight, quant.Int8Weight):
            attributes = [("axis", mil.Value.number("int32", 0.0)),
                          ("quantized_data", self.blob(f"{name}_quantized_data", weight.q.reshape(shape))),
                          ("scale", self.blob(f"{name}_scale", weight.scale.astype(np.float16))),
                          ("zero_point", mil.Value.number("int8", 0.0))]
            self.program.add_op(quant.INT8_OP, name, self.type_of(node), [], name=name, attributes=attributes)
            return
        if isinstance(weight, quant.LutWeight):
            table = weight.lut.astype(np.float16).reshape([weight.lut.shape[0]] + [1] * (rank - 1) + [-1, 1])
            args = [("indices", self.blob(f"{name}_indices",
                                          blobfile.SubByte(weight.indices.reshape(shape), f"uint{weight.bits}"))),
                    ("lut", self.blob(f"{name}_lut", table))]
            self.program.add_op(quant.LUT_OP, name, self.type_of(node), args, name=name)
            return
        blocks = list(weight.scale.shape) + [1] * (rank - 2)
        args = [("data", self.blob(f"{name}_data", blobfile.SubByte(weight.q.reshape(shape), "uint4"))),
                ("offset", self.blob(f"{name}_offset", weight.zero.astype(np.float16).reshape(blocks))),
                ("scale", self.blob(f"{name}_scale", weight.scale.astype(np.float16).reshape(blocks)))]
        self.program.add_op(quant.BLOCKWISE_OP, name, self.type_of(node), args, name=name)

    def args(self, node: Node, out: str) -> list[Arg]:
        """The MIL arguments of ``node`` by its registry definition, checked against its MIL signature."""
        definition = ops.get(node.op, node.name)
        if not definition.is_dialect:
            raise CompileError(f"node '{node.name}' ({node.op}): a high-level op reached MIL emission. "
                               "Fix: legalize the graph first (orion.legalize.legalize)")
        args = definition.emit(self, node, out, [self.var[id(i)] for i in node.inputs])
        names, sig = [name for name, _ in args], definition.mil
        missing = sorted(set(sig.required) - set(names))
        unknown = sorted(set(names) - set(sig.required) - set(sig.optional))
        if missing or unknown or names != sorted(names):
            raise CompileError(f"node '{node.name}' ({node.op}): emitted arguments {names} (missing {missing}, "
                               f"unknown {unknown}) do not match the MIL signature. Fix: OpDef.emit of '{node.op}' "
                               "must give every required argument, in alphabetical order")
        return args

    def operation(self, node: Node) -> None:
        out = self.var[id(node)]
        self.program.add_op(node.op, out, self.type_of(node), self.args(node, out), name=out)

    def build(self) -> tuple[Any, dict[str, bytes]]:
        outputs = self.graph.outputs
        claimed: set[int] = set()
        aliases: list[tuple[str, Node]] = []  # outputs that need an identity to get their own variable
        for mil_name, node in outputs.items():
            if node.op in ops.SOURCES or id(node) in claimed:
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
    """The ``orion.mil.MilProgram`` of a legalized, I/O-prepared graph and its weight files by path."""
    return Emitter(graph).build()
