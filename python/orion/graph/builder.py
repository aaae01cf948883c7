"""The public graph builder: ``g = Graph("mlp"); x = g.input("x", [1, 768, 1, 32]); ...; g.output(y, "y")``.

Tensors are ``[1, C, 1, S]`` channel-major (docs/hardware.md §1). Each op method is a thin typed wrapper
over the op registry (``orion.ops``, via :meth:`Graph.apply`). Every method infers the result's shape
and dtype immediately, so a mistake raises where it is written. Scalars and numpy arrays given as
operands become named ``const`` nodes.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from orion import ops, origins
from orion.constraints import violation
from orion.graph import lineage
from orion.graph.infer import check_size, infer
from orion.graph.ir import GraphError, Node
from orion.limits import FP16_MAX

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
Operand = Node | float | int | np.ndarray


def _all_finite(value: np.ndarray) -> bool:
    """Whether every value is finite; fp16 by its bits (exponent not all ones), a few times faster than
    ``np.isfinite``, slice by slice (no temporary as large as a weight)."""
    if value.dtype != np.float16:
        return bool(np.isfinite(value).all())
    bits, step = np.ascontiguousarray(value).reshape(-1).view(np.uint16), 1 << 20
    return all(int((bits[i:i + step] & 0x7FFF).max()) < 0x7C00 for i in range(0, bits.size, step))


def _held(value: Any) -> np.ndarray:
    """A const's values as the graph holds them: a float32 or float16 array (a weight, maybe a view of a
    checkpoint's map) as it is, since widening would copy it (4x the bytes of an fp16 weight); others as float64."""
    if isinstance(value, np.ndarray) and value.ndim and value.dtype in (np.float32, np.float16):
        return value
    return np.asarray(value, dtype=np.float64)

