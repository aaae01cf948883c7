"""Chat and instruction data as users bring it: JSON Lines of examples, tokenized with the model's own tokenizer.

``open_examples(path, tokenizer, seq)`` reads a ``.jsonl`` file (its last ``val_fraction`` of examples held out
for validation) or a directory with ``train.jsonl`` and ``valid.jsonl`` (or ``test.jsonl``). Each line is one
example in one of the formats mlx-lm reads (also TRL's SFT and axolotl's):

- ``{"messages": [{"role": ..., "content": ...}, ...], "tools": [...]?}``: rendered with the model's chat
  template (system and tool turns as the template renders them); trained on the assistant turns only.
- ``{"prompt": ..., "completion": ...}``: with a chat template, a user turn and an assistant turn (as mlx-lm
  does); without one, the two texts joined, then the end-of-sequence token. Trained on the completion only.
- ``{"text": ...}``: the text (BOS first when the model's files ask for it, EOS last); trained on all of it.

``train_on_prompt=True`` trains on every token instead. The assistant spans come from rendering prefixes of
the chat: an assistant message ``i`` covers the characters from the end of ``messages[:i]`` rendered with the
generation prompt to the end of ``messages[:i+1]`` (the approach of mlx-lm's ``mask_prompt`` and of TRL's
prompt-completion masking); a token is trained when it starts inside one.

**One example per window, padded.** Every window is one example from position 0, padded after its end, with
the padding's targets ignored (:data:`IGNORE`). The layer programs use one causal mask compiled into them, so
a window's tokens attend exactly to their own example's earlier tokens: padding is exact, while packing several
examples into a window would need a block-diagonal mask per window as a program input. The price is the
padding's compute. Examples longer than ``seq + 1`` tokens are cut to it and counted (``report``); an example
with no trained target left is dropped and counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from orion.train.errors import DataError

IGNORE = -100  # a target the loss skips (PyTorch's ignore_index)
SPLIT_FILES = {"train": ("train.jsonl",), "val": ("valid.jsonl", "test.jsonl")}
FORMATS = ("messages", "prompt/completion", "text")


@dataclass
class Example:
    """One tokenized example: its ids and which of them are trained (as a target)."""

    ids: np.ndarray      # int64
    trained: np.ndarray  # bool, one per id


@dataclass
class ExampleSplit:
    """One split of examples, one padded window each (see the module doc). ``arrays`` (all ids, one array) and
    ``sources`` serve the trainer's vocabulary check as a token split's do."""

    name: str
    examples: list[Example]
    sources: list[str]
    report: dict[str, int] = field(default_factory=dict)

    @property
    def arrays(self) -> list[np.ndarray]:
        return [np.concatenate([e.ids for e in self.examples])]

    @property
    def num_tokens(self) -> int:
        return sum(len(e.ids) for e in self.examples)

    def num_windows(self, length: int) -> int:
        """One window per example, whatever its length (``length`` is ``seq + 1``)."""
        return len(self.examples)

    def windows(self, indices: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs, targets)`` int64 ``[len(indices), seq_len]``: each example from position 0, padded with id
        0; targets of untrained tokens and of the padding are :data:`IGNORE`."""
        inputs = np.zeros((len(indices), seq_len), np.int64)
        targets = np.full((len(indices), seq_len), IGNORE, np.int64)
        for row, index in enumerate(indices):
            example = self.examples[int(index)]
            n = min(len(example.ids), seq_len + 1) - 1
            inputs[row, :n] = example.ids[:n]
            targets[row, :n] = np.where(example.trained[1:n + 1], example.ids[1:n + 1], IGNORE)
        return inputs, targets


def is_examples(path: str | os.PathLike) -> bool:
    """Whether ``path`` is chat/instruction data: a ``.jsonl`` file or a directory with ``train.jsonl``."""
    path = Path(path)
    return (path.is_file() and path.suffix == ".jsonl") or (path / "train.jsonl").is_file()


def open_examples(path: str | os.PathLike, tokenizer: Any, seq: int, *, train_on_prompt: bool = False,
                  max_examples: int | None = None, val_examples: int | None = None,
                  val_fraction: float = 0.1) -> tuple[ExampleSplit, ExampleSplit]:
    """The train and validation splits of ``path`` (see the module doc), tokenized with ``tokenizer`` (an
    :class:`orion.generation.tokenizer.Tokenizer`) for windows of ``seq`` tokens. ``max_examples`` and
    ``val_examples`` keep the first that many examples of each split."""
    path = Path(path)
    if path.is_dir():
        train_file = path / "train.jsonl"
        val_file = next((path / n for n in SPLIT_FILES["val"] if (path / n).is_file()), None)
        if val_file is None:
            raise DataError(f"{path} has train.jsonl but no valid.jsonl or test.jsonl. Fix: add the held-out "
                            "examples as valid.jsonl, or pass train.jsonl alone (its last 10% are held out)")
        train_records, val_records = _read_jsonl(train_file), _read_jsonl(val_file)
        sources = ([str(train_file)], [str(val_file)])
    else:
        records = _read_jsonl(path)
        cut = min(int(round(len(records) * (1 - val_fraction))), len(records) - 1)  # at least one held out
        if cut < 1:
            raise DataError(f"{path}: {len(records)} examples, too few to hold out {val_fraction:.0%} for validation. "
                            "Fix: give more examples, or a directory with train.jsonl and valid.jsonl")
        train_records, val_records = records[:cut], records[cut:]
        sources = ([f"{path}[:{cut}]"], [f"{path}[{cut}:]"])
    splits = []
    for name, records, source, limit in (("train", train_records, sources[0], max_examples),
                                         ("val", val_records, sources[1], val_examples)):
        records = records[:limit] if limit is not None else records
        splits.append(_tokenize_split(name, records, source, tokenizer, seq, train_on_prompt))
    return splits[0], splits[1]


