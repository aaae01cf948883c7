"""The independent references of the ``reference`` extra (torch, transformers, peft).

Tests that compare with them skip when they are not installed, except under CI (``CI`` set), where a
missing reference is a failure: CI installs the extra, so a skip there would hide a broken comparison.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(*names: str) -> tuple[ModuleType, ...]:
    """Import each named module; skip (or fail under CI) naming the one that is missing."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as missing:
            message = f"needs {name!r} from the reference extra (pip install '.[reference]'): {missing}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message, allow_module_level=True)
    return tuple(modules)


def peft_model(base: str | os.PathLike, adapter, *, fan_in_fan_out: bool = False, dtype: str = "float32"):
    """transformers' model of ``base`` (eager attention, 2 threads) wrapped by peft with ``adapter``'s A and B
    (an :class:`orion.lora.LoraAdapter`); ``fan_in_fan_out`` for GPT-2's Conv1D weights."""
    torch, transformers, peft = require("torch", "transformers", "peft")
    torch.set_num_threads(2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype),
                                                           attn_implementation="eager")
    config = peft.LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                             target_modules=sorted({p.rsplit(".", 1)[-1] for p in adapter.modules}),
                             fan_in_fan_out=fan_in_fan_out)
    tuned = peft.get_peft_model(hf, config)
    with torch.no_grad():
        for path, (a, b) in adapter.modules.items():
            layer = tuned.base_model.model.get_submodule(path)
            layer.lora_A["default"].weight.copy_(torch.tensor(a))
            layer.lora_B["default"].weight.copy_(torch.tensor(b))
    return tuned
