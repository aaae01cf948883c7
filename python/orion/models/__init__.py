"""Models written with Orion's graph compiler, and the registry that picks one for a directory:
``orion.models.load(path)`` (by ``config.json``'s ``model_type``, a llama2.c ``.bin`` file or a llama.cpp
``.gguf`` file) or
``orion.models.random("gpt2")`` / ``random("stories110m")``."""

from orion.models import phi3, qwen3, smollm3
from orion.models.gemma import Gemma, GemmaConfig
from orion.models.gemma import weights as gemma_weights
from orion.models.gemma.trainable import GemmaTrainable
from orion.models.gguf import load_gguf, load_gguf_tokenizer, model_class_of
from orion.models.gpt2 import GPT2, GPT2Config
from orion.models.gpt2 import weights as gpt2_weights
from orion.models.gpt2.trainable import GPT2Trainable
from orion.models.llama import Llama, LlamaConfig
from orion.models.llama import weights as llama_weights
from orion.models.llama.trainable import LlamaTrainable
from orion.models.registry import (
    Family,
    UnknownModel,
    UnknownOption,
    context_length,
    family,
    family_of,
    file_suffixes,
    load,
    load_tokenizer,
    model_class,
    model_types,
    random,
    register,
    register_file_format,
    register_shape,
    save_random,
    shape_names,
)

register(GPT2, GPT2Config, GPT2Trainable, gpt2_weights)
register_shape("gpt2", GPT2Config())
register_shape("124m", GPT2Config())
register(Llama, LlamaConfig, LlamaTrainable, llama_weights, ("llama", "qwen2", "mistral"))
register(Llama, LlamaConfig, LlamaTrainable, llama_weights, (qwen3.MODEL_TYPE,))
register(Llama, LlamaConfig, LlamaTrainable, llama_weights, (smollm3.MODEL_TYPE,))
register(Llama, LlamaConfig, LlamaTrainable, llama_weights, (phi3.MODEL_TYPE,))
register(Gemma, GemmaConfig, GemmaTrainable, gemma_weights, ("gemma2", "gemma3_text"))
register_file_format(".bin", Llama.from_llama2c)
register_file_format(".gguf", load_gguf, model_class_of, load_gguf_tokenizer)
register_shape("stories110m", LlamaConfig.stories110m())

__all__ = ["GPT2", "GPT2Config", "Family", "Gemma", "GemmaConfig", "Llama", "LlamaConfig", "UnknownModel", "UnknownOption",
           "context_length", "family",
           "family_of", "file_suffixes", "load", "load_tokenizer", "model_class", "model_types", "random", "register",
           "register_file_format", "register_shape", "save_random", "shape_names"]
