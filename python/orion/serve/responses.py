"""OpenAI response objects for one request: whole responses and streamed chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any

from orion.serve.scheduler import Finished


def usage(done: Finished) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


class Reply:
    """Builds the ``text_completion`` / ``chat.completion`` objects of one request."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, text: str, done: Finished) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": done.reason}
            body = self._object("chat.completion", [choice])
        else:
            body = self._object("text_completion", [{"index": 0, "text": text, "logprobs": None,
                                                     "finish_reason": done.reason}])
        return body | {"usage": usage(done)}

    def first_chunks(self) -> list[dict[str, Any]]:
        """What a stream sends before any text: the assistant's role for chat, nothing for completions."""
        return [self._chunk({"role": "assistant", "content": ""}, None)] if self.chat else []

    def delta(self, text: str) -> dict[str, Any]:
        return self._chunk({"content": text} if self.chat else text, None)

    def last_chunks(self, done: Finished, include_usage: bool) -> list[dict[str, Any]]:
        """The chunk with the finish reason, then (if asked) one with the usage and no choices."""
        chunks = [self._chunk({} if self.chat else "", done.reason)]
        if include_usage:
            chunks.append(self._object(self._chunk_kind, []) | {"usage": usage(done)})
        return chunks

    @property
    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, delta: dict[str, str] | str, reason: str | None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
        return self._object(self._chunk_kind, [choice])
