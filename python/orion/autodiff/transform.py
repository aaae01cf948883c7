"""Reverse-mode differentiation of a graph over the op registry: :func:`backward`.

The gradient graph recomputes the forward nodes it needs (a copy of the forward graph; dead-code
elimination drops the rest at compile time), or, with ``save_activations=True``, takes the forward values
its gradient rules read as inputs ``saved_<node>`` (:func:`saved_activations`: the forward program returns
them), so only what those values do not cover is recomputed. It takes the cotangent of each forward output that depends on
the differentiated inputs as an input ``grad_<output>``, and returns ``grad_<input>`` for each input in
``wrt``. Nodes are visited in reverse topological order; each op's rule (``OpDef.grad``, see
:mod:`orion.autodiff.context`) maps the cotangent of its result to cotangents of its operands, and the
cotangents of a value used several times are summed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orion import ops
from orion.autodiff.context import GradContext, GradientError
from orion.graph.builder import Graph
from orion.graph.ir import Node

GRAD_PREFIX = "grad_"
SAVED_PREFIX = "saved_"


def grad_name(name: str) -> str:
    """The gradient graph's name for the cotangent of forward input or output ``name``."""
    return f"{GRAD_PREFIX}{name}"


def saved_activations(gradient: Graph) -> dict[str, str]:
    """The forward values a gradient graph built with ``save_activations=True`` takes as inputs: input name ->
    forward node name (the forward program returns each under the input's name)."""
    return {n.name: n.name[len(SAVED_PREFIX):] for n in gradient.inputs if n.name.startswith(SAVED_PREFIX)}


def backward(graph: Graph, wrt: Sequence[str], *, name: str | None = None,
             values: Mapping[str, str] | None = None, cotangents: Mapping[str, str] | None = None,
             save_activations: bool = False) -> Graph:
    """The gradient graph of ``graph`` with respect to its inputs ``wrt`` (activations or runtime weights).

    Inputs: every input of ``graph`` (same names) and ``grad_<out>`` for each output that depends on
    ``wrt``. Outputs: ``grad_<x>`` for each ``x`` in ``wrt``, in that order; then, for each
    ``output name -> forward node name`` of ``values``, that node's recomputed value, and of
    ``cotangents``, that node's cotangent (how a weight gradient is left to the CPU: the ANE returns a
    linear's input and output cotangent, the CPU forms ``dy x^T``, see ``orion.autodiff.partition``).
    ``save_activations``: each computed forward value ``[1, C, 1, S]`` that a gradient rule reads becomes the
    input ``saved_<node>`` instead of being recomputed (its value is the forward program's, bit for bit: the
    same ops on the same inputs).
    """
    by_name = {n.name: n for n in graph.inputs}
    unknown = [w for w in wrt if w not in by_name]
    if unknown or not wrt:
        raise GradientError(f"graph '{graph.name}': cannot differentiate with respect to {unknown or '[]'}. "
                            f"Fix: name inputs of the graph, from {sorted(by_name)}")
    g = Graph(name or f"{graph.name}_grad")
    copy: dict[int, Node] = {}
    for n in graph.nodes:
        if n.op == "input":
            copy[id(n)] = g.input(n.name, n.shape, n.dtype)
        elif n.op == "const":
            copy[id(n)] = g.add_node("const", [], name=n.name, value=n.value, shape=n.shape, dtype=n.dtype)
        else:
            copy[id(n)] = g.add_node(n.op, [copy[id(i)] for i in n.inputs], n.attrs, name=n.name)

    depends = {id(by_name[w]) for w in wrt}
    for n in graph.nodes:
        if any(id(i) in depends for i in n.inputs):
            depends.add(id(n))
    cotangent: dict[int, Node] = {}
    for out, node in graph.outputs.items():
        if id(node) in depends:
            if grad_name(out) in by_name:
                raise GradientError(f"graph '{graph.name}': input '{grad_name(out)}' clashes with the cotangent of "
                                    f"output '{out}'. Fix: rename that input")
            _accumulate(g, cotangent, node, g.input(grad_name(out), node.shape, node.dtype))
    if not cotangent:
        raise GradientError(f"graph '{graph.name}': no output depends on {list(wrt)}. Fix: differentiate inputs "
                            "that reach an output")

    for n in reversed(graph.nodes):
        dy = cotangent.get(id(n))
        if dy is None or n.op in ("input", "const"):
            continue
        rule = ops.get(n.op, n.name).grad
        if rule is None:
            raise GradientError(f"node '{n.name}' ({n.op}): the op has no gradient rule. Fix: build the graph from "
                                "ops with rules (orion.autodiff.differentiable_ops()) or define OpDef.grad for it")
        ctx = GradContext(g, copy[id(n)], tuple(id(i) in depends for i in n.inputs))
        with g.scope(f"d_{n.name}"):
            grads = rule(ctx, copy[id(n)], dy)
        if len(grads) != len(n.inputs):
            raise GradientError(f"node '{n.name}' ({n.op}): its gradient rule returned {len(grads)} cotangents for "
                                f"{len(n.inputs)} operands. Fix: return one per operand (None where none flows)")
        for src, d in zip(n.inputs, grads, strict=True):
            if d is not None and id(src) in depends:
                if d.shape != src.shape:
                    raise GradientError(f"node '{n.name}' ({n.op}): cotangent of operand '{src.name}' has shape "
                                        f"{list(d.shape)}, expected {list(src.shape)}. Fix: the op's gradient rule")
                _accumulate(g, cotangent, src, d)

    if save_activations:
        _take_saved(g, copy, {id(copy[id(n)]) for n in graph.outputs.values()})
    for w in wrt:
        d = cotangent.get(id(by_name[w]))
        if d is None:
            raise GradientError(f"graph '{graph.name}': input '{w}' does not reach any output. Fix: drop it from wrt")
        if d.op == "input":  # an output must be computed in the program (ANE-06)
            d = g.identity(d, name=f"{grad_name(w)}_copy")
        g.output(d, grad_name(w))
    forward = {n.name: n for n in graph.nodes}
    for kind, wanted in (("value", values or {}), ("cotangent", cotangents or {})):
        for out, node_name in wanted.items():
            node = forward.get(node_name)
            d = None if node is None else (copy[id(node)] if kind == "value" else cotangent.get(id(node)))
            if d is None:
                why = "there is no such forward node" if node is None else f"it does not depend on {list(wrt)}"
                raise GradientError(f"graph '{graph.name}': no {kind} of node '{node_name}' to return as '{out}': "
                                    f"{why}. Fix: name a forward node that depends on the differentiated inputs")
            if d.op in ("input", "const"):  # an output must be computed in the program (ANE-06)
                d = g.identity(d, name=f"{out}_copy")
            g.output(d, out)
    return g


