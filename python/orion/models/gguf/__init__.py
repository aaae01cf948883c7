"""llama.cpp GGUF files: ``orion.models.load("model.gguf")``.

The file's architecture picks the family (``llama`` -- Llama, Mistral, SmolLM, TinyLlama --,
``qwen2`` and ``gpt2``); its metadata gives the config, its tensors are dequantized to float32 (once, into a
copy in the program cache that later starts map; the model then runs in fp16 as any other; ``quant="int8"``
re-quantizes per output channel), and its
``tokenizer.ggml.*`` metadata and chat template give the tokenizer.

llama.cpp's converter stores the q/k rows of ``llama`` models permuted per head so that RoPE rotates
interleaved pairs (Meta's layout); they are loaded in that convention and permuted back to Hugging
Face's rotate-half rows, so a GGUF file and the directory it came from give the same model. A
metadata key that changes the model and is not implemented (RoPE scaling, partial RoPE, experts,
biases where the family has none) is refused by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from orion.generation.tokenizer import TokenizerNotFound
from orion.models.gguf.reader import GGUFError, GGUFFile
from orion.models.weights_io import WeightsSource

ARCHITECTURES = ("llama", "qwen2", "gpt2")


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """GGUF file ``path``, parsed once per file version (the command line checks the architecture and the
    tokenizer before it loads the model, and parsing a large vocabulary takes seconds)."""
    path = Path(path)
    if not path.is_file():
        return GGUFFile(path)  # the error naming the path
    stat = path.stat()
    return _parsed(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=2)
def _parsed(path: str, mtime_ns: int, size: int) -> GGUFFile:
    return GGUFFile(path)


def model_class_of(path: str | os.PathLike[str]) -> type:
    """The Orion class that runs GGUF file ``path`` (by its ``general.architecture``), read without its tensors."""
    return _family(open_gguf(path))[0]


def load_gguf(path: str | os.PathLike[str], **options: Any) -> Any:
    """The model in GGUF file ``path``, with the file's tokenizer and chat template (options: as
    ``from_pretrained``'s, e.g. ``quant``, ``context``, ``progress``)."""
    from orion.models.gguf.tokenizer import gguf_tokenizer  # here: it imports tokenizers (~4 MB resident)

    file = open_gguf(path)
    cls, read = _family(file)
    config, weights = read(file)
    if file.copy is not None:  # the copy's digest names the weights: none are hashed, and their pages are dropped
        weights.source = WeightsSource([file.copy], dict(weights.arrays()))
        weights.source.release_pages()
    try:
        tokenizer, error = gguf_tokenizer(file), None
    except GGUFError as err:
        tokenizer, error = None, TokenizerNotFound(f"{err}")
    # The parse is no longer needed: the model holds its config, weights and tokenizer. Kept, its metadata
    # (SmolLM2-135M: 49,152 token strings and their merges, 8 MiB of Python strings) and its map of the file
    # stayed resident for the process's life.
    del file
    _parsed.cache_clear()
    return cls(config, weights, tokenizer=tokenizer, tokenizer_error=error, **options)


def load_gguf_tokenizer(path: str | os.PathLike[str]) -> Any:
    """Only the tokenizer of GGUF file ``path`` (for checks before the model is built)."""
    from orion.models.gguf.tokenizer import gguf_tokenizer

    return gguf_tokenizer(open_gguf(path))


def _family(file: GGUFFile) -> tuple[type, Callable[[GGUFFile], tuple[Any, Any]]]:
    from orion.models.gguf import families

    readers = {"llama": families.read_llama, "qwen2": families.read_llama, "gpt2": families.read_gpt2}
    if file.architecture not in readers:
        raise GGUFError(f"{file.path}: architecture {file.architecture!r} is not implemented by Orion; its GGUF "
                        f"loader runs {', '.join(ARCHITECTURES)}")
    from orion.models import GPT2, Llama

    return (GPT2 if file.architecture == "gpt2" else Llama), readers[file.architecture]


__all__ = ["ARCHITECTURES", "GGUFError", "GGUFFile", "load_gguf", "load_gguf_tokenizer", "model_class_of", "open_gguf"]
