"""Gemma 2 and Gemma 3 (text) on Orion (``orion.models.gemma.graphs`` for what is Gemma's own)."""

from orion.models.gemma.config import GemmaConfig
from orion.models.gemma.model import Gemma

__all__ = ["Gemma", "GemmaConfig"]
