"""Hugging Face PEFT's LoRA format: ``adapter_config.json`` and ``adapter_model.safetensors`` whose tensors are
``base_model.model.<module path>.lora_A.weight`` ``[r, in]`` and ``...lora_B.weight`` ``[out, r]``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from orion.lora.adapter import AdapterError, LoraAdapter

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
SUFFIXES = {".lora_A.weight": 0, ".lora_B.weight": 1}
# adapter_config.json keys whose non-default values change the computation in ways Orion does not run
_UNSUPPORTED = {"use_dora": False, "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None,
                "layers_to_transform": None, "bias": "none", "lora_bias": False}


def read(path: str | os.PathLike[str]) -> tuple[LoraAdapter, Any]:
    """The adapter in directory ``path`` and its ``target_modules`` (a list of names, or a regex string)."""
    directory = Path(path)
    config_file, weights_file = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for file in (config_file, weights_file):
        if not file.is_file():
            raise AdapterError(f"{file}: not found. Fix: give a PEFT adapter directory ({CONFIG_FILE} + {WEIGHTS_FILE})")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{config_file}: not valid JSON ({exc}). Fix: re-save the adapter") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{config_file}: peft_type {config.get('peft_type') if isinstance(config, dict) else None!r}"
                           f" is not LORA. Fix: give a LoRA adapter")
    for key, default in _UNSUPPORTED.items():
        if config.get(key, default) not in (default, None, [], {}):
            raise AdapterError(f"{config_file}: {key}={config[key]!r} is not supported by Orion. Fix: use a plain "
                               f"LoRA adapter ({key}={default!r})")
    try:
        r, alpha = int(config["r"]), float(config["lora_alpha"])
        targets = config["target_modules"]
    except (KeyError, TypeError, ValueError) as exc:
        raise AdapterError(f"{config_file}: needs r, lora_alpha and target_modules ({exc}). Fix: re-save the adapter") \
            from exc
    try:
        tensors = load_file(str(weights_file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise AdapterError(f"{weights_file}: not a readable safetensors file ({exc}). Fix: re-save the adapter") \
            from exc
    pairs: dict[str, list[np.ndarray | None]] = {}
    for name, value in tensors.items():
        suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
        if not name.startswith(PREFIX) or suffix is None:
            raise AdapterError(f"{weights_file}: tensor '{name}' is not a LoRA A/B weight "
                               f"('{PREFIX}<module>.lora_A.weight'). Fix: give a plain LoRA adapter")
        module = name[len(PREFIX):-len(suffix)]
        pairs.setdefault(module, [None, None])[SUFFIXES[suffix]] = np.asarray(value, np.float32)
    modules = {}
    for module, (a, b) in pairs.items():
        if a is None or b is None:
            raise AdapterError(f"{weights_file}: module '{module}' has lora_{'A' if a is None else 'B'}.weight "
                               f"missing. Fix: re-save the adapter")
        modules[module] = (a, b)
    known = {"r", "lora_alpha", "target_modules", "base_model_name_or_path", "use_rslora", *_UNSUPPORTED}
    adapter = LoraAdapter(r, alpha, modules, config.get("base_model_name_or_path"),
                          bool(config.get("use_rslora", False)),
                          {k: v for k, v in config.items() if k not in known})
    return adapter, targets


def write(path: str | os.PathLike[str], adapter: LoraAdapter, target_modules: list[str],
          fan_in_fan_out: bool) -> None:
    """Writes ``adapter`` as a PEFT LoRA directory (float32 tensors)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "inference_mode": True} | adapter.extra_config
    config |= {"r": adapter.r, "lora_alpha": adapter.alpha, "target_modules": target_modules,
               "base_model_name_or_path": adapter.base_model_name_or_path, "fan_in_fan_out": fan_in_fan_out,
               "use_rslora": adapter.use_rslora, "lora_dropout": config.get("lora_dropout", 0.0),
               "bias": "none", "use_dora": False}
    tensors = {}
    for module, (a, b) in adapter.modules.items():
        tensors[f"{PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(a, np.float32)
        tensors[f"{PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(b, np.float32)
    save_file(tensors, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
