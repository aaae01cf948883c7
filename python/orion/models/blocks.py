"""Graph building blocks shared by the models: pieces written once and used by several families.

A family writes each layer once, as a body that reads its weights through :class:`LayerParams` by the
trainer's parameter names (``w_q``, ``wq_g0``, ...). The same body builds the inference graphs, where
:class:`BakedParams` makes the weights consts (fused projections, ``quant`` storage, LoRA sites of the
inference graphs), and the training layer graph, where :class:`InputParams` makes them graph inputs (one
linear per parameter, so every dW is its own output; LoRA sites of the trainable's ``lora_targets``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np

from orion.autodiff.trainable import input_shape
from orion.graph import Graph, lineage
from orion.graph.ir import Node
from orion.lora.graph import Sites, adapted, adapted_parts
from orion.ops import MASK_VALUE, PACKED_MASK_INPUT, PACKED_WINDOW_MASK_INPUT, graph_causal_mask, packed_causal_mask
from orion.quant import weight_operand
from orion.runtime.pages import huge_page_array

# Hugging Face module (relative to its layer) -> its (weight, bias or None) parameters, output rows in order
Projection = Mapping[str, Sequence[tuple[str, str | None]]]


class LayerParams(ABC):
    """A layer's parameters as the family's one layer body reads them (see the module docstring)."""

    @abstractmethod
    def vector(self, name: str) -> Node | np.ndarray:
        """A norm gain or bias ``[C]`` (an array, or a ``[1, C, 1, 1]`` input)."""

    @abstractmethod
    def project(self, g: Graph, x: Node, modules: Projection, name: str) -> list[Node]:
        """``x`` through every parameter of ``modules`` (with their LoRA terms): one output per parameter."""

    @abstractmethod
    def project_sum(self, g: Graph, pieces: Sequence[Node], module: str, weights: Sequence[str], name: str) -> Node:
        """``sum_j weights[j] pieces[j]``: one module whose input columns are split among ``pieces``."""


class BakedParams(LayerParams):
    """Inference: ``arrays`` (parameter name -> array) as consts stored as ``quant`` says; the parameters of
    one :meth:`project` are one fused linear (``fused`` gives a stacked array the weights already hold,
    keyed by the names it stacks) on the LoRA site ``sites[module]`` of its first module. ``importance``: the
    layer's importance matrix by parameter name (``orion.importance.Importance.layers[i]``), for the quantizer;
    the parameters of one linear share its input, so its first parameter's values stand for all of them."""

    def __init__(self, arrays: Mapping[str, np.ndarray], sites: Mapping[str, str], adapters: Sites | None,
                 quant: str, fused: Mapping[tuple[str, ...], np.ndarray] | None = None,
                 importance: Mapping[str, np.ndarray] | None = None) -> None:
        self.arrays, self.sites, self.adapters, self.quant = arrays, sites, adapters, quant
        self.fused = fused or {}
        self.importance = importance

    def _importance(self, weight: str) -> np.ndarray | None:
        return None if self.importance is None else self.importance[weight]

    def vector(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def _stacked(self, names: Sequence[str]) -> np.ndarray:
        if len(names) == 1:
            return self.arrays[names[0]]
        fused = self.fused.get(tuple(names))
        if fused is not None:
            return fused
        parts = [self.arrays[n] for n in names]
        stacked = huge_page_array((sum(p.shape[0] for p in parts), *parts[0].shape[1:]),
                                  np.result_type(*parts))
        return lineage.derived(np.concatenate(parts, out=stacked), "concatenate", parts)

    def project(self, g: Graph, x: Node, modules: Projection, name: str) -> list[Node]:
        parts = [part for module in modules.values() for part in module]
        biases = [b for _, b in parts]
        bias = None if None in biases else self._stacked(biases)  # type: ignore[arg-type]
        y = linear(g, x, self._stacked([w for w, _ in parts]), bias, self.quant, name, self._importance(parts[0][0]))
        y = adapted(g, y, [x], self.sites[next(iter(modules))], self.adapters)
        if len(parts) == 1:
            return [y]
        return g.split(y, [self.arrays[w].shape[0] for w, _ in parts], axis=1, name=name)

    def project_sum(self, g: Graph, pieces: Sequence[Node], module: str, weights: Sequence[str], name: str) -> Node:
        acc = None
        for j, (piece, weight) in enumerate(zip(pieces, weights, strict=True)):
            part = linear(g, piece, self.arrays[weight], None, self.quant, f"{name}_g{j}", self._importance(weight))
            acc = part if acc is None else g.add(acc, part, name=f"{name}_sum{j}")
        return adapted(g, acc, list(pieces), self.sites[module], self.adapters)


class InputParams(LayerParams):
    """Training: every parameter of ``shapes`` (name -> natural shape) a graph input (:func:`input_shape`),
    made in ``shapes``' order; each weight its own linear, the LoRA terms on ``sites[module]`` scaled by
    ``lora_scale`` (PEFT's unscaled B is the parameter)."""

    def __init__(self, g: Graph, shapes: Mapping[str, tuple[int, ...]], sites: Mapping[str, str],
                 adapters: Sites | None, lora_scale: float = 1.0) -> None:
        self.inputs = {name: g.input(name, input_shape(shape)) for name, shape in shapes.items()}
        self.sites, self.adapters, self.lora_scale = sites, adapters, lora_scale

    def vector(self, name: str) -> Node:
        return self.inputs[name]

    def project(self, g: Graph, x: Node, modules: Projection, name: str) -> list[Node]:
        single = sum(len(parts) for parts in modules.values()) == 1
        out: list[Node] = []
        for module, parts in modules.items():
            ys = [g.linear(x, self.inputs[w], None if b is None else self.inputs[b], name=name if single else w)
                  for w, b in parts]
            out += adapted_parts(g, ys, [x], self.sites[module], self.adapters, self.lora_scale)
        return out

    def project_sum(self, g: Graph, pieces: Sequence[Node], module: str, weights: Sequence[str], name: str) -> Node:
        acc = None
        for j, (piece, weight) in enumerate(zip(pieces, weights, strict=True)):
            part = g.linear(piece, self.inputs[weight], name=f"{name}_g{j}")
            acc = part if acc is None else g.add(acc, part, name=f"{name}_sum{j}")
        return adapted(g, acc, list(pieces), self.sites[module], self.adapters, self.lora_scale)


def linear(g: Graph, x: Node, weight: np.ndarray, bias: np.ndarray | None, quant: str, name: str,
           importance: np.ndarray | None = None) -> Node:
    """``g.linear`` by a const ``weight`` [Cout, Cin] stored as ``quant`` says (orion.quant; ``importance`` [Cin]
    of its input channels for the LUT quantizer); the bias stays fp16."""
    return g.linear(x, weight_operand(g, weight, quant, name, importance), bias, name=name)


def cached_attention(g: Graph, q: Node, k: Node, v: Node, k_cache: Node, v_cache: Node, mask: Node,
                     heads: int, scale: float | None = None, softcap: float | None = None) -> Node:
    """Multi-head attention of one token per lane over that lane's KV cache plus its own key/value; the
    scores are scaled by ``scale`` (default ``1/sqrt(head_dim)``) and, with ``softcap``, capped
    (:func:`soft_cap`) before the mask.

    ``q``, ``k``, ``v`` are ``[1, C, 1, L]`` (one sequence per lane), the caches ``[1, L*C, 1, T]``
    (lane ``b``'s ``[C, T]`` block after lane ``b-1``'s) and ``mask`` ``[1, L, 1, T]`` (additive: 0 for
    filled positions). softmax([q.K_cache + mask, q.k]) . [V_cache, v] written with reductions, so the
    new key needs no concat: m = max(max_t s_t, s_self); out = (sum_t e_t V_t + e_self v) / (sum_t e_t + e_self).
    With several lanes, each lane is a batch of the matmuls (``[L, H, 1, D]`` against ``[L, H, D, T]``).
    """
    c, lanes, t = q.shape[1], q.shape[3], k_cache.shape[3]
    d = c // heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if lanes == 1:
        qh = g.reshape(g.mul(q, scale, name="qs"), [1, heads, 1, d], name="qh")
        kh, vh = (g.reshape(n, [1, heads, 1, d], name=f"{p}h") for n, p in ((k, "k"), (v, "v")))
    else:  # [1, C, 1, L] -> [L, H, 1, D]: the lane becomes the leading batch axis
        qh, kh, vh = (g.transpose(g.reshape(n, [1, heads, d, lanes], name=f"{p}_heads"), [3, 1, 0, 2], name=f"{p}h")
                      for n, p in ((g.mul(q, scale, name="qs"), "q"), (k, "k"), (v, "v")))
        mask = g.reshape(mask, [lanes, 1, 1, t], name="lane_mask")
    keys = g.reshape(k_cache, [lanes, heads, d, t], name="keys")
    values = g.reshape(v_cache, [lanes, heads, d, t], name="values")
    scores = g.add(soft_cap(g, g.matmul(qh, keys, name="scores"), softcap, "scores"), mask, name="masked")  # [L,H,1,T]
    self_score = soft_cap(g, g.reduce_sum(g.mul(qh, kh, name="qk"), axis=3, name="self"), softcap, "self")  # [L,H,1,1]
    top = g.reduce_max(scores, axis=3, name="top")
    m = g.add(self_score, g.relu(g.sub(top, self_score, name="gap"), name="over"),
              name="max")  # max(top, self_score) without a max op
    e = g.exp(g.sub(scores, m, name="shift"), name="e")
    e_self = g.exp(g.sub(self_score, m, name="shift_self"), name="e_self")
    denom = g.add(g.reduce_sum(e, axis=3, name="esum"), e_self, name="denom")
    num = g.add(g.matmul(e, values, transpose_y=True, name="ev"), g.mul(e_self, vh, name="ev_self"),
                name="num")  # [L,H,1,D]
    out = g.mul(num, g.pow(denom, -1.0, name="inv"), name="ctx")
    if lanes > 1:
        out = g.transpose(out, [2, 1, 3, 0], name="lanes_last")  # [1, H, D, L]
    return g.reshape(out, [1, c, 1, lanes], name="merged")


def chunk_attention(g: Graph, q: Node, k: Node, v: Node, k_cache: Node, v_cache: Node, past_mask: Node,
                    causal: Node, heads: int, scale: float | None = None, softcap: float | None = None) -> Node:
    """Multi-head attention of a prompt chunk over the KV cache filled so far plus itself, causal within
    the chunk; the scores are scaled by ``scale`` (default ``1/sqrt(head_dim)``) and, with ``softcap``,
    capped (:func:`soft_cap`) before the masks.

    ``q``, ``k``, ``v`` are ``[1, C, 1, S]``, the caches ``[1, C, 1, T]``, ``past_mask`` ``[1, 1, 1, T]``
    (additive: 0 for the past positions) or ``[1, 1, S, T]`` (one row per query: a sliding window's,
    :func:`window_mask_input`) and ``causal`` ``[1, 1, S, S]`` (additive: 0 on and below the diagonal, or
    within the window, :func:`causal_mask_node`). As in :func:`cached_attention`, the two score blocks share one softmax through reductions,
    so no concat is needed: m = max(max_t s_t, max_j s_j); p = e / (sum_t e_t + sum_j e_j);
    out = (p_past V_cache^T + p_chunk v^T)^T. The caches are the matmuls' ``y`` operands (as in
    :func:`cached_attention`), which the emulator reads in place in fp16; the context is made ``[1, H, S, D]``
    and transposed once.
    """
    c, s, t = q.shape[1], q.shape[3], k_cache.shape[3]
    d = c // heads
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qh = g.reshape(g.mul(q, scale, name="qs"), [1, heads, d, s], name="qh")
    kh, vh = (g.reshape(n, [1, heads, d, s], name=f"{p}h") for n, p in ((k, "k"), (v, "v")))
    keys = g.reshape(k_cache, [1, heads, d, t], name="keys")
    values = g.reshape(v_cache, [1, heads, d, t], name="values")
    past = g.add(soft_cap(g, g.matmul(qh, keys, transpose_x=True, name="past_scores"), softcap, "past_scores"),
                 past_mask, name="past_masked")  # [1,H,S,T]
    own = g.add(soft_cap(g, g.matmul(qh, kh, transpose_x=True, name="own_scores"), softcap, "own_scores"), causal,
                name="own_masked")  # [1,H,S,S]
    top_past = g.reduce_max(past, axis=3, name="past_top")
    top_own = g.reduce_max(own, axis=3, name="own_top")
    m = g.add(top_own, g.relu(g.sub(top_past, top_own, name="gap"), name="over"), name="max")  # without a max op
    e_past = g.exp(g.sub(past, m, name="past_shift"), name="past_e")
    e_own = g.exp(g.sub(own, m, name="own_shift"), name="own_e")
    denom = g.add(g.reduce_sum(e_past, axis=3, name="past_sum"), g.reduce_sum(e_own, axis=3, name="own_sum"),
                  name="denom")  # [1,H,S,1]
    inv = g.pow(denom, -1.0, name="inv")
    p_past = g.mul(e_past, inv, name="past_p")
    p_own = g.mul(e_own, inv, name="own_p")
    ctx = g.add(g.matmul(p_past, values, transpose_y=True, name="past_ctx"),
                g.matmul(p_own, vh, transpose_y=True, name="own_ctx"), name="ctx")  # [1,H,S,D]
    return g.reshape(g.transpose(ctx, [0, 1, 3, 2], name="ctx_t"), [1, c, 1, s], name="merged")  # [1,H,D,S]


# -- packed prompts -----------------------------------------------------------------------------------------
# Several whole prompts read in one pass (``prefill_graph(..., packed=True)``): side by side on the lanes, each
# attending to its own earlier positions only, through an additive mask input (``orion.ops.packed_causal_mask``,
# the input ``PACKED_MASK_INPUT``) instead of the causal const.

def packed_mask_input(g: Graph, seq: int, window: bool = False) -> Node:
    """The input ``mask_packed`` (``window``: ``mask_packed_window``, of the sliding-window layers) ``[1, seq, 1,
    seq]`` (a query per channel row, its keys on the lanes: ``orion.ops.packed_causal_mask``) as the additive
    ``[1, 1, seq, seq]`` mask of the scores."""
    name = PACKED_WINDOW_MASK_INPUT if window else PACKED_MASK_INPUT
    return g.reshape(g.input(name, [1, seq, 1, seq]), [1, 1, seq, seq], name=f"{name}_rows")


def packed_mask_inputs(windows: Sequence[int | None], lengths: Sequence[int], seq: int) -> dict[str, np.ndarray]:
    """A model's ``packed_mask_inputs`` hook (``orion.generation.loop``) for the layers' sliding ``windows`` (None: a
    layer without one): ``mask_packed`` and, with a window, ``mask_packed_window`` of prompts of ``lengths``."""
    window = next((w for w in windows if w), None)
    masks = {PACKED_MASK_INPUT: packed_causal_mask(lengths, seq)}
    return masks if window is None else masks | {PACKED_WINDOW_MASK_INPUT: packed_causal_mask(lengths, seq, window)}


def packed_attention(g: Graph, q: Node, k: Node, v: Node, mask: Node, heads: int, name: str) -> Node:
    """``g.attention(q, k, v, heads, causal=True)`` as the registry legalizes it (scores scaled by 1/sqrt(head_dim),
    softmax, context), with the additive ``mask`` ``[1, 1, S, S]`` (``orion.ops.packed_causal_mask``) in place of the
    causal one: ``q``, ``k``, ``v`` and the result ``[1, C, 1, S]``."""
    c, s = q.shape[1], q.shape[3]
    d = c // heads
    qh, kh, vh = (g.reshape(t, [1, heads, d, s], name=f"{name}_{p}_heads") for t, p in ((q, "q"), (k, "k"), (v, "v")))
    scores = g.mul(g.matmul(qh, kh, transpose_x=True, name=f"{name}_scores"), 1.0 / math.sqrt(d),
                   name=f"{name}_scaled")
    probs = g.softmax(g.add(scores, mask, name=f"{name}_masked"), axis=-1, name=f"{name}_probs")
    ctx = g.matmul(vh, probs, transpose_y=True, name=f"{name}_ctx")  # [1, H, d, S]
    return g.reshape(ctx, [1, c, 1, s], name=f"{name}_merged")


def soft_cap(g: Graph, scores: Node, cap: float | None, name: str) -> Node:
    """``cap * tanh(scores / cap)`` (Gemma 2's attention-logit and final-logit soft-capping); ``scores`` as
    they are without a cap."""
    if cap is None:
        return scores
    return g.mul(g.tanh(g.mul(scores, 1.0 / cap, name=f"{name}_over_cap"), name=f"{name}_tanh"), cap,
                 name=f"{name}_capped")


# -- sliding-window attention -------------------------------------------------------------------------------
# A layer with a sliding window of W positions lets the query at position p see the keys at positions t with
# p - W < t <= p (transformers' sliding_window_overlay: kv_idx > q_idx - W); a layer without one sees t <= p.
# Prefill graphs hold the window within the prompt as a const; decode and chunk graphs read the window over the
# KV cache as the per-position input ``mask_window`` (:func:`window_mask_columns`, written by the generation
# loop through the model's ``mask_inputs`` hook), since where it starts depends on the position.

WINDOW_MASK_INPUT = "mask_window"


def window_causal_mask(s: int, window: int) -> np.ndarray:
    """``[1, 1, S, S]`` additive mask of ``s`` consecutive positions: 0 where query i sees key j
    (``i - window < j <= i``), -65504 elsewhere."""
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    return np.where((j <= i) & (j > i - window), 0.0, MASK_VALUE).reshape(1, 1, s, s)


def causal_mask_node(g: Graph, s: int, window: int | None) -> Node:
    """The additive mask of ``s`` consecutive positions for a layer with ``window`` (None: plain causal, the
    generated mask the emulator's fused attention recognises; a window no shorter than ``s`` is the same)."""
    if window is None or window >= s:
        return graph_causal_mask(g, s)
    return g.const(f"mask_window_{s}", window_causal_mask(s, window))


def window_mask_inputs(windows: Sequence[int | None], positions: range, length: int) -> dict[str, np.ndarray]:
    """A model's ``mask_inputs`` hook (``orion.generation.loop``) for the layers' sliding ``windows`` (None: a layer
    without one): the ``mask_window`` columns over a KV cache of ``length`` lanes, or nothing without a window."""
    window = next((w for w in windows if w), None)
    return {} if window is None else {WINDOW_MASK_INPUT: window_mask_columns(positions, positions.start, length, window)}


def window_mask_columns(positions: range, cached: int, length: int, window: int) -> np.ndarray:
    """The ``mask_window`` input of the queries at ``positions`` over a KV cache of ``length`` lanes whose
    first ``cached`` positions are filled: float32 ``[length, len(positions)]``, column q 0 at the cached
    positions t with ``positions[q] - window < t < cached`` and -65504 elsewhere (the query's own and later
    keys come from the graph's own block)."""
    t = np.arange(length)[:, None]
    p = np.asarray(positions)[None, :]
    return np.where((t < cached) & (t > p - window), 0.0, MASK_VALUE).astype(np.float32)


def layer_flag_pick(g: Graph, name: str, flag: Node | None, arrays: tuple[np.ndarray, np.ndarray],
                    uniform: bool = False) -> Node:
    """A const that differs between the layers sharing one training layer graph (a sliding layer's mask, a RoPE
    table): ``arrays[0]`` where the 0/1 input ``flag`` ``[1, 1, 1, 1]`` is 0 and ``arrays[1]`` where it is 1, as
    ``(1 - f) a + f b`` (exact for f in {0, 1}); without a flag (every layer alike) the const ``arrays[uniform]``."""
    if flag is None:
        return g.const(name, arrays[uniform])
    off = g.sub(g.const(f"{name}_one", 1.0), flag, name=f"{name}_off")
    return g.add(g.mul(g.const(f"{name}_a", arrays[0]), off, name=f"{name}_a_picked"),
                 g.mul(g.const(f"{name}_b", arrays[1]), flag, name=f"{name}_b_picked"), name=name)


def masked_attention(g: Graph, qh: Node, kh: Node, vh: Node, mask: Node, scale: float, softcap: float | None,
                     name: str) -> Node:
    """Attention of queries ``[1, H, hd, S]`` over keys and values ``[1, H, hd, S]`` of the same positions with an
    additive ``mask`` ``[1, 1, S, S]``: scores scaled by ``scale``, capped (:func:`soft_cap`), masked, softmax;
    returns ``[1, H * hd, 1, S]``. Written with differentiable ops: the training graphs' attention where the
    registry's causal ``attention`` op does not fit (a sliding window, a cap, another scale)."""
    heads, d, s = qh.shape[1], qh.shape[2], qh.shape[3]
    scores = g.matmul(g.mul(qh, scale, name=f"{name}_q_scaled"), kh, transpose_x=True, name=f"{name}_scores")
    scores = soft_cap(g, scores, softcap, f"{name}_scores")
    probs = g.softmax(g.add(scores, mask, name=f"{name}_masked"), axis=-1, name=f"{name}_probs")
    ctx = g.matmul(vh, probs, transpose_y=True, name=f"{name}_ctx")  # [1, H, hd, S]
    return g.reshape(ctx, [1, heads * d, 1, s], name=f"{name}_merged")


def window_mask_input(g: Graph, length: int, seq: int, per_lane: bool = False) -> Node:
    """The graph input ``mask_window`` ``[1, length, 1, seq]`` (:func:`window_mask_columns`, one column per
    query lane) as an additive mask of the scores: ``[1, 1, 1, length]`` for one token, ``[1, 1, seq, length]``
    for a chunk, and ``[1, seq, 1, length]`` (``per_lane``: one sequence's token per lane, as the decode
    ``mask`` of :func:`cached_attention`)."""
    columns = g.input(WINDOW_MASK_INPUT, [1, length, 1, seq])
    if seq == 1:
        return g.reshape(columns, [1, 1, 1, length], name="mask_window_row")
    if per_lane:
        return g.transpose(columns, [0, 3, 2, 1], name="mask_window_lanes")
    return g.transpose(columns, [0, 2, 3, 1], name="mask_window_rows")
