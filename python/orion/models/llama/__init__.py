"""Llama-family models (Llama, Qwen2, Mistral, llama2.c's Stories) on Orion: configuration, weights, graphs."""

from orion.models.llama.config import LlamaConfig

__all__ = ["LlamaConfig"]
