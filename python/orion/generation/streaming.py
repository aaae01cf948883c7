"""Streaming text out of token ids: incremental detokenization and stop strings.

Decoding each token on its own breaks multi-byte characters (a byte-level BPE splits an emoji over
several tokens) and word-boundary rules (SentencePiece drops the space of a sequence's first piece).
:class:`IncrementalDetokenizer` decodes a short window of recent ids twice, with and without the new
ones, and emits only the difference once it forms complete characters, so the joined stream equals
``decode(all ids)``. :class:`StopStrings` holds back text that may be the start of a stop string,
so a stop never leaves a partial match in the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

REPLACEMENT = "\ufffd"  # what a decoder yields for incomplete UTF-8


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas (the approach of Hugging Face's TGI).

    ``decode`` maps ids to text. ``push(id)`` returns the new text that is final (possibly ""),
    ``flush()`` the rest once generation ends. Text already emitted is never revised.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        self._ids: list[int] = list(prompt_ids)
        # ids[prefix:read] were decoded and emitted; ids[prefix:] are decoded together each step, so
        # that context-dependent decoding (leading spaces, merged bytes) sees the same neighbours.
        self._prefix = max(0, len(self._ids) - 5)
        self._read = len(self._ids)

    def push(self, token: int) -> str:
        """Add one id; return the text it completes."""
        self._ids.append(int(token))
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if len(text) > len(prefix_text) and not text.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """The text of ids not emitted yet (incomplete characters included, as ``decode`` renders them)."""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):]


@dataclass
class StopResult:
    """What a chunk of text gives after stop-string matching."""

    text: str  # safe to show now
    stopped: bool  # a stop string was found; ``text`` ends right before it
    stop: str | None = None  # which one


class StopStrings:
    """Finds stop strings across chunk boundaries, holding back a possible partial match. The stream stops at
    the first chunk after which the text holds a stop string, cut at the earliest start among those found (a
    completed stop is not held back for a longer one that might still complete at an earlier start)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._pending = ""

    def feed(self, chunk: str) -> StopResult:
        """Add ``chunk``; return the text that is safe to show and whether a stop string ended it."""
        text = self._pending + chunk
        hits = [(text.find(s), s) for s in self.stops if s in text]
        if hits:
            at, stop = min(hits)
            self._pending = ""
            return StopResult(text[:at], True, stop)
        hold = self._partial_suffix(text)
        self._pending = text[len(text) - hold:] if hold else ""
        return StopResult(text[:len(text) - hold], False)

    def finish(self) -> str:
        """The held-back text, once the stream ends without a stop."""
        rest, self._pending = self._pending, ""
        return rest

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that starts some stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if stop.startswith(text[len(text) - n:]):
                    longest = n
                    break
        return longest