def describe(split: ExampleSplit) -> str:
    """The data report of a split: examples, tokens, trained tokens, truncations and drops."""
    r = split.report
    return (f"{split.name}: {r['examples']:,} examples ({r['format']}), {r['tokens']:,} tokens, {r['trained']:,} trained, "
            f"{r['truncated']:,} truncated, {r['dropped']:,} dropped")


def _tokenize_split(name: str, records: list[tuple[int, dict[str, Any]]], sources: list[str], tokenizer: Any,
                    seq: int, train_on_prompt: bool) -> ExampleSplit:
    examples, truncated, dropped, kinds = [], 0, 0, set()
    for line, record in records:
        kind = _kind(record, f"{sources[0].split('[')[0]}:{line}")
        kinds.add(kind)
        example = _tokenize(record, kind, tokenizer, f"{sources[0].split('[')[0]}:{line}")
        if train_on_prompt:
            example.trained[:] = True
        if len(example.ids) > seq + 1:
            truncated += 1
            example = Example(example.ids[:seq + 1], example.trained[:seq + 1])
        if len(example.ids) < 2 or not example.trained[1:].any():
            dropped += 1
            continue
        examples.append(example)
    if not examples:
        raise DataError(f"{', '.join(sources)}: no example with a trained token ({len(records)} read, {dropped} "
                        f"without one within seq + 1 = {seq + 1} tokens). Fix: give examples with an assistant turn or "
                        "completion, or a longer --seq")
    report = {"examples": len(examples), "tokens": sum(min(len(e.ids), seq + 1) - 1 for e in examples),
              "trained": int(sum(e.trained[1:].sum() for e in examples)), "truncated": truncated, "dropped": dropped}
    return ExampleSplit(name, examples, sources, {**report, "format": "+".join(sorted(kinds))})


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of each non-blank line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text (byte {exc.start}); convert it to UTF-8") from None
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not JSON ({exc.msg}); each line of a .jsonl is one JSON object") from None
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: a {type(record).__name__}, not a JSON object")
        records.append((number, record))
    if not records:
        raise DataError(f"{path} holds no examples")
    return records


def _kind(record: Mapping[str, Any], where: str) -> str:
    if "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                      for m in messages):
            raise DataError(f'{where}: "messages" must be a list of {{"role": ..., "content": ...}} objects')
        return "messages"
    if "prompt" in record or "completion" in record:
        if not (isinstance(record.get("prompt"), str) and isinstance(record.get("completion"), str)):
            raise DataError(f'{where}: "prompt" and "completion" must both be strings')
        return "prompt/completion"
    if "text" in record:
        if not isinstance(record["text"], str):
            raise DataError(f'{where}: "text" must be a string')
        return "text"
    raise DataError(f"{where}: keys {sorted(record)[:6]}; an example is one of {{\"messages\": [...]}}, "
                    '{"prompt": ..., "completion": ...} or {"text": ...} (mlx-lm\'s and TRL\'s formats)')


def _tokenize(record: Mapping[str, Any], kind: str, tokenizer: Any, where: str) -> Example:
    if kind == "text":
        ids = tokenizer.encode(record["text"]) + _eos(tokenizer)
        return Example(np.asarray(ids, np.int64), np.ones(len(ids), bool))
    if kind == "prompt/completion" and tokenizer.chat_template is None:
        prompt = tokenizer.encode(record["prompt"])
        ids = prompt + tokenizer.encode(record["completion"], add_special_tokens=False) + _eos(tokenizer)
        trained = np.arange(len(ids)) >= len(prompt)
        return Example(np.asarray(ids, np.int64), trained)
    messages = record["messages"] if kind == "messages" else [
        {"role": "user", "content": record["prompt"]}, {"role": "assistant", "content": record["completion"]}]
    return _chat_example(messages, record.get("tools"), tokenizer, where)


def _chat_example(messages: list[dict[str, Any]], tools: Any, tokenizer: Any, where: str) -> Example:
    """The rendered chat's ids, trained on the tokens that start inside an assistant message's span."""
    from orion.errors import OrionError

    def render(upto: int, generation_prompt: bool) -> str:
        try:
            return tokenizer.apply_chat_template(messages[:upto], add_generation_prompt=generation_prompt, tools=tools)
        except OrionError as exc:
            raise DataError(f"{where}: {exc}") from None

    text = render(len(messages), False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render(i, True)) if i else 0
        end_text = render(i + 1, False)
        if not text.startswith(end_text) or start > len(end_text):
            raise DataError(f"{where}: the chat template renders the turns before assistant message {i} differently "
                            "once later turns follow, so its tokens cannot be told from the prompt's. Fix: one "
                            "assistant turn per example, or --train-on-prompt")
        spans.append((start, len(end_text)))
    if not spans:
        raise DataError(f'{where}: no "assistant" message, so nothing to train on. Fix: end each chat with the '
                        "assistant's answer")
    ids, starts = tokenizer.encode_offsets(text)
    starts = np.asarray(starts)
    trained = np.zeros(len(ids), bool)
    for a, b in spans:
        trained |= (starts >= a) & (starts < b)
    return Example(np.asarray(ids, np.int64), trained)


def _eos(tokenizer: Any) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
