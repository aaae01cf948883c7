"""Llama-family models (Llama, Qwen2, Mistral, llama2.c's Stories) on Orion: config, weights, graphs, model."""

from orion.models.llama.config import LlamaConfig
from orion.models.llama.model import Llama

__all__ = ["Llama", "LlamaConfig"]
