"""Text in/out: a Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library, with the
special tokens the model's own files name.

End-of-sequence ids come from ``generation_config.json``, else ``config.json`` (``eos_token_id``,
an id or a list of ids), else ``tokenizer_config.json`` (``eos_token``, a token string looked up in
the vocabulary). The beginning-of-sequence token is found the same way, and ``encode`` prepends it
when ``tokenizer_config.json`` says ``add_bos_token`` (when no file says, when ``tokenizer.json``'s
post-processor would). The directory's chat template (``chat_template.jinja``, ``chat_template.json`` or
``tokenizer_config.json``'s ``chat_template``: :func:`orion.generation.chat.read_chat_template`) formats chats.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orion.errors import OrionError
from orion.generation.chat import CHAT_TEMPLATE_FILE, ChatTemplate, read_chat_template
from orion.generation.hf_files import CONFIG_FILE, read_optional

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

if TYPE_CHECKING:
    import tokenizers


class TokenizerError(OrionError):
    """A tokenizer cannot be loaded."""


class TokenizerNotFound(TokenizerError, FileNotFoundError):
    """A model directory has no ``tokenizer.json``."""


class Tokenizer:
    """Encodes text to token ids and back.

    ``eos_token_ids``: every id that ends a generation (empty if the model's files name none);
    ``eos_token_id`` is the first or None. ``bos_token_id`` is None without one."""

    def __init__(self, backend: tokenizers.Tokenizer, path: Path, *, eos_token_ids: tuple[int, ...] = (),
                 bos_token_id: int | None = None, add_bos: bool = False,
                 chat_template: ChatTemplate | None = None) -> None:
        self._backend = backend
        self.path = path
        self.eos_token_ids = eos_token_ids
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos and bos_token_id is not None
        self.chat_template = chat_template

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``: the BOS id first when the model's files ask for it (and
        ``add_special_tokens``), no other special tokens."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode needs a str, got {type(text).__name__}")
        try:
            ids = self._backend.encode(text, add_special_tokens=False).ids
        except Exception as exc:  # tokenizers raises a bare Exception (e.g. no unknown token)
            raise TokenizerError(f"{self.path}: cannot encode this text ({exc}); the tokenizer file is "
                                 "incomplete: replace it with the model's original") from None
        return [self.bos_token_id, *ids] if self.add_bos and add_special_tokens else ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids of ``text`` (no special tokens added) and the character where each token starts."""
        encoding = self._backend.encode(text, add_special_tokens=False)
        return encoding.ids, [start for start, _ in encoding.offsets]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, special tokens included as written. An id the tokenizer does not have
        (a model vocabulary padded beyond the tokenizer's) is an error, never decoded to ``""``."""
        ids = list(ids)
        size = self.vocab_size
        unknown = [i for i in ids if not 0 <= i < size]
        if unknown:
            raise TokenizerError(f"token ids {unknown[:5]} are beyond {self.path}'s {size} tokens: the model's "
                                 f"vocabulary is larger than its tokenizer's, so these ids have no text")
        return self._backend.decode(ids, skip_special_tokens=False)

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` text (for libraries that read that format, e.g. llguidance)."""
        return self._backend.to_str()

    def token_text(self, token_id: int | None) -> str:
        """The vocabulary entry of ``token_id`` ("" for None)."""
        return "" if token_id is None else self._backend.id_to_token(token_id) or ""

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            template: ChatTemplate | None = None, tools: list[Any] | None = None) -> str:
        """The chat ``messages`` (``{"role", "content"}`` dicts) as the model's chat template (or
        ``template``) writes them, with this tokenizer's special tokens (and ``tools``, when given)."""
        template = template or self.chat_template
        if template is None:
            raise TokenizerError(f"{self.path.parent}: no chat_template (neither {CHAT_TEMPLATE_FILE} nor a "
                                 f"chat_template in {TOKENIZER_CONFIG_FILE}), so this model has no chat format; "
                                 f"give a plain prompt instead of messages (without --chat)")
        special = {"bos_token": self.token_text(self.bos_token_id), "eos_token": self.token_text(self.eos_token_id),
                   **template.special_tokens}
        return template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools, **special)


def load_tokenizer(directory: str | os.PathLike[str], defaults: dict[str, Any] | None = None) -> Tokenizer:
    """The tokenizer in ``directory/tokenizer.json`` with the special tokens its neighbouring files
    name; raises :class:`TokenizerNotFound` without a ``tokenizer.json``.

    ``defaults`` (``bos_token_id``, ``eos_token_id``, ``add_bos_token``) apply where none of those files
    names the setting: the model's own config when it is not a Hugging Face file (a llama2.c header)."""
    directory = Path(directory)
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerNotFound(
            f"{directory}: no {TOKENIZER_FILE}; text in/out needs the Hugging Face {TOKENIZER_FILE} "
            f"next to the weights (copy it from the model's repository), while token ids work without one"
        )
    import tokenizers  # here, not with the module: ~4 MB resident that a model run on token ids never uses

    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for malformed files
        raise TokenizerError(f"{path}: not a valid Hugging Face tokenizer file ({exc})") from exc
    if backend.get_vocab_size(with_added_tokens=True) == 0:
        raise TokenizerError(f"{path}: the tokenizer's vocabulary is empty. Fix: replace the file with the model's "
                             f"original {TOKENIZER_FILE}")
    files = [(directory / name, read_optional(directory, name))
             for name in (GENERATION_CONFIG_FILE, CONFIG_FILE, TOKENIZER_CONFIG_FILE)]
    files.append((directory / "(the model's config)", defaults or {}))
    bos = _special_ids(backend, files, "bos")
    tokenizer_config = files[2][1]
    return Tokenizer(backend, path, eos_token_ids=_special_ids(backend, files, "eos"),
                     bos_token_id=bos[0] if bos else None,
                     add_bos=_adds_bos(backend, bos, files),
                     chat_template=read_chat_template(directory, tokenizer_config, _special_strings(tokenizer_config)))


def _adds_bos(backend: tokenizers.Tokenizer, bos: tuple[int, ...], files: list[tuple[Path, dict[str, Any]]]) -> bool:
    """``add_bos_token`` from ``tokenizer_config.json`` or the model's config; when neither says, whether
    ``tokenizer.json``'s post-processor puts BOS first (Llama 3 does)."""
    add_bos = files[2][1].get("add_bos_token", files[3][1].get("add_bos_token"))
    if add_bos is None:
        with_special = backend.encode("a", add_special_tokens=True).ids
        plain = backend.encode("a", add_special_tokens=False).ids
        add_bos = bool(bos) and with_special[:1] == [bos[0]] and plain[:1] != [bos[0]]
    return bool(add_bos)


def _special_strings(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """``bos_token``/``eos_token`` as ``tokenizer_config.json`` writes them (what chat templates print)."""
    out = {}
    for name in ("bos_token", "eos_token"):
        token = tokenizer_config.get(name)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            out[name] = token
    return out


def _special_ids(backend: tokenizers.Tokenizer, files: list[tuple[Path, dict[str, Any]]], kind: str) -> tuple[int, ...]:
    """The ``<kind>_token_id`` of the first file that names one (ids, or a token string to look up)."""
    for path, data in files:
        value = data.get(f"{kind}_token_id")
        if value is None and f"{kind}_token" in data:
            token = data[f"{kind}_token"]
            token = token.get("content") if isinstance(token, dict) else token
            if token is None:
                continue
            value = backend.token_to_id(str(token))
            if value is None:
                raise TokenizerError(f"{path}: {kind}_token {token!r} is not in the vocabulary of {TOKENIZER_FILE}; "
                                     f"fix the file or remove the entry")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise TokenizerError(f"{path}: {kind}_token_id {value!r} is not a token id or a list of them")
        return tuple(ids)
    return ()
