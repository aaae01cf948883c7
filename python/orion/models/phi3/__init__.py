"""Phi-3, Phi-3.5 and Phi-4-mini (``model_type`` ``phi3``): the Llama layer with RoPE on part of each head
(``partial_rotary_factor``) and longrope scaling, its checkpoints storing q/k/v as one ``qkv_proj`` and
gate/up as one ``gate_up_proj`` (split at load, fused again by ``save_hf``; LoRA targets those modules).
The model, its trainable, LoRA and weights are the Llama family's (``orion.models.llama``); this folder is
how a Phi-3 ``config.json`` reads (:mod:`orion.models.phi3.config`)."""

from orion.models.phi3.config import MODEL_TYPE, VARIANT

__all__ = ["MODEL_TYPE", "VARIANT"]
