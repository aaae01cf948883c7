"""LoRA fine-tuning: :class:`LoraTrainable`, a :class:`~orion.autodiff.trainable.TrainableModel` whose parameters
are only the adapters' A and B, over a frozen base model.

The layer graph is the base trainable's with :func:`orion.lora.graph.adapted` on each targeted module (its
``lora_targets()``), ``scale = alpha / r`` in the graph so the parameter is PEFT's unscaled B. The base
weights stay out of the parameters: the optimizer, the gradients and the checkpoints see only the adapters.
Parameters are held in the graph's layout (rows and columns permuted as the model's ``LayerTarget``s say,
one A per input piece); :func:`to_adapter` and :func:`from_adapter` convert to and from PEFT's
``[r, in]`` / ``[out, r]`` in Hugging Face order (an elementwise optimizer is indifferent to the permutation).
Initialization is PEFT's default: A kaiming-uniform (``a = sqrt(5)``, i.e. U(+-1/sqrt(in))), B zero, so
the untrained adapter is the base model. :func:`merge` folds an adapter into the base parameters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from orion.autodiff.trainable import TrainableModel, input_layout
from orion.graph.builder import Graph
from orion.lora import peft_format
from orion.lora.adapter import AdapterError, LayerTarget, LoraAdapter
from orion.lora.graph import a_input, b_input
from orion.lora.hot_swap import peft_target_names, targeted_modules

_NUMBERS = {"r": ("r", int), "alpha": ("alpha", float), "dropout": ("dropout", float)}  # --lora key: field, type


@dataclass(frozen=True)
class LoraSpec:
    """What to fine-tune: rank, alpha, target modules (short names of the model's ``lora_aliases`` or PEFT module names)."""

    r: int = 16
    alpha: float = 32.0
    targets: tuple[str, ...] = ("q", "v")
    dropout: float = 0.0
    use_rslora: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise AdapterError(f"LoRA r={self.r!r} must be an integer >= 1")
        if not self.alpha > 0:
            raise AdapterError(f"LoRA alpha={self.alpha!r} must be > 0")
        if not self.targets:
            raise AdapterError("LoRA targets are empty. Fix: name at least one module, e.g. targets=q,v")
        if self.dropout != 0:
            raise AdapterError(f"LoRA dropout={self.dropout}: only 0 is implemented (the graphs have no random "
                               "masks). Fix: pass dropout=0")

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)

    @classmethod
    def parse(cls, text: str) -> LoraSpec:
        """``r=16,alpha=32,targets=q,v[,dropout=0][,rslora=1]``: a bare word after ``targets=`` is one more
        target."""
        fields: dict[str, object] = {}
        targets: list[str] = []
        key = None
        for item in (t.strip() for t in text.split(",")):
            name, eq, value = item.partition("=")
            if not eq:
                if key != "targets" or not name:
                    raise AdapterError(f"--lora {text!r}: {item!r} is not KEY=VALUE. Fix: write e.g. "
                                       "r=16,alpha=32,targets=q,v")
                targets.append(name)
                continue
            key = name
            if name == "targets":
                targets.append(value)
            elif name == "rslora":
                fields["use_rslora"] = value.lower() in ("1", "true", "yes")
            elif name in _NUMBERS:
                try:
                    fields[_NUMBERS[name][0]] = _NUMBERS[name][1](value)
                except ValueError:
                    raise AdapterError(f"--lora {text!r}: {name}={value!r} is not a number") from None
            else:
                raise AdapterError(f"--lora {text!r}: unknown key {name!r}. Fix: use r, alpha, targets, dropout, "
                                   "rslora")
        if targets:
            fields["targets"] = tuple(targets)
        return cls(**fields)  # type: ignore[arg-type]


def modules_of(base: TrainableModel, targets: tuple[str, ...] | list[str]) -> list[str]:
    """The layer modules (relative to a layer, e.g. ``self_attn.q_proj``) that ``targets`` selects."""
    aliases = base.lora_aliases
    names = sorted({aliases.get(t, t) for t in targets})
    try:
        chosen = targeted_modules(names, base.lora_targets(), "--lora targets")
    except AdapterError as exc:
        raise AdapterError(f"{str(exc).split('. Fix:')[0]}; short names for {base.name}: {', '.join(aliases)}. "
                           "Fix: name modules this model has") from None
    if not chosen:
        raise AdapterError(f"--lora targets {targets!r} select no module of {base.name}. Fix: name modules this model "
                           f"has ({', '.join(base.lora_targets())})")
    return sorted(chosen)


def module_path(base: TrainableModel, layer: int, module: str) -> str:
    """The Hugging Face module path of ``module`` in layer ``layer``."""
    return f"{base.hf_layer_prefix}{layer}.{module}"


def _pieces(base: TrainableModel, target: LayerTarget) -> tuple[list[int], list[int]]:
    """Row heights of the output blocks and column widths of the input pieces of ``target``."""
    shapes = base.layer_shapes()
    return [shapes[row[0]][0] for row in target.grid], [shapes[name][1] for name in target.grid[0]]


