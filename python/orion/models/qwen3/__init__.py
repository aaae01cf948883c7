"""Qwen3 (``model_type`` ``qwen3``): the Llama layer with each query and key head RMS-normalized before RoPE,
an explicit ``head_dim``, no biases. The model, its trainable, LoRA and weights are the Llama family's
(``orion.models.llama``, whose layer reads ``q_norm``/``k_norm`` when ``LlamaConfig.qk_norm``); this folder
is how a Qwen3 ``config.json`` reads (:mod:`orion.models.qwen3.config`)."""

from orion.models.qwen3.config import MODEL_TYPE, VARIANT

__all__ = ["MODEL_TYPE", "VARIANT"]
