"""A LoRA adapter and where it lands in a model's graphs.

An adapter holds, per Hugging Face module path (``transformer.h.0.attn.c_attn``,
``model.layers.0.self_attn.q_proj``), ``A`` ``[r, in]`` and ``B`` ``[out, r]`` as PEFT stores them, plus
``alpha`` (scale ``alpha / r``, or ``alpha / sqrt(r)`` with rsLoRA). A model describes each module it
can adapt by a :class:`Placement` on a :class:`Site` of its graphs; :func:`site_inputs` turns an
adapter into the site ranks of its program variant and the A/B input arrays (scale folded into B),
stacking the modules fused in one site along the rank (a block-diagonal B: the blocks that are zero
add exact zeros).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from orion.errors import OrionError
from orion.lora.graph import a_input, b_input


class AdapterError(OrionError, ValueError):
    """An adapter that does not fit the model, or an adapter file that cannot be read."""


@dataclass(frozen=True)
class Site:
    """A baked linear of the graphs: its name (unique in the model), output width and input piece widths."""

    name: str
    out: int
    ins: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Placement:
    """One module's place on a site: the site output ``rows`` it fills, taken from the module's output rows
    ``src_rows`` (None: in order), and per site input piece the module input columns it carries (None: all)."""

    site: Site
    in_features: int
    out_features: int
    rows: slice
    src_rows: np.ndarray | None = None
    cols: tuple[np.ndarray | None, ...] = (None,)


@dataclass(frozen=True, eq=False)
class LayerTarget:
    """A Hugging Face module as a training layer graph (``orion.autodiff``'s trainables) computes it: the layer
    parameters ``grid[k][j]`` that make output block ``k`` from input piece ``j`` (their outputs stacked give the
    module's rows, their inputs side by side its columns), the graph site of its LoRA inputs, and PEFT's layout
    as in :class:`Placement`: graph row ``t`` is the module's row ``src_rows[t]`` (None: in order), input piece
    ``j`` carries the module's input columns ``cols[j]`` (None: all)."""

    site: str
    grid: tuple[tuple[str, ...], ...]
    src_rows: np.ndarray | None = None
    cols: tuple[np.ndarray | None, ...] = (None,)


@dataclass
class LoraAdapter:
    """LoRA matrices by module path: ``modules[path] = (A [r, in], B [out, r])`` float32."""

    r: int
    alpha: float
    modules: dict[str, tuple[np.ndarray, np.ndarray]]
    base_model_name_or_path: str | None = None
    use_rslora: bool = False
    extra_config: dict = field(default_factory=dict)  # other adapter_config.json keys, written back unchanged

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.r) if self.use_rslora else self.r)


def check_fits(adapter: LoraAdapter, placements: Mapping[str, Placement], source: str) -> None:
    """Raises :class:`AdapterError` naming the module and the shapes when ``adapter`` does not fit."""
    if not adapter.modules:
        raise AdapterError(f"{source}: the adapter has no LoRA tensors. Fix: save an adapter with at least one module")
    for path, (a, b) in sorted(adapter.modules.items()):
        p = placements.get(path)
        if p is None:
            known = ", ".join(sorted({k.rsplit(".", 1)[-1] for k in placements}))
            raise AdapterError(f"{source}: module '{path}' is not a linear this model can adapt (targets: {known}). "
                               f"Fix: use an adapter trained on this base model")
        want_a, want_b = (adapter.r, p.in_features), (p.out_features, adapter.r)
        if a.shape != want_a or b.shape != want_b:
            raise AdapterError(f"{source}: module '{path}': lora_A is {list(a.shape)} and lora_B {list(b.shape)}, "
                               f"this model needs {list(want_a)} and {list(want_b)} (r={adapter.r}, "
                               f"in={p.in_features}, out={p.out_features}). Fix: check the rank in adapter_config.json "
                               f"and that the adapter was trained on this base model")
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise AdapterError(f"{source}: module '{path}': lora_A or lora_B holds NaN or inf. Fix: re-export it")


def site_inputs(adapter: LoraAdapter, placements: Mapping[str, Placement]) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """The site ranks of ``adapter``'s program variant and its graph input arrays (``[1, C, 1, S]`` float32)."""
    by_site: dict[str, list[str]] = {}
    for path in sorted(adapter.modules):
        by_site.setdefault(placements[path].site.name, []).append(path)
    ranks, arrays = {}, {}
    for name, paths in by_site.items():
        site = placements[paths[0]].site
        rank = sum(adapter.modules[p][0].shape[0] for p in paths)
        a_parts = [np.zeros((rank, width), np.float32) for width in site.ins]
        b_full = np.zeros((site.out, rank), np.float32)
        offset = 0
        for path in paths:
            p, (a, b) = placements[path], adapter.modules[path]
            block = slice(offset, offset + a.shape[0])
            for j, cols in enumerate(p.cols):
                a_parts[j][block] = a if cols is None else a[:, cols]
            b_full[p.rows, block] = adapter.scale * (b if p.src_rows is None else b[p.src_rows])
            offset = block.stop
        ranks[name] = rank
        for j, part in enumerate(a_parts):
            arrays[a_input(name, j)] = part.reshape(1, rank, 1, part.shape[1])
        arrays[b_input(name)] = b_full.reshape(1, site.out, 1, rank)
    return ranks, arrays