def _take_saved(g: Graph, copy: dict[int, Node], outputs: set[int]) -> None:
    """Replace each forward copy of ``[1, C, 1, S]`` that a gradient node reads by an input ``saved_<name>``,
    except inputs, consts and the forward's own ``outputs`` (recomputed: the forward program returns a value
    once); ``copy`` then maps its forward node to that input."""
    forward = {id(c): (key, c) for key, c in copy.items()}
    read: dict[int, tuple[int, Node]] = {}
    for n in g.nodes:
        if id(n) in forward:
            continue
        for i in n.inputs:
            if id(i) in forward and id(i) not in outputs and i.op not in ("input", "const") and len(i.shape) == 4 \
                    and i.shape[0] == 1 and i.shape[2] == 1:
                read.setdefault(id(i), forward[id(i)])
    for key, node in read.values():
        saved = g.input(f"{SAVED_PREFIX}{node.name}", node.shape, node.dtype)
        g.move_after(saved, node)  # before every reader of the value it stands for
        g.replace_uses(node, saved)
        copy[key] = saved


def _accumulate(g: Graph, cotangent: dict[int, Node], node: Node, d: Node) -> None:
    """Add ``d`` to the cotangent of ``node`` (a value used several times gets the sum of its uses)."""
    prior = cotangent.get(id(node))
    cotangent[id(node)] = d if prior is None else g.add(prior, d, name=f"acc_{node.name}")


def differentiable_ops() -> frozenset[str]:
    """The registry ops that have a gradient rule."""
    return frozenset(name for name, op in ops.REGISTRY.ops.items() if op.grad is not None)
