"""The tokenizer a GGUF file describes in its ``tokenizer.ggml.*`` metadata, built as a Hugging Face
``tokenizers`` tokenizer, with the file's special tokens and chat template.

Two of llama.cpp's vocabulary types:

- ``gpt2``: byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM). The text is split by the regular
  expressions llama.cpp uses for the file's ``tokenizer.ggml.pre`` type (:data:`PRE_TOKENIZER_SPLITS`),
  then merged with the file's merges.
- ``llama``: SentencePiece BPE (Llama 2, Mistral, TinyLlama): ``▁`` for spaces, a space prefix unless
  ``add_space_prefix`` is false, byte fallback through the ``<0xNN>`` tokens, and merges ranked by the
  merged token's score, as SentencePiece ranks them.

Tokens the file marks as control (type 3) are special added tokens; user-defined ones (type 4) are
added tokens (matched whole, as llama.cpp does).
"""

from __future__ import annotations

from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers

from orion.generation.chat import ChatTemplate
from orion.generation.tokenizer import Tokenizer
from orion.models.gguf.reader import GGUFError, GGUFFile

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the expressions llama.cpp splits text with, applied in turn (llama-vocab.cpp).
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion"), (_GPT2_SPLIT,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"),
                    (r"\p{N}", _GPT2_SPLIT)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), (_LLAMA3_SPLIT,)),
    **dict.fromkeys(("qwen2", "stablelm2", "deepseek-r1-qwen"), (_QWEN2_SPLIT,)),
}
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "falcon3"}  # a word already in the vocabulary is one token


def gguf_tokenizer(file: GGUFFile) -> Tokenizer:
    """The file's tokenizer as an Orion :class:`Tokenizer` (special tokens, BOS/EOS, chat template);
    :class:`GGUFError` when the file has none or one of a type Orion cannot build."""
    kind = file.get("tokenizer.ggml.model", str, None)
    if kind is None:
        raise GGUFError(f"{file.path}: no tokenizer in the file (no tokenizer.ggml.model); pass token ids")
    tokens = file.get("tokenizer.ggml.tokens", list)
    types = file.get("tokenizer.ggml.token_type", list, [NORMAL] * len(tokens))
    if len(types) != len(tokens) or not all(isinstance(t, str) for t in tokens):
        raise GGUFError(f"{file.path}: tokenizer.ggml.tokens and token_type disagree or are not strings")
    if kind == "gpt2":
        backend = _byte_level(file, tokens)
    elif kind == "llama":
        backend = _sentencepiece(file, tokens, types)
    else:
        raise GGUFError(f"{file.path}: tokenizer type {kind!r} is not implemented by Orion (it builds 'gpt2' "
                        f"byte-level BPE and 'llama' SentencePiece); pass token ids")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, kind_ in zip(tokens, types) if kind_ == CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, kind_ in zip(tokens, types) if kind_ == USER_DEFINED])
    if backend.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise GGUFError(f"{file.path}: the tokenizer built from its {len(tokens)} tokens has "
                        f"{backend.get_vocab_size(with_added_tokens=True)}; its token list has duplicates")
    bos = _token_id(file, "bos", len(tokens))
    eos = tuple(dict.fromkeys(i for i in (_token_id(file, name, len(tokens)) for name in ("eos", "eot", "eom"))
                              if i is not None))
    add_bos = file.get("tokenizer.ggml.add_bos_token", bool, kind == "llama")  # llama.cpp's default
    special = {name: tokens[i] for name, i in (("bos_token", bos), ("eos_token", eos[0] if eos else None))
               if i is not None}
    template = file.get("tokenizer.chat_template", str, None)
    return Tokenizer(backend, file.path, eos_token_ids=eos, bos_token_id=bos, add_bos=add_bos,
                     chat_template=None if template is None else ChatTemplate(template, file.path, special))


def _token_id(file: GGUFFile, name: str, count: int) -> int | None:
    value = file.get(f"tokenizer.ggml.{name}_token_id", int, None)
    if value is not None and not 0 <= value < count:
        raise GGUFError(f"{file.path}: tokenizer.ggml.{name}_token_id {value} is outside its {count} tokens")
    return value


def _byte_level(file: GGUFFile, tokens: list[str]) -> tokenizers.Tokenizer:
    pre = file.get("tokenizer.ggml.pre", str, "gpt-2")
    if pre not in PRE_TOKENIZER_SPLITS:
        raise GGUFError(f"{file.path}: pre-tokenizer {pre!r} is not implemented by Orion (it implements "
                        f"{', '.join(sorted(PRE_TOKENIZER_SPLITS))}); pass token ids")
    merges = [tuple(m.split(" ", 1)) for m in file.get("tokenizer.ggml.merges", list)]
    vocab = {token: i for i, token in enumerate(tokens)}
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, merges, ignore_merges=pre in _IGNORE_MERGES))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(expression), behavior="isolated") for expression in PRE_TOKENIZER_SPLITS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece(file: GGUFFile, tokens: list[str], types: list[int]) -> tokenizers.Tokenizer:
    scores = file.get("tokenizer.ggml.scores", list, None)
    if scores is None or len(scores) != len(tokens):
        raise GGUFError(f"{file.path}: a SentencePiece vocabulary needs tokenizer.ggml.scores, one per token")
    vocab = {token: i for i, token in enumerate(tokens)}
    unk = _token_id(file, "unknown", len(tokens))
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(
        vocab, _merges_by_score(tokens, types, scores, vocab), unk_token=None if unk is None else tokens[unk],
        byte_fallback=True, fuse_unk=True))
    steps: list[Any] = [normalizers.Replace(" ", "\u2581")]
    if file.get("tokenizer.ggml.add_space_prefix", bool, True):
        steps.insert(0, normalizers.Prepend("\u2581"))
    backend.normalizer = normalizers.Sequence(steps)
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
                                        + ([decoders.Strip(" ", 1, 0)]
                                           if file.get("tokenizer.ggml.add_space_prefix", bool, True) else []))
    return backend


def _merges_by_score(tokens: list[str], types: list[int], scores: list[float],
                     vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a normal token into two vocabulary pieces, the merges of higher-scoring tokens first."""
    ranked = []
    for token, kind, score in zip(tokens, types, scores):
        if kind != NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]
