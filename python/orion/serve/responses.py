"""OpenAI response objects for one request: whole responses and streamed chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any

from orion.serve.scheduler import Finished
from orion.serve.tools import ToolCall


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

    def whole(self, text: str, done: Finished, calls: list[ToolCall] | None = None) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message = {"role": "assistant", "content": text or None,
                           "tool_calls": [call.openai() for call in calls]}
            choice = {"index": 0, "message": message, "logprobs": None,
                      "finish_reason": finish_reason(done, bool(calls))}
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

    def tool_call_delta(self, index: int, call: ToolCall) -> dict[str, Any]:
        """A chat chunk carrying one whole tool call (the ``index``-th of the reply)."""
        return self._chunk({"tool_calls": [call.openai(index)]}, None)

    def last_chunks(self, done: Finished, include_usage: bool, called: bool = False) -> list[dict[str, Any]]:
        """The chunk with the finish reason, then (if asked) one with the usage and no choices."""
        chunks = [self._chunk({} if self.chat else "", finish_reason(done, called))]
        if include_usage:
            chunks.append(self._object(self._chunk_kind, []) | {"usage": usage(done)})
        return chunks

    @property
    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, delta: dict[str, Any] | str, reason: str | None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
        return self._object(self._chunk_kind, [choice])


def finish_reason(done: Finished, called: bool) -> str:
    """``"tool_calls"`` when a reply that made calls ended by itself, else the generation's reason."""
    return "tool_calls" if called and done.reason == "stop" else done.reason