class Graph:
    """A dataflow graph of named nodes in topological order, with named inputs and outputs."""

    def __init__(self, name: str) -> None:
        self.name = _check_ident(name, "graph name")
        self.nodes: list[Node] = []
        self.inputs: list[Node] = []
        self.outputs: dict[str, Node] = {}
        self._taken: set[str] = set()
        self._members: set[int] = set()  # id() of every node built here (nodes of another graph are refused)
        self._counter = 0
        self._scopes: list[str] = []

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix the names of the nodes built inside: ``with g.scope("h3.attn"): g.linear(x, w, name="q")``
        makes ``h3_attn_q``. Scopes nest; a dot separates levels. Graph inputs and outputs keep their names
        (they are the program's interface)."""
        parts = name.split(".")
        for part in parts:
            _check_ident(part, "scope name")
        self._scopes.extend(parts)
        try:
            yield
        finally:
            del self._scopes[-len(parts):]

    def scoped(self, name: str) -> str:
        """``name`` under the current scope (unchanged outside any scope)."""
        return "_".join([*self._scopes, name])

    # -- infrastructure -------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """``base`` if unused in this graph, else ``base_1``, ``base_2``, ..."""
        name, i = base, 0
        while name in self._taken:
            i += 1
            name = f"{base}_{i}"
        return name

    def add_node(self, op: str, inputs: Sequence[Node], attrs: dict[str, Any] | None = None, *, name: str,
                 value: np.ndarray | None = None, origin: str = "", shape: tuple[int, ...] | None = None,
                 dtype: str = "fp16") -> Node:
        """Append a node, inferring its type (``shape``/``dtype`` are only given for input and const)."""
        attrs = dict(attrs or {})
        name = self.unique_name(name)
        if shape is None:
            shape, dtype = infer(op, origin or name, list(inputs), attrs)
        node = Node(op, name, list(inputs), attrs, tuple(int(d) for d in shape), dtype, value, origin or name)
        self._taken.add(name)
        self.nodes.append(node)
        self._members.add(id(node))
        if op == "input":
            self.inputs.append(node)
        return node

    def rename(self, node: Node, new: str) -> None:
        """Rename ``node`` to ``new``, first moving any other node called ``new`` out of the way."""
        if node.name == new:
            return
        for other in self.nodes:
            if other.name == new:
                self.rename(other, self.unique_name(f"{new}_r"))
        self._taken.discard(node.name)
        node.name = new
        self._taken.add(new)

    def reserve(self, name: str) -> None:
        """Keep ``name`` free for a later use (renaming a node that has it)."""
        for other in self.nodes:
            if other.name == name:
                self.rename(other, self.unique_name(f"{name}_v"))
        self._taken.add(name)

    def replace_uses(self, old: Node, new: Node, *, skip: Node | None = None) -> None:
        """Make every consumer of ``old`` (except ``skip``) and every output use ``new`` instead."""
        for n in self.nodes:
            if n is not skip:
                n.inputs = [new if i is old else i for i in n.inputs]
        for key, out in self.outputs.items():
            if out is old:
                self.outputs[key] = new

    def move_after(self, node: Node, anchor: Node) -> None:
        """Move ``node`` right after ``anchor`` in the node order."""
        self.nodes.remove(node)
        self.nodes.insert(self.nodes.index(anchor) + 1, node)

    def remove(self, node: Node) -> None:
        """Drop an unused node."""
        self.nodes.remove(node)
        self._taken.discard(node.name)
        if node in self.inputs:
            self.inputs.remove(node)

    def _name(self, name: str | None, op: str) -> str:
        if name is not None:
            return self.unique_name(self.scoped(_check_ident(name, "node name")))
        self._counter += 1
        return self.unique_name(self.scoped(f"{op}_{self._counter}"))

    def _operand(self, v: Operand, name: str, like: Node) -> Node:
        if isinstance(v, Node):
            return self._own(v, f"operand '{name}'")
        if not isinstance(v, (int, float, np.ndarray, np.number, list, tuple)) or isinstance(v, bool):
            raise GraphError(f"'{name}': an operand is a {type(v).__name__}. Fix: pass a graph node, a number or "
                             "a numpy array")
        try:
            value = _held(v)
        except (TypeError, ValueError) as exc:
            raise GraphError(f"'{name}': the operand is not numeric ({exc}). Fix: pass a graph node, a number or "
                             "a numpy array of numbers") from None
        return self._const(name, value, dtype=like.dtype, origin=origins.origin_of(v))

    def _own(self, node: Node, where: str) -> Node:
        """``node``, once it is known to be one of this graph's."""
        if id(node) not in self._members and not any(n is node for n in self.nodes):  # (appended by hand)
            raise GraphError(f"{where}: node '{node.name}' belongs to another graph, not '{self.name}'. Fix: build "
                             "every node of a graph with that graph's methods")
        return node

    def apply(self, op: str, operands: Sequence[Operand], attrs: dict[str, Any] | None = None, *,
              name: str | None = None) -> Node:
        """Build registry op ``op`` (see ``orion.ops``): operands that are not nodes become consts named
        ``<node>_<operand>``, attributes get the registry's defaults and conversions."""
        definition = ops.get(op)
        node_name = self._name(name, op)
        if not operands or not isinstance(operands[0], Node):
            raise GraphError(f"node '{node_name}' ({op}): the first operand is not a graph node. "
                             "Fix: pass a node (g.input(...), g.const(...) or an op's result) first")
        self._own(operands[0], f"node '{node_name}' ({op})")
        specs = definition.operands
        inputs = [self._operand(v, f"{node_name}_{specs[min(i, len(specs) - 1)].name}", operands[0])
                  for i, v in enumerate(operands)]
        return self.add_node(op, inputs, definition.make_attrs(node_name, dict(attrs or {})), name=node_name)

    # -- sources and sinks ----------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[int], dtype: str = "fp16") -> Node:
        """A graph input of shape ``[1, C, 1, S]`` (its surface dtype is chosen at compile time)."""
        shape = tuple(int(d) for d in shape)
        if len(shape) != 4 or shape[0] != 1 or shape[2] != 1 or min(shape) <= 0:
            raise GraphError(f"input '{name}': shape {list(shape)} is not [1, C, 1, S]. Fix: give [1, C, 1, S]")
        check_size(name, "input", shape)
        if _check_ident(name, "input name") in self._taken:
            raise GraphError(f"input '{name}': the name is already used. Fix: pick another name")
        return self.add_node("input", [], name=name, shape=shape, dtype=dtype)

    def const(self, name: str, array: np.ndarray | float, dtype: str = "fp16") -> Node:
        """A named constant (weights, masks, scalars); values must fit fp16 (ANE-25)."""
        return self._const(self.scoped(_check_ident(name, "const name")), array, dtype, origins.origin_of(array))

    def const_quantized(self, name: str, weight: Any) -> Node:
        """A named quantized weight (an :class:`orion.quant.Int8Weight`, ``LutWeight`` or ``Int4Weight``): a
        const holding its dequantized values, emitted in its stored form (``constexpr_affine_dequantize``,
        ANE-35; ``constexpr_lut_to_dense`` or ``constexpr_blockwise_shift_scale``, ANE-38)."""
        node = self.const(name, weight.dequantized())
        node.attrs["quantized"] = weight
        return node

    def _const(self, name: str, array: np.ndarray | float, dtype: str = "fp16", origin: str | None = None) -> Node:
        """``const`` under an already scoped ``name`` (the operand consts of a named node); ``origin`` names
        where the values came from (a checkpoint tensor, :mod:`orion.origins`) in errors."""
        value = _held(array)
        node_name = self.unique_name(name)
        key = lineage.key_of(value)  # checked once per process for every program baking the same values
        if lineage.recall(key, "in fp16 range"):
            return self.add_node("const", [], name=node_name, value=value, shape=value.shape, dtype=dtype)
        if not _all_finite(value) or (value.dtype != np.float16 and value.size and np.abs(value).max() > FP16_MAX):
            nan, inf = int(np.isnan(value).sum()), int(np.isinf(value).sum())
            large = int((np.abs(np.where(np.isfinite(value), value, 0)) > FP16_MAX).sum())
            found = ", ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "infinite"),
                                                            (large, f"beyond +-{FP16_MAX:.0f}")) if n)
            source = f" (from {origin})" if origin else ""
            fix = "the checkpoint is damaged or was saved from a diverged run: use a good copy" if nan or inf \
                else "clamp or rescale the constant into fp16 range"
            raise violation("ANE-25", node_name, f"the constant{source} has {found} of its {value.size} values",
                            fix)
        lineage.remember(key, "in fp16 range", True)
        return self.add_node("const", [], name=node_name, value=value, shape=value.shape, dtype=dtype)

    def output(self, node: Node, name: str) -> None:
        """Return ``node`` under ``name``; outputs must be ``[1, C, 1, S]``."""
        _check_ident(name, "output name")
        if not isinstance(node, Node):
            raise GraphError(f"output '{name}': {type(node).__name__} is not a graph node. Fix: pass a node")
        self._own(node, f"output '{name}'")
        if name in self.outputs:
            raise GraphError(f"output '{name}': the name is already used. Fix: pick another name")
        s = node.shape
        if len(s) != 4 or s[0] != 1 or s[2] != 1:
            raise GraphError(f"output '{name}' (node '{node.name}'): shape {list(s)} is not [1, C, 1, S]. "
                             "Fix: reshape it to [1, C, 1, S]")
        self.outputs[name] = node

    # -- linear algebra -------------------------------------------------------------------------
    def linear(self, x: Node, weight: Node | np.ndarray, bias: Node | np.ndarray | None = None, *,
               name: str | None = None) -> Node:
        """``W @ x (+ b)`` over channels: a const weight ``[Cout, Cin]`` (W[out][in]) and bias ``[Cout]`` make a
        1x1 conv; a runtime weight ``[1, Cout, 1, Cin]`` (and bias ``[1, Cout, 1, 1]``) a matmul."""
        return self.apply("linear", [x, weight] if bias is None else [x, weight, bias], name=name)

    def matmul(self, x: Node, y: Node | np.ndarray, *, transpose_x: bool = False, transpose_y: bool = False,
               name: str | None = None) -> Node:
        """Batched matrix product over the last two axes (both operands may be runtime values)."""
        return self.apply("matmul", [x, y], {"transpose_x": transpose_x, "transpose_y": transpose_y}, name=name)

    # -- elementwise ----------------------------------------------------------------------------
    def add(self, x: Node, y: Operand, *, name: str | None = None) -> Node:
        """``x + y`` with broadcasting."""
        return self.apply("add", [x, y], name=name)

    def sub(self, x: Node, y: Operand, *, name: str | None = None) -> Node:
        """``x - y`` with broadcasting."""
        return self.apply("sub", [x, y], name=name)

    def mul(self, x: Node, y: Operand, *, name: str | None = None) -> Node:
        """``x * y`` with broadcasting."""
        return self.apply("mul", [x, y], name=name)

    def div(self, x: Node, y: Operand, *, name: str | None = None) -> Node:
        """``x / y`` (legalized to a multiplication by the reciprocal)."""
        return self.apply("div", [x, y], name=name)

    def pow(self, x: Node, exponent: float, *, name: str | None = None) -> Node:
        """``x ** exponent`` for a constant exponent."""
        return self.apply("pow", [x, float(exponent)], name=name)

    def neg(self, x: Node, *, name: str | None = None) -> Node:
        """``-x``."""
        return self.apply("neg", [x], name=name)

    def exp(self, x: Node, *, name: str | None = None) -> Node:
        """``e ** x``."""
        return self.apply("exp", [x], name=name)

    def tanh(self, x: Node, *, name: str | None = None) -> Node:
        """Hyperbolic tangent."""
        return self.apply("tanh", [x], name=name)

    def sigmoid(self, x: Node, *, name: str | None = None) -> Node:
        """Logistic sigmoid."""
        return self.apply("sigmoid", [x], name=name)

    def relu(self, x: Node, *, name: str | None = None) -> Node:
        """``max(x, 0)``."""
        return self.apply("relu", [x], name=name)

    def identity(self, x: Node, *, name: str | None = None) -> Node:
        """``x`` unchanged (removed by the identity-elimination pass)."""
        return self.apply("identity", [x], name=name)

    def gelu(self, x: Node, *, name: str | None = None) -> Node:
        """GELU, computed with the tanh approximation."""
        return self.apply("gelu", [x], name=name)

    def silu(self, x: Node, *, name: str | None = None) -> Node:
        """SiLU: ``x * sigmoid(x)``."""
        return self.apply("silu", [x], name=name)

    def rsqrt(self, x: Node, *, name: str | None = None) -> Node:
        """``1 / sqrt(x)``."""
        return self.apply("rsqrt", [x], name=name)

    def sqrt(self, x: Node, *, name: str | None = None) -> Node:
        """``sqrt(x)``."""
        return self.apply("sqrt", [x], name=name)

    # -- reductions and normalization -----------------------------------------------------------
    def softmax(self, x: Node, axis: int = -1, *, name: str | None = None) -> Node:
        """Softmax along ``axis``; its extent must be a power of two (ANE-08)."""
        return self.apply("softmax", [x], {"axis": axis}, name=name)

    def reduce_sum(self, x: Node, axis: int, *, name: str | None = None) -> Node:
        """Sum along ``axis``, keeping it with size 1."""
        return self.apply("reduce_sum", [x], {"axis": axis}, name=name)

    def reduce_max(self, x: Node, axis: int, *, name: str | None = None) -> Node:
        """Maximum along ``axis``, keeping it with size 1."""
        return self.apply("reduce_max", [x], {"axis": axis}, name=name)

    def reduce_mean(self, x: Node, axis: int, *, name: str | None = None) -> Node:
        """Mean along ``axis``, keeping it with size 1."""
        return self.apply("reduce_mean", [x], {"axis": axis}, name=name)

    def layer_norm(self, x: Node, gamma: Node | np.ndarray, beta: Node | np.ndarray, eps: float = 1e-5, *,
                   name: str | None = None) -> Node:
        """LayerNorm over channels of ``[1, C, 1, S]``: ``(x - mean) / sqrt(var + eps) * gamma + beta``
        (parameters const ``[C]`` or runtime ``[1, C, 1, 1]``)."""
        return self.apply("layer_norm", [x, gamma, beta], {"eps": eps}, name=name)

    def rms_norm(self, x: Node, gamma: Node | np.ndarray, eps: float = 1e-5, *, name: str | None = None) -> Node:
        """RMSNorm over channels of ``[1, C, 1, S]``: ``x / sqrt(mean(x^2) + eps) * gamma`` (gamma const ``[C]``
        or runtime ``[1, C, 1, 1]``)."""
        return self.apply("rms_norm", [x, gamma], {"eps": eps}, name=name)

    def attention(self, q: Node, k: Node, v: Node, heads: int, *, causal: bool = True,
                  name: str | None = None) -> Node:
        """Multi-head attention of ``[1, heads*head_dim, 1, S]`` q, k, v; S must be a power of two."""
        return self.apply("attention", [q, k, v], {"heads": heads, "causal": causal}, name=name)

    # -- layout ---------------------------------------------------------------------------------
    def reshape(self, x: Node, shape: Sequence[int], *, name: str | None = None) -> Node:
        """Same data, new shape (same element count, no -1)."""
        return self.apply("reshape", [x], {"shape": shape}, name=name)

    def transpose(self, x: Node, perm: Sequence[int], *, name: str | None = None) -> Node:
        """Permute the axes."""
        return self.apply("transpose", [x], {"perm": perm}, name=name)

    def cast(self, x: Node, dtype: str, *, name: str | None = None) -> Node:
        """Convert to ``"fp16"`` or ``"fp32"``."""
        return self.apply("cast", [x], {"dtype": dtype}, name=name)

    def slice(self, x: Node, axis: int, start: int, stop: int, *, name: str | None = None) -> Node:
        """``x[..., start:stop, ...]`` along ``axis`` (non-negative indices)."""
        return self.apply("slice", [x], {"axis": axis, "start": start, "stop": stop}, name=name)

    def split(self, x: Node, sizes: Sequence[int], axis: int, *, name: str | None = None) -> list[Node]:
        """Consecutive slices of ``sizes`` along ``axis`` (sugar over :meth:`slice`)."""
        base = self._name(name, "split")
        if sum(sizes) != x.shape[axis]:
            raise GraphError(f"node '{base}' (split): sizes {list(sizes)} do not add up to {x.shape[axis]}. "
                             "Fix: give sizes summing to the axis extent")
        bounds = np.cumsum([0, *sizes])
        return [self.slice(x, axis, int(a), int(b), name=f"{base}_{i}") for i, (a, b) in
                enumerate(itertools.pairwise(bounds))]

    def pad(self, x: Node, axis: int, before: int, after: int, *, name: str | None = None) -> Node:
        """Zero padding along the channel (1) or sequence (3) axis."""
        return self.apply("pad", [x], {"axis": axis, "before": before, "after": after}, name=name)

    def concat(self, xs: Sequence[Node], axis: int, *, name: str | None = None) -> Node:
        """Concatenation along the channel (1) or sequence (3) axis (legalized: no concat on the ANE)."""
        return self.apply("concat", list(xs), {"axis": axis}, name=name)

    def __repr__(self) -> str:
        return f"Graph({self.name}: {len(self.nodes)} nodes, inputs {[n.name for n in self.inputs]}, " \
               f"outputs {list(self.outputs)})"


def _check_ident(name: str, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise GraphError(f"{what} {name!r} is not an identifier. Fix: use letters, digits and '_'")
    return name
