"""GPT-2 (any GPT-2-family size) on Orion: config, weight layout, graphs and cost formulas."""

from orion.models.gpt2.config import GPT2Config
from orion.models.gpt2.model import GPT2

__all__ = ["GPT2", "GPT2Config"]
