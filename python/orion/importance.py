"""How much each input channel of every linear weight matters: an importance matrix, as llama.cpp's
``llama-imatrix`` makes for its low-bit quantizers.

:func:`collect` runs the model's layers in fp32 numpy over calibration text (each family's training layer
graph, every parameter an input: the layer body the inference programs are built from, by the registry's op
references) and keeps, for every linear weight, the mean of ``x_c ** 2`` over every token of its input ``x``,
per input channel ``c`` (llama.cpp's ``in_sum2 / counts``). The LUT quantizers (:func:`orion.quant.quantize_lut`)
count each weight's error by its input channel's importance: a weight that multiplies a large input matters
more to the output. An :class:`Importance` is saved as ``.npz`` with the fingerprint of the weights it was
collected on (:meth:`Importance.check` refuses it for other weights).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from orion.autodiff import cpu, numpy_eval
from orion.errors import OrionError
from orion.graph.builder import Graph
from orion.limits import MIN_LANES
from orion.progress import ProgressLine
from orion.quant import IMPORTANCE_MODES

FORMAT = "orion-importance-1"
DEFAULT_WINDOW = 512  # calibration tokens per forward pass (each window from position 0, as llama-imatrix's chunks)


class ImportanceError(OrionError, ValueError):
    """An importance file that cannot be used for a model, or calibration input that cannot be read."""


@dataclass(frozen=True, eq=False)
class Importance:
    """``layers[i]``: layer ``i``'s linear weights by parameter name inside the layer (the trainer's: ``w_gate``,
    ``wq_g0``) -> float32 ``[Cin]`` mean square of the weight's input per channel; ``fingerprint``: the content
    hash of the weights it was collected on; ``tokens``: the calibration tokens; ``text``: what they were."""

    layers: tuple[dict[str, np.ndarray], ...]
    fingerprint: str
    tokens: int
    text: str

    @property
    def digest(self) -> str:
        """sha256 (hex) of the names and values: what a program built with it depends on."""
        h = hashlib.sha256(FORMAT.encode())
        for i, layer in enumerate(self.layers):
            for name in sorted(layer):
                h.update(f"{i}/{name}".encode() + b"\0" + np.ascontiguousarray(layer[name], np.float32).tobytes())
        return h.hexdigest()

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``path`` (``.npz``; the suffix is added when missing)."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        meta = {"format": FORMAT, "fingerprint": self.fingerprint, "tokens": self.tokens, "text": self.text,
                "layers": len(self.layers)}
        arrays = {f"{i}/{name}": v for i, layer in enumerate(self.layers) for name, v in layer.items()}
        np.savez(path, __meta__=np.array(json.dumps(meta)), **arrays)
        return path

    def check(self, config: Any, weights: Any) -> None:
        """Raise :class:`ImportanceError` unless these values were collected on ``weights`` (of ``config``) and give
        every linear weight of every layer one value per input channel."""
        fingerprint = weights.content_hash(config)
        if fingerprint != self.fingerprint:
            raise ImportanceError(f"importance from {self.text}: it was collected on weights {self.fingerprint[:12]}, "
                                  f"this model's are {fingerprint[:12]}. Fix: collect it on this model "
                                  f"(python -m orion imatrix MODEL --text FILE)")
        trainable = _trainable(config)
        expected = {name: shape[1] for name, shape in trainable.layer_shapes().items() if len(shape) == 2}
        if len(self.layers) != trainable.n_layers:
            raise ImportanceError(f"importance from {self.text}: {len(self.layers)} layers, the model has "
                                  f"{trainable.n_layers}. Fix: collect it on this model")
        for i, layer in enumerate(self.layers):
            missing, extra = sorted(set(expected) - set(layer)), sorted(set(layer) - set(expected))
            if missing or extra:
                raise ImportanceError(f"importance from {self.text}: layer {i} misses {missing[:4]}, has unexpected "
                                      f"{extra[:4]}. Fix: collect it again with this Orion")
            for name, cin in expected.items():
                v = layer[name]
                if v.shape != (cin,) or not np.all(np.isfinite(v)) or np.any(v < 0):
                    raise ImportanceError(f"importance from {self.text}: layer {i} {name} has shape {list(v.shape)} "
                                          f"(expected [{cin}]) or values that are not finite and >= 0. Fix: collect "
                                          "it again")


def read(path: str | os.PathLike[str]) -> Importance:
    """An :class:`Importance` saved by :meth:`Importance.save`."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["__meta__"]))
            layers: tuple[dict[str, np.ndarray], ...] = tuple({} for _ in range(int(meta["layers"])))
            for key in z.files:
                if key != "__meta__":
                    i, name = key.split("/", 1)
                    layers[int(i)][name] = np.asarray(z[key], np.float32)
    except (OSError, KeyError, ValueError, IndexError) as exc:
        raise ImportanceError(f"{path}: not an Orion importance file ({exc}). Fix: make one with "
                              f"python -m orion imatrix MODEL --text FILE") from None
    if meta.get("format") != FORMAT:
        raise ImportanceError(f"{path}: format {meta.get('format')!r}, this Orion reads {FORMAT!r}. Fix: collect it "
                              "again")
    return Importance(layers, meta["fingerprint"], int(meta["tokens"]), f"{path} ({meta['text']})")


