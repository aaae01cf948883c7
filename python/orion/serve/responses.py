"""OpenAI response objects for one request: whole responses and streamed chunks, one choice per index,
with log-probabilities in the chat or the completions shape when asked and the usage block (OpenAI's
token counts, plus Orion's time to first token and decode rate)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from orion.serve.engine import TokenLogprob
from orion.serve.scheduler import Finished
from orion.serve.tools import ToolCall


def usage(done: Sequence[Finished]) -> dict[str, Any]:
    """The usage of a request's finished choices: token counts, the earliest time to first token (s) and
    the choices' decode rates summed (tokens/s, the choices run in parallel lanes)."""
    prompt, completion = done[0].prompt_tokens, sum(d.completion_tokens for d in done)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "time_to_first_token_s": round(min(d.first_token_s for d in done), 6),
            "tokens_per_second": round(sum(d.tokens_per_s for d in done), 3)}


class Reply:
    """Builds the ``text_completion`` / ``chat.completion`` objects of one request. ``decode`` gives a token's
    text (the log-probabilities' ``token``); ``logprobs``: whether the request asked for them."""

    def __init__(self, chat: bool, model: str, decode: Callable[[Sequence[int]], str] | None = None,
                 logprobs: bool = False) -> None:
        self.chat, self.model, self.decode, self.logprobs = chat, model, decode, logprobs
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, texts: Sequence[str], done: Sequence[Finished], calls: Sequence[list[ToolCall] | None] = (),
              logprobs: Sequence[list[TokenLogprob]] = ()) -> dict[str, Any]:
        """The response of every choice ``i``: its text, finish, tool calls and log-probabilities."""
        choices = []
        for i, (text, finished) in enumerate(zip(texts, done)):
            made = calls[i] if i < len(calls) else None
            lp = self._logprobs(logprobs[i] if i < len(logprobs) else [])
            if self.chat:
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if made:
                    message = {"role": "assistant", "content": text or None,
                               "tool_calls": [call.openai() for call in made]}
                choices.append({"index": i, "message": message, "logprobs": lp,
                                "finish_reason": finish_reason(finished, bool(made))})
            else:
                choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": finished.reason})
        body = self._object("chat.completion" if self.chat else "text_completion", choices)
        return body | {"usage": usage(done)}

    def first_chunks(self, n: int = 1) -> list[dict[str, Any]]:
        """What a stream sends before any text: the assistant's role for chat (per choice), nothing for completions."""
        return [self._chunk({"role": "assistant", "content": ""}, None, i) for i in range(n)] if self.chat else []

    def delta(self, text: str, index: int = 0, logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        return self._chunk({"content": text} if self.chat else text, None, index, logprobs)

    def tool_call_delta(self, index: int, call: ToolCall, choice: int = 0) -> dict[str, Any]:
        """A chat chunk carrying one whole tool call (the ``index``-th of choice ``choice``'s reply)."""
        return self._chunk({"tool_calls": [call.openai(index)]}, None, choice)

    def last_chunk(self, done: Finished, called: bool = False) -> dict[str, Any]:
        """The chunk with a choice's finish reason (and the log-probabilities no delta carried)."""
        return self._chunk({} if self.chat else "", finish_reason(done, called), done.index, done.logprobs)

    def usage_chunk(self, done: Sequence[Finished]) -> dict[str, Any]:
        """The last chunk when the client asked for the usage: no choices."""
        return self._object(self._chunk_kind, []) | {"usage": usage(done)}

    @property
    def _chunk_kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _chunk(self, delta: dict[str, Any] | str, reason: str | None, index: int = 0,
               logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        lp = self._logprobs(logprobs)
        if self.chat:
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
        else:
            choice = {"index": index, "text": delta, "logprobs": lp, "finish_reason": reason}
        return self._object(self._chunk_kind, [choice])

    def _logprobs(self, tokens: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """OpenAI's ``logprobs`` of ``tokens``: chat's ``{"content": [{token, logprob, bytes, top_logprobs}]}``,
        completions' ``{tokens, token_logprobs, top_logprobs, text_offset}`` (None when not asked)."""
        if not self.logprobs or self.decode is None:
            return None
        text = {t: self.decode([t]) for item in tokens for t in (item.token, *(i for i, _ in item.top))}
        if self.chat:
            def entry(token: int, logprob: float) -> dict[str, Any]:
                return {"token": text[token], "logprob": logprob, "bytes": list(text[token].encode("utf-8"))}

            return {"content": [entry(item.token, item.logprob)
                                | {"top_logprobs": [entry(t, lp) for t, lp in item.top]} for item in tokens]}
        offsets, at = [], 0
        for item in tokens:
            offsets.append(at)
            at += len(text[item.token])
        return {"tokens": [text[item.token] for item in tokens], "token_logprobs": [item.logprob for item in tokens],
                "top_logprobs": [{text[t]: lp for t, lp in item.top} for item in tokens], "text_offset": offsets}


def finish_reason(done: Finished, called: bool) -> str:
    """``"tool_calls"`` when a reply that made calls ended by itself, else the generation's reason."""
    return "tool_calls" if called and done.reason == "stop" else done.reason