class LoraTrainable(TrainableModel):
    """``base`` with LoRA adapters of ``spec`` on ``modules`` of every layer; ``base_params`` are frozen."""

    def __init__(self, base: TrainableModel, base_params: dict[str, np.ndarray], spec: LoraSpec,
                 modules: list[str]) -> None:
        self.base, self.base_params, self.spec, self.modules = base, base_params, spec, modules
        self.config = base.config
        self.name = f"{base.name}-lora"
        self.n_layers, self.dim, self.vocab_size, self.context = base.n_layers, base.dim, base.vocab_size, base.context
        self.layer_prefix, self.attention_per_layer = base.layer_prefix, base.attention_per_layer
        self.targets = {m: base.lora_targets()[m] for m in modules}

    def adapter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per targeted module: one A ``[r, width]`` per input piece and B ``[out, r]`` (graph input names)."""
        shapes: dict[str, tuple[int, ...]] = {}
        r = self.spec.r
        for t in self.targets.values():
            heights, widths = _pieces(self.base, t)
            shapes.update({a_input(t.site, j): (r, w) for j, w in enumerate(widths)})
            shapes[b_input(t.site)] = (sum(heights), r)
        return shapes

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every input of the layer graph: the base's (frozen) and the adapters' (trained)."""
        return self.base.layer_shapes() | self.adapter_shapes()

    def layer_params(self, weights: Any, layer: int) -> dict[str, np.ndarray]:
        """The base model's parameters of ``weights`` (the adapters are not in them)."""
        return self.base.layer_params(weights, layer)

    def layer_graph(self, seq: int) -> Graph:
        return self.base.layer_graph(seq, {t.site: self.spec.r for t in self.targets.values()}, self.spec.scale)

    def layer_inputs(self, params: dict[str, np.ndarray], layer: int) -> dict[str, np.ndarray]:
        """The frozen base weights of layer ``layer`` and the adapters' A and B (``params``)."""
        adapters = {name: input_layout(params[self.layer_param(layer, name)]) for name in self.adapter_shapes()}
        return self.base.layer_inputs(self.base_params, layer) | adapters

    def runner_options(self) -> dict[str, object]:
        """``GradientRunner`` options: gradients for the adapters only, the base weights baked per layer."""
        return {"trainable": list(self.adapter_shapes()), "baked": list(self.base.layer_shapes()),
                "params": self.base_params}

    def embed(self, params: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        return self.base.embed(self.base_params, ids)

    def embed_backward(self, params: dict[str, np.ndarray], ids: np.ndarray, dx: np.ndarray,
                       into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return {}  # the embedding is frozen

    def head(self, params: dict[str, np.ndarray], x: np.ndarray, targets: np.ndarray, frozen: bool = True,
             into: dict[str, np.ndarray] | None = None) -> tuple[float, np.ndarray, dict[str, np.ndarray]]:
        """The base's head, frozen: only dL/dx flows on (no classifier or norm gradient is computed)."""
        return self.base.head(self.base_params, x, targets, frozen=True)

    # -- PEFT's layout ---------------------------------------------------------------------------------
    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        """PEFT's default initialization from ``seed``: A ~ U(+-1/sqrt(in)) (kaiming-uniform, a=sqrt(5)), B = 0."""
        rng = np.random.default_rng(seed)
        modules = {}
        for i in range(self.n_layers):
            for module in self.modules:
                heights, widths = _pieces(self.base, self.targets[module])
                bound = 1.0 / math.sqrt(sum(widths))
                a = rng.uniform(-bound, bound, (self.spec.r, sum(widths))).astype(np.float32)
                modules[module_path(self.base, i, module)] = (a, np.zeros((sum(heights), self.spec.r), np.float32))
        return self.from_adapter(self.adapter_of(modules))

    def adapter_of(self, modules: dict[str, tuple[np.ndarray, np.ndarray]], name: str | None = None) -> LoraAdapter:
        """A :class:`LoraAdapter` of this spec holding ``modules`` (PEFT layout)."""
        return LoraAdapter(self.spec.r, self.spec.alpha, modules, name, self.spec.use_rslora)

    def from_adapter(self, adapter: LoraAdapter) -> dict[str, np.ndarray]:
        """The parameters (graph layout) of ``adapter``, which must cover exactly this model's modules."""
        want = {module_path(self.base, i, m) for i in range(self.n_layers) for m in self.modules}
        if set(adapter.modules) != want:
            extra, missing = sorted(set(adapter.modules) - want), sorted(want - set(adapter.modules))
            raise AdapterError(f"the adapter's modules differ from this run's targets (extra {extra[:3]}, missing "
                               f"{missing[:3]}). Fix: use the same targets")
        params = {}
        for i in range(self.n_layers):
            for module in self.modules:
                t = self.targets[module]
                a, b = adapter.modules[module_path(self.base, i, module)]
                for j, a_piece in enumerate(_a_pieces(self.base, t, a)):
                    params[self.layer_param(i, a_input(t.site, j))] = np.ascontiguousarray(a_piece, np.float32)
                b_graph = b if t.src_rows is None else b[t.src_rows]
                params[self.layer_param(i, b_input(t.site))] = np.ascontiguousarray(b_graph, np.float32)
        return params

    def to_adapter(self, params: dict[str, np.ndarray], name: str | None = None) -> LoraAdapter:
        """The inverse of :meth:`from_adapter`: PEFT-layout A ``[r, in]`` and B ``[out, r]`` per module path."""
        modules = {}
        for i in range(self.n_layers):
            for module in self.modules:
                t = self.targets[module]
                heights, widths = _pieces(self.base, t)
                a = np.zeros((self.spec.r, sum(widths)), np.float32)
                start = 0
                for j, cols in enumerate(t.cols):
                    piece = params[self.layer_param(i, a_input(t.site, j))]
                    a[:, slice(start, start + widths[j]) if cols is None else cols] = piece
                    start += widths[j]
                b_graph = params[self.layer_param(i, b_input(t.site))]
                b = np.array(b_graph, np.float32)
                if t.src_rows is not None:
                    b[t.src_rows] = b_graph
                modules[module_path(self.base, i, module)] = (a, b)
        return self.adapter_of(modules, name)

    def save_peft(self, path: str, params: dict[str, np.ndarray], base_name: str | None = None) -> None:
        """Writes the adapters as a PEFT LoRA directory (``model.load_adapter`` and ``peft`` read it)."""
        adapter = self.to_adapter(params, base_name)
        every = [module_path(self.base, i, m) for i in range(self.n_layers) for m in self.base.lora_targets()]
        peft_format.write(path, adapter, peft_target_names(adapter.modules, every), self.base.peft_fan_in_fan_out)


def _a_pieces(base: TrainableModel, target: LayerTarget, a: np.ndarray) -> list[np.ndarray]:
    """PEFT's A ``[r, in]`` cut into the graph's input pieces."""
    _, widths = _pieces(base, target)
    bounds = np.cumsum([0, *widths])
    return [a[:, bounds[j]:bounds[j + 1]] if cols is None else a[:, cols] for j, cols in enumerate(target.cols)]


def read_adapter(base: TrainableModel, path: str) -> tuple[LoraAdapter, list[str]]:
    """A PEFT adapter directory for ``base``: the adapter and the layer modules it adapts (checked to be the
    same in every layer and to have the shapes this model needs)."""
    adapter, _ = peft_format.read(path)
    pattern = re.compile(rf"^{re.escape(base.hf_layer_prefix)}(\d+)\.(.+)$")
    modules: set[str] = set()
    for module_path_ in adapter.modules:
        match = pattern.match(module_path_)
        if match is None or int(match[1]) >= base.n_layers or match[2] not in base.lora_targets():
            raise AdapterError(f"{path}: module '{module_path_}' is not a linear this model can adapt (targets: "
                               f"{', '.join(base.lora_targets())} of layers {base.hf_layer_prefix}0..{base.n_layers - 1})."
                               " Fix: use an adapter trained on this base model")
        modules.add(match[2])
    spec = LoraSpec(adapter.r, adapter.alpha, tuple(sorted(modules)), use_rslora=adapter.use_rslora)
    model = LoraTrainable(base, {}, spec, sorted(modules))
    for module_path_, (a, b) in sorted(adapter.modules.items()):
        module = pattern.match(module_path_)[2]  # type: ignore[index]
        heights, widths = _pieces(base, model.targets[module])
        if a.shape != (adapter.r, sum(widths)) or b.shape != (sum(heights), adapter.r):
            raise AdapterError(f"{path}: module '{module_path_}': lora_A is {list(a.shape)} and lora_B {list(b.shape)}"
                               f", this model needs {[adapter.r, sum(widths)]} and {[sum(heights), adapter.r]}. Fix: "
                               "check the rank in adapter_config.json and that the adapter was trained on this base")
    model.from_adapter(adapter)  # every layer present
    return adapter, sorted(modules)


def merge(base: TrainableModel, base_params: dict[str, np.ndarray], adapter: LoraAdapter, modules: list[str]
          ) -> dict[str, np.ndarray]:
    """``base_params`` with ``W + scale * B A`` for every adapted module (new arrays; the base is untouched)."""
    spec = LoraSpec(adapter.r, adapter.alpha, tuple(modules), use_rslora=adapter.use_rslora)
    model = LoraTrainable(base, base_params, spec, modules)
    params = model.from_adapter(adapter)
    merged = dict(base_params)
    for i in range(base.n_layers):
        for module in modules:
            t = model.targets[module]
            heights, _ = _pieces(base, t)
            b = params[base.layer_param(i, b_input(t.site))]
            rows = np.cumsum([0, *heights])
            for k, row in enumerate(t.grid):
                for j, weight in enumerate(row):
                    a = params[base.layer_param(i, a_input(t.site, j))]
                    key = base.layer_param(i, weight)
                    delta = (b[rows[k]:rows[k + 1]].astype(np.float64) @ a.astype(np.float64)) * spec.scale
                    merged[key] = (merged[key].astype(np.float64) + delta).astype(np.float32)
    return merged
