"""``POST /tokenize`` and ``POST /detokenize`` in both llama-server's and vLLM's shapes.

- llama-server: ``{"content": "...", "add_special": false, "with_pieces": false}`` -> ``{"tokens": [...]}``
  (with ``with_pieces``, ``[{"id": ..., "piece": "..."}]``);
- vLLM: ``{"prompt": "...", "add_special_tokens": true}`` or ``{"messages": [...], "add_generation_prompt":
  true, "tools": [...]}`` -> ``{"tokens": [...], "count": n, "max_model_len": context}``;
- detokenize: ``{"tokens": [...]}`` -> ``{"content": "...", "prompt": "..."}`` (llama-server's key and vLLM's).

``model`` is optional and, when given, must name the served model.
"""

from __future__ import annotations

import json
from typing import Any

from orion.errors import OrionError
from orion.serve.engine import Engine, PromptError
from orion.serve.schema import APIError, _chat_messages, check_model


def _fields(body: dict[str, Any], allowed: dict[str, type | tuple[type, ...]]) -> None:
    for name, value in body.items():
        if name not in allowed:
            raise APIError(400, f"unknown field {name!r}: this endpoint takes {', '.join(sorted(allowed))}",
                           param=name, code="unknown_field")
        if value is not None and (not isinstance(value, allowed[name]) or (isinstance(value, bool)
                                                                            and bool not in _types(allowed[name]))):
            raise APIError(400, f"{name} has the wrong type ({type(value).__name__})", param=name,
                           code="invalid_value")


def _types(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _text(body: dict[str, Any], name: str) -> str:
    """``body[name]``, refused when it holds a lone surrogate (text no tokenizer can take)."""
    text = body[name]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(400, f"{name} holds a lone surrogate ({text[exc.start]!r} at {exc.start}): send valid "
                       f"Unicode text", param=name, code="invalid_value") from exc
    return text


def tokenize(body: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """The answer to a /tokenize body (llama-server's shape with ``content``, else vLLM's)."""
    _fields(body, {"model": str, "content": str, "add_special": bool, "with_pieces": bool, "prompt": str,
                   "add_special_tokens": bool, "messages": list, "add_generation_prompt": bool, "tools": list})
    if "model" in body:
        check_model(body, engine)
    given = [k for k in ("content", "prompt", "messages") if body.get(k) is not None]
    if len(given) != 1:
        raise APIError(400, "give exactly one of content (llama-server), prompt or messages (vLLM)",
                       param="content", code="invalid_value")
    if given == ["content"]:
        ids = engine.encode(_text(body, "content"), add_special_tokens=bool(body.get("add_special", False)))
        if body.get("with_pieces"):
            return {"tokens": [{"id": i, "piece": engine.decode([i])} for i in ids]}
        return {"tokens": ids}
    if given == ["prompt"]:
        ids = engine.encode(_text(body, "prompt"), add_special_tokens=body.get("add_special_tokens") is not False)
    else:
        if body.get("add_generation_prompt") is False:
            raise APIError(400, "add_generation_prompt false is not supported: the prompt ends where the reply "
                           "starts", param="add_generation_prompt", code="invalid_value")
        try:
            messages = _chat_messages(body["messages"])
            text = engine.chat_prompt(messages, body["tools"]) if body.get("tools") else engine.chat_prompt(messages)
        except PromptError as exc:
            raise APIError(400, str(exc), param="messages", code="invalid_value") from exc
        ids = engine.encode(text, add_special_tokens=False)
    return {"tokens": ids, "count": len(ids), "max_model_len": engine.context_length}


def detokenize(body: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """The answer to a /detokenize body: the text of ``tokens``."""
    _fields(body, {"model": str, "tokens": list})
    if "model" in body:
        check_model(body, engine)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise APIError(400, f"tokens must be a list of token ids, got {json.dumps(ids)[:60]}", param="tokens",
                       code="invalid_value")
    bad = [i for i in ids if not 0 <= i < engine.vocab_size]
    if bad:
        raise APIError(400, f"token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})",
                       param="tokens", code="invalid_value")
    try:
        text = engine.decode(ids)
    except OrionError as exc:  # an id of the model's vocabulary that the tokenizer does not have
        raise APIError(400, str(exc), param="tokens", code="invalid_value") from exc
    return {"content": text, "prompt": text}
