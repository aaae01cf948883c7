"""Models written with Orion's graph compiler, and the registry that picks one for a directory:
``orion.models.load(path)`` (by ``config.json``'s ``model_type``) or ``orion.models.random("gpt2")``."""

from orion.models.gpt2 import GPT2, GPT2Config
from orion.models.registry import (
    UnknownModel,
    context_length,
    load,
    model_types,
    random,
    register,
    register_shape,
    shape_names,
)

register(GPT2, GPT2Config)
register_shape("gpt2", GPT2Config())
register_shape("124m", GPT2Config())

__all__ = ["GPT2", "GPT2Config", "UnknownModel", "context_length", "load", "model_types", "random", "register",
           "register_shape", "shape_names"]
