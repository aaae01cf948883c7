"""Hot-swapped LoRA adapters for :class:`orion.generation.loop.CausalLM` (a mixin it inherits).

Adapters with the same site ranks share one *program variant*: its layer programs (the base graphs
plus one ``orion.lora.graph.adapted`` term per adapted site, A/B as inputs) are compiled when the
first such adapter is loaded (decode) or a prompt length is first seen (prefill), reusing the base
LM-head programs for decode. ``set_adapter(name)`` then only writes that adapter's A/B arrays into
the bound input surfaces in place: no compile, no lowering. ``set_adapter(None)`` goes back to the
base programs themselves, so outputs are the base outputs bit for bit.

KV cache policy: any ``set_adapter`` call empties the KV cache (keys/values computed under another
adapter would mix two models), so the next call must be ``prefill``/``logits``/``generate``;
``decode_step`` raises until then. Forks share the loaded adapters and compiled variants, and each
fork has its own active adapter and surfaces.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from orion.generation.plan import ProgramSet
from orion.lora import peft_format
from orion.lora.adapter import AdapterError, LoraAdapter, Placement, check_fits, site_inputs
from orion.runtime.dtypes import numpy_dtype

if TYPE_CHECKING:
    from orion.generation.loop import CausalLM

VariantKey = tuple[tuple[str, int], ...] | None  # sorted (site, rank); None: the base programs


@dataclass
class _Loaded:
    adapter: LoraAdapter
    key: VariantKey
    inputs: dict[str, np.ndarray]


@dataclass
class _Registry:
    """Loaded adapters and compiled program sets by site ranks, shared by a model and its forks."""

    adapters: dict[str, _Loaded] = field(default_factory=dict)
    variants: dict[VariantKey, ProgramSet] = field(default_factory=dict)


def targeted_modules(targets: Any, paths: Iterable[str], source: str) -> set[str]:
    """Module paths PEFT's ``target_modules`` selects: a name matches a path equal to it or ending in
    ``.name``; a string is a regex matched against the whole path. A name matching nothing is an error."""
    paths = sorted(paths)
    if isinstance(targets, str):
        return {p for p in paths if re.fullmatch(targets, p)}
    chosen: set[str] = set()
    for name in targets:
        hits = {p for p in paths if p == name or p.endswith(f".{name}")}
        if not hits:
            known = ", ".join(sorted({p.rsplit(".", 1)[-1] for p in paths}))
            raise AdapterError(f"{source}: target module '{name}' is no linear of this model (targets: {known}). "
                               f"Fix: use an adapter trained on this base model")
        chosen |= hits
    return chosen


def peft_target_names(modules: Iterable[str], paths: Iterable[str]) -> list[str]:
    """The shortest PEFT ``target_modules`` selecting exactly ``modules``: the last one, two, ... components of
    their paths (``c_attn``, ``attn.c_proj``), the first that selects no other module of the model."""
    modules, paths = set(modules), set(paths)
    for depth in range(1, max(m.count(".") for m in modules) + 1):
        names = sorted({".".join(m.split(".")[-depth:]) for m in modules})
        if targeted_modules(names, paths, "") == modules:
            return names
    return sorted(modules)


class AdapterHost:
    """LoRA adapters of a model: ``load_adapter``, ``add_adapter``, ``set_adapter``, ``save_adapter``.

    A model provides ``lora_placements()`` (module path -> :class:`Placement`), ``peft_fan_in_fan_out``
    and graph hooks taking ``adapters`` (site -> rank, or None for the base graphs). The adapters run through
    the generation loop's public program-set interface: ``base_programs``, ``build_programs`` (an adapter
    variant's programs) and ``use_programs`` (switch to a set, with the adapter's A/B as stage inputs)."""

    peft_fan_in_fan_out: bool = False
    active_adapter: str | None = None

    def lora_placements(self: CausalLM) -> dict[str, Placement]:
        """Every module path an adapter may target and where it lands in the graphs."""
        raise NotImplementedError

    # -- public ---------------------------------------------------------------------------------------
    @property
    def adapters(self: CausalLM) -> list[str]:
        """Names of the loaded adapters."""
        return sorted(self._lora_registry().adapters)

    @property
    def lora_sites(self: CausalLM) -> dict[str, int] | None:
        """The site ranks of the programs in use (None: the base programs)."""
        return self.programs.adapters

    def load_adapter(self: CausalLM, path: str | os.PathLike[str], name: str | None = None) -> str:
        """Load a PEFT LoRA directory under ``name`` (default: the directory's name); returns the name.
        Compiles the decode programs of its variant unless an adapter of the same ranks is loaded."""
        adapter, targets = peft_format.read(path)
        placements = self.lora_placements()
        wanted = targeted_modules(targets, placements, str(path))
        missing = sorted(wanted - set(adapter.modules))
        if missing:
            raise AdapterError(f"{path}: target_modules selects '{missing[0]}' but {peft_format.WEIGHTS_FILE} has no "
                               f"lora_A/lora_B for it ({len(missing)} such modules). Fix: re-save the adapter")
        return self.add_adapter(adapter, name or os.path.basename(os.path.normpath(path)), source=str(path))

    def add_adapter(self: CausalLM, adapter: LoraAdapter, name: str, source: str = "adapter") -> str:
        """Register an in-memory adapter under ``name`` (see ``load_adapter``)."""
        registry = self._lora_registry()
        if name in registry.adapters:
            raise AdapterError(f"{source}: an adapter named '{name}' is loaded already. Fix: pass another name")
        placements = self.lora_placements()
        check_fits(adapter, placements, source)
        ranks, arrays = site_inputs(adapter, placements)
        surface_dtype = numpy_dtype(self.options.io_dtype)  # converted once here, so a switch is a plain copy
        inputs = {input_name: value.astype(surface_dtype) for input_name, value in arrays.items()}
        key: VariantKey = tuple(sorted(ranks.items()))
        if key not in registry.variants:
            registry.variants[key] = self.build_programs(ranks, "add_adapter")
        registry.adapters[name] = _Loaded(adapter, key, inputs)
        return name

    def set_adapter(self: CausalLM, name: str | None) -> None:
        """Make ``name`` the active adapter (None: the base model). Writes its A/B inputs in place (no
        compile) and empties the KV cache."""
        registry = self._lora_registry()
        if name is not None and name not in registry.adapters:
            raise AdapterError(f"set_adapter: no adapter named {name!r} (loaded: {self.adapters}). "
                               f"Fix: load_adapter(path, name) first")
        loaded = registry.adapters.get(name) if name is not None else None
        self.use_programs(registry.variants[None if loaded is None else loaded.key],
                          {} if loaded is None else loaded.inputs, "set_adapter")
        self.active_adapter = name

    def save_adapter(self: CausalLM, path: str | os.PathLike[str], name: str | None = None) -> None:
        """Write adapter ``name`` (default: the active one) as a PEFT LoRA directory that PEFT loads."""
        name = name or self.active_adapter
        registry = self._lora_registry()
        if name not in registry.adapters:
            raise AdapterError(f"save_adapter: no adapter named {name!r} (loaded: {self.adapters}). "
                               f"Fix: name a loaded adapter")
        adapter = registry.adapters[name].adapter
        targets = peft_target_names(adapter.modules, self.lora_placements())
        peft_format.write(path, adapter, targets, self.peft_fan_in_fan_out)

    def loaded_adapters(self: CausalLM) -> dict[str, LoraAdapter]:
        """The loaded adapters by name."""
        return {name: loaded.adapter for name, loaded in self._lora_registry().adapters.items()}

    def detach_adapters(self: CausalLM) -> None:
        """Give this object an empty adapter registry of its own, the base model active: for a copy that runs
        other programs (``with_lanes``), which then adds the adapters again."""
        self.__dict__.pop("_lora", None)
        self.active_adapter = None

    def _lora_registry(self: CausalLM) -> _Registry:
        if "_lora" not in self.__dict__:
            self._lora = _Registry()
            self._lora.variants[None] = self.base_programs
        return self._lora
