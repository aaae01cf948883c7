"""The independent references of the ``reference`` extra (torch, transformers, peft).

Tests that compare with them skip when they are not installed, except under CI (``CI`` set), where a
missing reference is a failure: CI installs the extra, so a skip there would hide a broken comparison.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np
import pytest

# torch's intra-op threads for every reference computation. The tests' models are small, and torch's OpenMP
# workers spin between ops: beside Orion's own thread pool and CI's background builds on 2 cores, 2 threads
# made tests/lora/test_lora_train.py's PEFT tests take 134-151 s against 48-52 s at 1 thread, and
# tests/models/test_families.py (published widths up to 3,072) 141 s against 106 s (load 5-8).
TORCH_THREADS = 1


def require(*names: str) -> tuple[ModuleType, ...]:
    """Import each named module; skip (or fail under CI) naming the one that is missing."""
    modules = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as missing:
            message = f"needs {name!r} from the reference extra (pip install '.[reference]'): {missing}"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message, allow_module_level=True)
        if name == "torch":
            module.set_num_threads(TORCH_THREADS)
        modules.append(module)
    return tuple(modules)


def peft_model(base: str | os.PathLike, adapter, *, fan_in_fan_out: bool = False, dtype: str = "float32"):
    """transformers' model of ``base`` (eager attention) wrapped by peft with ``adapter``'s A and B
    (an :class:`orion.lora.LoraAdapter`); ``fan_in_fan_out`` for GPT-2's Conv1D weights."""
    torch, transformers, peft = require("torch", "transformers", "peft")
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


def greedy_follows(last_logits: Callable[[list[int]], np.ndarray], ids: Sequence[int], got: Sequence[int],
                   tolerance: float) -> int:
    """Checks that each of Orion's greedy tokens ``got`` is the reference's argmax given the tokens before it
    (``last_logits(seq)``: the reference's logits of the last position of ``seq``), or, at a near-tie, a token whose
    reference logit is within ``tolerance`` x the largest |logit| of the top one (fp16 decides ties the fp32
    reference breaks the other way). Returns how many steps were such ties."""
    ties, seq = 0, [int(i) for i in ids]
    for step, token in enumerate(got):
        logits = last_logits(seq)
        if token != int(np.argmax(logits)):
            margin = float(logits.max() - logits[token])
            assert margin <= tolerance * float(np.abs(logits).max()), (
                f"step {step}: Orion chose {token} (reference logit {logits[token]:.4f}), the reference "
                f"{int(np.argmax(logits))} ({logits.max():.4f}): not a near-tie")
            ties += 1
        seq.append(int(token))
    return ties
