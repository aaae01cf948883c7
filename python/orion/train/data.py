"""Token data: memory-mapped token files, a resumable random-window sampler, and ``prepare``.

Layouts ``open_dataset`` reads (flat little-endian token ids, no header):

- **nanoGPT**: a directory with ``train.bin`` and ``val.bin`` (and optionally ``meta.json``, which
  ``prepare`` writes).
- **llama2.c pretokenized shards**: a directory of ``*.bin`` shards (``data00.bin`` ... as
  ``tinystories.py pretokenize`` writes them, BOS = 1 before each story); as in llama2.c the first
  shard in sorted order is the validation split and the others are the training split.
- **one ``.bin`` file**: its last ``val_fraction`` of tokens is held out for validation.

The ids are uint16 (nanoGPT's and llama2.c's format) unless a ``meta.json`` beside them says
``"dtype": "uint32"``, which ``prepare`` writes for vocabularies above 65,536 tokens. ``meta.json`` also
records the tokenizer the ids came from (``tokenizer.vocab_sha256``, :func:`vocab_digest`), which
:func:`check_tokenizer` compares with a model's. A file whose first bytes are text (a ``.jsonl`` or
``.txt`` renamed, or passed by mistake) is refused, never read as ids. Chat and instruction data
(``.jsonl``) are read by :mod:`orion.train.examples`; :func:`open_data` dispatches between the two.

``BatchSampler`` draws ``batch_size`` windows of ``seq_len + 1`` tokens at uniformly random starts
(seeded PCG64) and returns inputs and next-token targets; its ``state_dict()`` (seed, RNG state,
batches drawn) is JSON, so a resumed run draws exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orion.train.errors import DataError
from orion.train.examples import ExampleSplit, is_examples, open_examples

TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
FORMAT = "orion-tokens/2"  # /2: dtype chosen by the vocabulary, the tokenizer's vocab_sha256 recorded
EOT = "<|endoftext|>"
TEXT_SNIFF_BYTES = 4096


def token_dtype(vocab_size: int) -> str:
    """The narrowest token dtype that holds ``vocab_size`` ids: uint16 up to 65,536, uint32 above."""
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "uint32"


def vocab_digest(tokenizer: Any) -> str:
    """SHA-256 of a ``tokenizers.Tokenizer``'s id -> token table (added tokens included): what gives ids their
    meaning, independent of how the file was written."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = json.dumps(sorted((i, t) for t, i in vocab.items()), ensure_ascii=False)
    return hashlib.sha256(table.encode()).hexdigest()


