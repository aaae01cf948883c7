"""SmolLM3 (``model_type`` ``smollm3``): the Llama layer with RoPE skipped on some layers (``no_rope_layers``,
every fourth by default). The model, its trainable, LoRA and weights are the Llama family's
(``orion.models.llama``, whose layer takes no rope on the layers ``LlamaConfig.no_rope_layers`` names); this
folder is how a SmolLM3 ``config.json`` reads (:mod:`orion.models.smollm3.config`)."""

from orion.models.smollm3.config import MODEL_TYPE, VARIANT

__all__ = ["MODEL_TYPE", "VARIANT"]
