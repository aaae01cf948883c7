"""Models written with Orion's graph compiler."""

from orion.models.gpt2 import GPT2, GPT2Config

__all__ = ["GPT2", "GPT2Config"]