@dataclass
class TokenSplit:
    """One split (train or val): token arrays (memory-mapped) sampled as one space of windows that never
    cross from one array into the next."""

    name: str
    arrays: list[np.ndarray]
    sources: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(a) for a in self.arrays)

    def num_windows(self, length: int) -> int:
        """How many distinct starts a window of ``length`` tokens has."""
        return sum(max(len(a) - length + 1, 0) for a in self.arrays)

    def window(self, index: int, length: int) -> np.ndarray:
        """The ``index``-th window of ``length`` tokens (windows of the first array first), as int64."""
        for array in self.arrays:
            starts = max(len(array) - length + 1, 0)
            if index < starts:
                return np.asarray(array[index:index + length], dtype=np.int64)
            index -= starts
        raise DataError(f"{self.name} split: window {index} of length {length} is past its end")

    def windows(self, indices: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs, targets)`` int64 ``[len(indices), seq_len]`` of the windows of ``seq_len + 1`` tokens at
        ``indices``, the targets shifted by one token."""
        batch = np.stack([self.window(int(i), seq_len + 1) for i in indices])
        return batch[:, :-1], batch[:, 1:]


@dataclass
class Dataset:
    """The training and validation splits of a token dataset, or of chat/instruction examples
    (:class:`orion.train.examples.ExampleSplit`, layout ``"examples"``)."""

    train: TokenSplit | ExampleSplit
    val: TokenSplit | ExampleSplit
    layout: str  # "nanogpt", "llama2c", "single-file" or "examples"
    meta: dict[str, Any] = field(default_factory=dict)  # meta.json, when there is one
    tokenizer_file: Path | None = None  # the tokenizer.json the ids came from, when meta.json names one that exists

    def eval_windows(self, default: int) -> int:
        """How many validation windows an evaluation uses: every example of an example split, else ``default``."""
        return len(self.val.examples) if isinstance(self.val, ExampleSplit) else default


def open_tokens(path: str | os.PathLike, vocab_size: int | None = None, dtype: str = "uint16") -> np.ndarray:
    """Memory-maps a flat token file of ``dtype`` ids, checking its size, that it is not text, and (given
    ``vocab_size``) every id."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"token file {path} does not exist; write one with `python -m orion data prepare`")
    if dtype not in TOKEN_DTYPES:
        raise DataError(f"token file {path}: dtype {dtype!r}; token files are {' or '.join(TOKEN_DTYPES)}")
    _refuse_text(path)
    size, itemsize = path.stat().st_size, TOKEN_DTYPES[dtype].itemsize
    if size == 0 or size % itemsize:
        raise DataError(f"token file {path} has {size} bytes; a {dtype} token file has a positive size that is a "
                        f"multiple of {itemsize}")
    tokens = np.memmap(path, dtype=TOKEN_DTYPES[dtype], mode="r")
    if vocab_size is not None:
        if int(tokens.max()) >= vocab_size:
            where = int(np.argmax(tokens >= vocab_size))
            raise DataError(f"token file {path}: token {where} is id {int(tokens[where])}, outside the vocabulary of "
                            f"{vocab_size}; the file was written with another tokenizer")
    return tokens


