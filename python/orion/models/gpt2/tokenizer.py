"""Text in/out for GPT-2: a Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import tokenizers

from orion.errors import OrionError

TOKENIZER_FILE = "tokenizer.json"
EOS_TOKEN = "<|endoftext|>"


class TokenizerError(OrionError):
    """A tokenizer cannot be loaded."""


class TokenizerNotFound(TokenizerError, FileNotFoundError):
    """A model directory has no ``tokenizer.json``."""


class Tokenizer:
    """Encodes text to GPT-2 token ids and back; ``eos_token_id`` is None if the vocabulary lacks one."""

    def __init__(self, backend: tokenizers.Tokenizer, path: Path) -> None:
        self._backend = backend
        self.path = path
        self.eos_token_id: int | None = backend.token_to_id(EOS_TOKEN)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens included as written."""
        return self._backend.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(directory: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer in ``directory/tokenizer.json``; raises :class:`TokenizerNotFound` without one."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerNotFound(
            f"{Path(directory)}: no {TOKENIZER_FILE}; text in/out needs the Hugging Face {TOKENIZER_FILE} "
            f"next to the weights (copy it from the model's repository), while token ids work without one"
        )
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for malformed files
        raise TokenizerError(f"{path}: not a valid Hugging Face tokenizer file ({exc})") from exc
    return Tokenizer(backend, path)
