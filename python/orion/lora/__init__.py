"""LoRA adapters as program inputs: ``y = W x + (alpha / r) B (A x)`` with W baked and A, B runtime inputs.

- ``orion.lora.graph``: the graph-level helper every model's graph builder calls (``adapted``).
- ``orion.lora.adapter``: an adapter (PEFT module path -> A, B) and how it lands on a model's graph sites.
- ``orion.lora.peft_format``: PEFT's ``adapter_config.json`` + ``adapter_model.safetensors``, in and out.
- ``orion.lora.hot_swap``: ``load_adapter`` / ``set_adapter`` / ``save_adapter`` of ``CausalLM``.
- ``orion.lora.train``: LoRA fine-tuning (``LoraTrainable``: only A/B are parameters), ``merge``.
- ``orion.lora.cli``: ``python -m orion lora merge BASE ADAPTER OUT``.
"""

from orion.lora.adapter import AdapterError, LoraAdapter, Placement, Site

__all__ = ["AdapterError", "LoraAdapter", "Placement", "Site"]