def open_dataset(path: str | os.PathLike, vocab_size: int | None = None, val_fraction: float = 0.1) -> Dataset:
    """Opens a nanoGPT directory, a llama2.c shard directory or a single token file (see the module doc).
    ``vocab_size`` (default: meta.json's, if present) checks every token id."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"--data {path} does not exist. Fix: pass a token directory, a .bin file, a .jsonl file of "
                        "chat or instruction examples, or 'stdlib'")
    if path.is_file() and path.suffix != ".bin":
        raise DataError(f"{path} is not a token file (.bin) or a .jsonl of examples. Fix: tokenize text with the "
                        f"model's tokenizer first: python -m orion data prepare {path} --tokenizer MODEL_DIR/"
                        "tokenizer.json --out DATA_DIR, then pass --data DATA_DIR")
    meta_path = (path if path.is_dir() else path.parent) / "meta.json"
    meta = _read_meta(meta_path) if meta_path.is_file() else {}
    tokenizer_file = meta_path.parent / str(meta.get("tokenizer", "tokenizer.json"))
    if meta and "vocab_sha256" not in meta and tokenizer_file.is_file():  # written before the digest was recorded
        meta["vocab_sha256"] = vocab_digest(_load_tokenizer(tokenizer_file))
    vocab_size = vocab_size if vocab_size is not None else meta.get("vocab_size")
    dtype = str(meta.get("dtype", "uint16"))
    tokenizer = tokenizer_file if meta and tokenizer_file.is_file() else None
    if path.is_dir() and (path / "train.bin").exists():
        if not (path / "val.bin").exists():
            raise DataError(f"{path} has train.bin but no val.bin; nanoGPT's layout holds both (prepare writes both)")
        train, val = (open_tokens(path / f"{n}.bin", vocab_size, dtype) for n in ("train", "val"))
        return Dataset(TokenSplit("train", [train], [str(path / "train.bin")]),
                       TokenSplit("val", [val], [str(path / "val.bin")]), "nanogpt", meta, tokenizer)
    if path.is_dir():
        shards = sorted(path.glob("*.bin"))
        if len(shards) < 2:
            raise DataError(f"{path} holds {len(shards)} .bin file(s): a llama2.c shard directory needs at least two "
                            "(the first is the validation split); or pass a single .bin file, or a nanoGPT directory "
                            "with train.bin and val.bin")
        arrays = [open_tokens(s, vocab_size, dtype) for s in shards]
        return Dataset(TokenSplit("train", arrays[1:], [str(s) for s in shards[1:]]),
                       TokenSplit("val", arrays[:1], [str(shards[0])]), "llama2c", meta, tokenizer)
    if not 0 < val_fraction < 1:
        raise DataError(f"open_dataset: val_fraction={val_fraction} must be between 0 and 1")
    tokens = open_tokens(path, vocab_size, dtype)
    cut = int(round(len(tokens) * (1 - val_fraction)))
    return Dataset(TokenSplit("train", [tokens[:cut]], [f"{path}[:{cut}]"]),
                   TokenSplit("val", [tokens[cut:]], [f"{path}[{cut}:]"]), "single-file", meta, tokenizer)


def open_data(path: str | os.PathLike, *, vocab_size: int | None = None, model_dir: str | os.PathLike | None = None,
              seq: int = 256, train_on_prompt: bool = False, max_examples: int | None = None,
              val_examples: int | None = None) -> Dataset:
    """The dataset at ``path`` for a model (its vocabulary size and, for a Hugging Face model, its directory):
    chat/instruction examples (:mod:`orion.train.examples`, tokenized with ``model_dir``'s tokenizer for
    windows of ``seq``), or token files (:func:`open_dataset`) whose tokenizer must be the model's
    (:func:`check_tokenizer`)."""
    if is_examples(path):
        from orion.generation.tokenizer import TokenizerError, load_tokenizer

        if model_dir is None:
            raise DataError(f"{path}: chat and instruction examples are tokenized with the model's tokenizer, and a "
                            "shape or checkpoint has none. Fix: pass --model a Hugging Face directory")
        try:
            tokenizer = load_tokenizer(model_dir)
        except TokenizerError as exc:
            raise DataError(f"{path}: the examples need the model's tokenizer: {exc}") from None
        train, val = open_examples(path, tokenizer, seq, train_on_prompt=train_on_prompt, max_examples=max_examples,
                                   val_examples=val_examples)
        meta = {"format": "examples", "tokenizer": str(tokenizer.path), "train_on_prompt": train_on_prompt,
                "report": {"train": train.report, "val": val.report}}
        return Dataset(train, val, "examples", meta)
    if max_examples is not None or val_examples is not None or train_on_prompt:
        raise DataError(f"{path}: --max-examples, --val-examples and --train-on-prompt apply to chat/instruction "
                        "examples (.jsonl); token files are windows of a token stream")
    dataset = open_dataset(path, vocab_size=vocab_size)
    if model_dir is not None:
        check_tokenizer(dataset, path, model_dir)
    return dataset


def check_tokenizer(dataset: Dataset, data_path: str | os.PathLike, model_dir: str | os.PathLike) -> None:
    """Refuses token data prepared with another tokenizer than ``model_dir``'s ``tokenizer.json``, naming both.
    Data without a record of its tokenizer (nanoGPT or llama2.c files) and models without a tokenizer pass."""
    import tokenizers

    model_file = Path(model_dir) / "tokenizer.json"
    theirs = dataset.meta.get("vocab_sha256")
    if theirs is None or not model_file.is_file():
        return
    try:
        mine = vocab_digest(tokenizers.Tokenizer.from_file(str(model_file)))
    except Exception as exc:  # tokenizers raises plain Exception for unreadable files
        raise DataError(f"{model_file}: cannot read the model's tokenizer ({exc})") from exc
    if mine != theirs:
        files = " ".join(dataset.meta.get("files", [])) or "TEXT_FILES"
        raise DataError(f"{data_path} was tokenized with {dataset.meta.get('tokenizer_origin', 'another tokenizer')} "
                        f"(vocab sha256 {theirs[:12]}, {dataset.meta.get('vocab_size')} tokens), not with the model's "
                        f"{model_file} (vocab sha256 {mine[:12]}): its ids would mean other tokens. Fix: re-prepare "
                        f"it: python -m orion data prepare {files} --tokenizer {model_file} --out {data_path}")


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens from a split (or random examples of an example split):
    ``next_batch()`` gives ``(inputs, targets)``, both int64 ``[batch_size, seq_len]``, targets shifted by one
    token."""

    def __init__(self, split: TokenSplit | ExampleSplit, seq_len: int, batch_size: int, seed: int) -> None:
        if seq_len < 1 or batch_size < 1:
            raise DataError(f"BatchSampler: seq_len={seq_len} and batch_size={batch_size} must be >= 1")
        self.windows = split.num_windows(seq_len + 1)
        if self.windows < 1:
            raise DataError(f"{split.name} split ({', '.join(split.sources)}): {split.num_tokens} tokens, too few for "
                            f"one window of seq_len + 1 = {seq_len + 1}; use more text or a shorter seq_len")
        self.split, self.seq_len, self.batch_size, self.seed = split, seq_len, batch_size, seed
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.batches_drawn = 0

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.rng.integers(0, self.windows, size=self.batch_size)
        self.batches_drawn += 1
        return self.split.windows(starts, self.seq_len)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable: seed, shape, batches drawn and the generator's full state."""
        return {"seed": self.seed, "seq_len": self.seq_len, "batch_size": self.batch_size,
                "batches_drawn": self.batches_drawn, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continues from ``state``: the next batch is the one the saved sampler would have drawn."""
        mine = {"seq_len": self.seq_len, "batch_size": self.batch_size, "seed": self.seed}
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise DataError(f"BatchSampler.load_state_dict: the state is of a sampler with {theirs}, this one has "
                            f"{mine}; build the sampler with the saved settings")
        try:
            self.rng.bit_generator.state = dict(state["rng"])
            self.batches_drawn = int(state["batches_drawn"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"BatchSampler.load_state_dict: bad RNG state ({exc}); pass what state_dict() returned") \
                from exc


def eval_batches(split: TokenSplit | ExampleSplit, seq_len: int, batch_size: int, num_batches: int) -> Iterator[
        tuple[np.ndarray, np.ndarray]]:
    """The same ``num_batches`` batches every time: windows at evenly spaced starts across the split."""
    windows = split.num_windows(seq_len + 1)
    count = num_batches * batch_size
    if windows < 1 or num_batches < 1:
        raise DataError(f"eval_batches: the {split.name} split has {windows} windows of {seq_len + 1} tokens, and "
                        f"num_batches={num_batches}; both must be >= 1")
    starts = np.linspace(0, windows - 1, count).round().astype(np.int64)
    for b in range(num_batches):
        yield split.windows(starts[b * batch_size:(b + 1) * batch_size], seq_len)


def prepare(text_files: Sequence[str | os.PathLike] | None, out_dir: str | os.PathLike, *, tokenizer: Any = None,
            vocab_size: int = 8192, val_fraction: float = 0.1, max_bytes: int | None = None) -> dict[str, Any]:
    """Tokenizes text files into ``out_dir``: ``train.bin``, ``val.bin`` (uint16, or uint32 for a vocabulary above
    65,536), ``tokenizer.json``, ``meta.json`` (format, dtype, counts, the tokenizer's origin and vocab_sha256).

    ``tokenizer`` is a ``tokenizers.Tokenizer`` or a path to a ``tokenizer.json``; without one, a byte-level
    BPE of ``vocab_size`` tokens is trained on the text. Without ``text_files`` the text is the built-in
    standard-library corpus (``orion.train.corpus``, cut to ``max_bytes``). Each file is one document,
    followed by ``<|endoftext|>`` when the vocabulary has it; the last ``val_fraction`` of the token stream
    is the validation split. Returns the contents of meta.json.
    """
    from orion.train import corpus

    if not 0 < val_fraction < 1:
        raise DataError(f"prepare: val_fraction={val_fraction} must be between 0 and 1")
    examples = [str(p) for p in text_files or () if is_examples(p)]
    if examples:
        raise DataError(f"prepare: {', '.join(examples)} holds chat or instruction examples (JSON Lines), not text. "
                        f"Fix: pass it to train as it is: python -m orion train --model MODEL_DIR --data {examples[0]} "
                        "...; it is tokenized there with the model's tokenizer and chat template")
    if text_files:
        documents, sources = [_read_text(Path(p)) for p in text_files], [str(p) for p in text_files]
        if max_bytes is not None:
            raise DataError("prepare: max_bytes applies to the built-in corpus only; cut the text files instead")
        origin: dict[str, Any] = {"files": sources}
    else:
        text = corpus.stdlib_text(max_bytes)
        documents, origin = [text], {"corpus": corpus.describe(text)}
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer_origin = str(tokenizer)
        tokenizer = _load_tokenizer(Path(tokenizer))
    elif tokenizer is None:
        tokenizer, tokenizer_origin = _train_bpe(documents, vocab_size), f"trained byte-level BPE, vocab {vocab_size}"
    else:
        tokenizer_origin = "given tokenizers.Tokenizer"
    vocab = tokenizer.get_vocab_size()
    dtype = token_dtype(vocab)
    eot = tokenizer.token_to_id(EOT)
    stream = []
    for document in documents:
        for encoding in tokenizer.encode_batch(_chunks(document)):
            stream.append(np.asarray(encoding.ids, dtype=TOKEN_DTYPES[dtype]))
        if eot is not None:
            stream.append(np.asarray([eot], dtype=TOKEN_DTYPES[dtype]))
    tokens = np.concatenate(stream) if stream else np.zeros(0, TOKEN_DTYPES[dtype])
    cut = int(round(len(tokens) * (1 - val_fraction)))
    if cut < 2 or len(tokens) - cut < 2:
        raise DataError(f"prepare: the text gives {len(tokens)} tokens, too few to split into train and val; "
                        "give more text")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokens[:cut].tofile(out / "train.bin")
    tokens[cut:].tofile(out / "val.bin")
    tokenizer.save(str(out / "tokenizer.json"))
    meta = {"format": FORMAT, "dtype": dtype, "vocab_size": vocab, "eot_id": eot,
            "tokens": {"train": cut, "val": len(tokens) - cut}, "tokenizer": "tokenizer.json",
            "tokenizer_origin": tokenizer_origin, "vocab_sha256": vocab_digest(tokenizer), **origin}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _train_bpe(documents: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if not len(alphabet) + 1 < vocab_size:
        raise DataError(f"prepare: vocab_size={vocab_size} must exceed the {len(alphabet)} byte tokens + {EOT}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], initial_alphabet=alphabet,
                                  show_progress=False)
    tokenizer.train_from_iterator((c for d in documents for c in _chunks(d)), trainer=trainer)
    return tokenizer


def _chunks(text: str, size: int = 1 << 20) -> list[str]:
    """Pieces of about ``size`` characters cut after a newline, so the tokenizer can encode them in parallel."""
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"prepare: text file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"prepare: {path} is not UTF-8 text (byte {exc.start}); convert it to UTF-8") from None
    except OSError as exc:
        raise DataError(f"prepare: cannot read {path} ({exc})") from None


def _load_tokenizer(path: Path) -> Any:
    import tokenizers

    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception for unreadable files
        raise DataError(f"cannot load the tokenizer {path} ({exc}); pass a tokenizer.json") from exc


def _refuse_text(path: Path) -> None:
    """Refuses a file whose first bytes are printable text: token ids of any real vocabulary include bytes
    outside printable ASCII (a zero high byte at least) within the first few thousand."""
    with path.open("rb") as f:
        head = f.read(TEXT_SNIFF_BYTES)
    printable = bytes(range(32, 127)) + b"\t\n\r"
    if len(head) >= 64 and not head.translate(None, printable):
        hint = ("it looks like JSON Lines: pass it with a .jsonl name (chat or instruction examples)"
                if head.lstrip()[:1] in (b"{", b"[") else "tokenize it first: python -m orion data prepare "
                f"{path} --tokenizer MODEL_DIR/tokenizer.json --out DATA_DIR")
        raise DataError(f"{path} holds text ({head[:24]!r}...), not token ids; reading it as ids would train on "
                        f"its bytes. Fix: {hint}")


def _read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise DataError(f"{path} is not readable JSON ({exc}); delete it or re-run prepare") from exc
    if not isinstance(meta, dict):
        raise DataError(f"{path} is not a JSON object; delete it or re-run prepare")
    return meta