def collect(model: Any, ids: Sequence[int], text: str, window: int = DEFAULT_WINDOW,
            progress: bool = True) -> Importance:
    """The importance of ``model``'s linear weights over token ``ids`` (run in windows of ``window`` tokens,
    each from position 0; a window's graph is padded to a power-of-two length, ANE-08, whose padding tokens come
    after the window's and are not counted); ``text`` says what the tokens are, for the record."""
    ids = [int(t) for t in ids]
    if len(ids) < 2:
        raise ImportanceError(f"calibration {text}: {len(ids)} tokens. Fix: give a longer text")
    outside = sorted({t for t in ids if not 0 <= t < model.dims.vocab_size})
    if outside:
        raise ImportanceError(f"calibration {text}: token ids {outside[:5]} are outside the model's vocabulary "
                              f"[0, {model.dims.vocab_size}). Fix: tokenize with the model's tokenizer")
    window = min(window, 1 << (model.dims.context.bit_length() - 1))  # padded, a window stays within the context
    trainable = _trainable(model.config)
    sums: list[dict[str, np.ndarray]] = [{} for _ in range(trainable.n_layers)]
    graphs: dict[int, tuple[Graph, dict[int, list[str]]]] = {}  # by padded length: the graph, its linears' inputs
    line = ProgressLine(progress)
    starts = range(0, len(ids), window)
    line.start("importance", len(starts) * trainable.n_layers)
    for start in starts:
        piece = ids[start:start + window]
        seq = max(MIN_LANES["fp16"], 1 << (len(piece) - 1).bit_length())
        if seq not in graphs:
            graph = trainable.layer_graph(seq)
            graphs[seq] = graph, _linear_inputs(graph)
        graph, sources = graphs[seq]
        x = np.asarray(model.embed(piece + [0] * (seq - len(piece)), range(seq)), np.float32)
        for i in range(trainable.n_layers):
            params = {trainable.layer_param(i, k): v for k, v in trainable.layer_params(model.weights, i).items()}
            out = numpy_eval.evaluate(graph, {"x": cpu.to_channels(x), **trainable.layer_inputs(params, i)},
                                      observe=_summing(sources, len(piece), sums[i]))
            x = cpu.from_channels(out["y"])
            line.step(f"layer {i + 1} of tokens {start}-{start + len(piece)}")
    line.finish(f"importance of {trainable.n_layers} layers' linear weights over {len(ids)} tokens ({{seconds}})")
    layers = tuple({name: (v / len(ids)).astype(np.float32) for name, v in layer.items()} for layer in sums)
    return Importance(layers, model.weights.content_hash(model.config), len(ids), text)


def _summing(sources: dict[int, list[str]], lanes: int, into: dict[str, np.ndarray]
             ) -> Callable[[Any, np.ndarray], None]:
    """A ``numpy_eval`` observer adding, per channel, the squares of each linear input of ``sources`` over its first
    ``lanes`` lanes into ``into[weight name]`` (float64)."""
    def observe(node: Any, value: np.ndarray) -> None:
        names = sources.get(id(node), ())
        if names:
            live = value[:, :, 0, :lanes]
            squares = np.einsum("ics,ics->c", live, live, dtype=np.float64)
            for name in names:
                into[name] = into[name] + squares if name in into else squares
    return observe


def attached(model: Any, imatrix: Importance | str | os.PathLike[str] | None) -> Any:
    """``model.weights`` with the importance matrix ``imatrix`` (an :class:`Importance` or the path of one) that
    its quantizer is to use, checked against them (the weights as they are for None). Raises
    :class:`ImportanceError` for a model whose ``quant`` uses none (:data:`orion.quant.IMPORTANCE_MODES`)."""
    if imatrix is None:
        return model.weights
    if model.quant not in IMPORTANCE_MODES:
        raise ImportanceError(f"imatrix={str(imatrix)!r}: quant {model.quant!r} does not use an importance matrix. "
                              f"Fix: pass quant one of {IMPORTANCE_MODES}, or no imatrix")
    importance = imatrix if isinstance(imatrix, Importance) else read(imatrix)
    importance.check(model.config, model.weights)
    return replace(model.weights, importance=importance)


def _trainable(config: Any) -> Any:
    from orion.models.registry import family_of

    return family_of(config).trainable(config)


def _linear_inputs(graph: Graph) -> dict[int, list[str]]:
    """By the id of each value a linear of ``graph`` reads as its ``x``, the input names of those linears' weights
    (several linears may read one ``x``: q, k and v)."""
    sources: dict[int, list[str]] = {}
    for node in graph.nodes:
        if node.op == "linear" and node.inputs[1].op == "input":
            sources.setdefault(id(node.inputs[0]), []).append(node.inputs[1].name)
    return sources
