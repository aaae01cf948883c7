"""From generated token ids to the text a client sees: incremental UTF-8, stop strings, stop tokens."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orion.generation.streaming import IncrementalDetokenizer, StopStrings


class TextStream:
    """Turns one request's new tokens into text deltas and says when and why it ends.

    A stop token (end of text) ends the stream with ``"stop"`` and its text is not shown; a stop
    string ends it with ``"stop"``, the text cut right before it.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int], stops: Sequence[str],
                 stop_token_ids: frozenset[int]) -> None:
        self._detokenizer = IncrementalDetokenizer(decode, prompt_ids)
        self._stops = StopStrings(stops)
        self._stop_token_ids = stop_token_ids
        self._stopped = False

    def push(self, token: int) -> tuple[str, str | None]:
        """The text ``token`` makes final, and ``"stop"`` if the stream ends here (else None)."""
        if token in self._stop_token_ids:
            return self._end(), "stop"
        found = self._stops.feed(self._detokenizer.push(token))
        return found.text, "stop" if found.stopped else None

    def finish(self) -> tuple[str, str]:
        """The held-back text once generation ran out of tokens, and the finish reason."""
        text = self._end()
        return text, "stop" if self._stopped else "length"

    def _end(self) -> str:
        found = self._stops.feed(self._detokenizer.flush())
        self._stopped = found.stopped
        return found.text if found.stopped else found.text + self._stops.finish()
