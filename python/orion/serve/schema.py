"""OpenAI request bodies to generation requests: every field checked, every mistake a clear 4xx.

Fields Orion cannot honour (``echo``, ``suffix``, ``n`` above the server's sequences...) are refused with
an error naming the field, and so are fields OpenAI does not define, as OpenAI does: none is ignored silently.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orion.generation.structured import Grammar, StructuredOutputError
from orion.serve.engine import Engine, PromptError, SamplingParams
from orion.serve.tools import check_tools, tool_call_grammar

MAX_STOP_STRINGS = 16
MAX_JSON_DEPTH = 64  # arrays and objects nested deeper than this are refused (no request needs more)
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
LOGIT_BIAS_LIMIT = 100  # OpenAI's range: [-100, 100]
MAX_TOP_LOGPROBS = {True: 20, False: 5}  # OpenAI's limits: chat's top_logprobs, completions' logprobs


class APIError(Exception):
    """An error response in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request: the prompt's ids, how to sample, and how to answer."""

    chat: bool
    prompt_ids: list[int]
    params: SamplingParams
    stops: list[str]
    stream: bool
    include_usage: bool
    tool_format: str | None = None  # parse tool calls in this format (orion.serve.tools) from the reply
    n: int = 1  # choices


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (NaN and Infinity refused), nested at most :data:`MAX_JSON_DEPTH` deep
    and with no string that is not Unicode text (a lone surrogate such as ``"\\ud800"``)."""

    def no_constants(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        body = json.loads(raw, parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {_json_type(body)}", code="invalid_json")
    _check_text(body)
    return body


def _check_text(body: dict[str, Any]) -> None:
    """``body`` nests at most :data:`MAX_JSON_DEPTH` deep, and its keys and strings encode as UTF-8
    (JSON's ``\\uXXXX`` escapes can name a lone surrogate, which is no character)."""
    pending: list[tuple[Any, str, int]] = [(body, "", 1)]
    while pending:
        value, where, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise APIError(400, f"the request body nests JSON arrays or objects more than {MAX_JSON_DEPTH} deep",
                           code="invalid_json")
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            here = f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]"
            if isinstance(key, str) and not _is_text(key):
                raise APIError(400, f"a field name {where and f'in {where[1:]} '}holds a lone surrogate "
                               f"({ascii(key)[:80]}): send Unicode text", param=where[1:] or None,
                               code="invalid_value")
            if isinstance(item, str) and not _is_text(item):
                raise APIError(400, f"{here[1:]} holds a lone surrogate ({ascii(item)[:80]}): send Unicode text",
                               param=here[1:], code="invalid_value")
            if isinstance(item, (dict, list)):
                pending.append((item, here, depth + 1))


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- field checks ----------------------------------------------------------------------------------
def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _number(lo: float, hi: float, lo_open: bool = False) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:  # (an int of 400 digits is no float: compared as an int, never converted)
        ok = isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and math.isfinite(v)
        return ok and (lo < v if lo_open else lo <= v) and v <= hi
    return check


def _integer(lo: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _is(kind: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, kind)


def _only(*allowed: Any) -> Callable[[Any], bool]:
    return lambda v: any(v == a and type(v) is type(a) for a in allowed)


def _stop(v: Any) -> bool:
    if isinstance(v, str):
        return True
    return isinstance(v, list) and len(v) <= MAX_STOP_STRINGS and all(isinstance(s, str) for s in v)


# name: (check, what a valid value is); null is always allowed and means the default.
_SAMPLING = {
    "max_tokens": (_integer(1), "an integer >= 1"),
    "temperature": (_number(0, 2), "a number in [0, 2] (0 is greedy)"),
    "top_p": (_number(0, 1, lo_open=True), "a number in (0, 1]"),
    "top_k": (lambda v: _integer(1)(v) or _only(-1)(v), "an integer >= 1, or -1 for no limit"),
    "min_p": (_number(0, 1), "a number in [0, 1]"),
    "repetition_penalty": (_number(0, 10, lo_open=True), "a number in (0, 10] (1 is none)"),
    "frequency_penalty": (_number(-2, 2), "a number in [-2, 2]"),
    "presence_penalty": (_number(-2, 2), "a number in [-2, 2]"),
    "seed": (lambda v: _integer(0)(v) and v < 2**64, "an integer in [0, 2**64)"),
    "stop": (_stop, f"a string or a list of at most {MAX_STOP_STRINGS} strings"),
    "n": (_integer(1), "an integer >= 1 (at most the server's --max-sequences)"),
    "stream": (_is(bool), "a boolean"),
    "stream_options": (lambda v: isinstance(v, dict) and set(v) <= {"include_usage"}
                       and isinstance(v.get("include_usage", False), bool), '{"include_usage": true|false}'),
    "user": (_is(str), "a string"),
    "logit_bias": (lambda v: isinstance(v, dict), "an object mapping token ids to a bias in [-100, 100]"),
    "speculative": (_is(bool), "a boolean (prompt-lookup speculative decoding; null: the server's --speculative)"),
}
_COMPLETION = {
    **_SAMPLING,
    "prompt": (lambda v: True, "a string or a list of token ids"),
    "logprobs": (lambda v: _integer(0)(v) and v <= MAX_TOP_LOGPROBS[False], "an integer in [0, 5]"),
    "echo": (_only(False), "false (Orion does not echo the prompt)"),
    "best_of": (_only(1), "1"),
    "suffix": (lambda v: False, "absent (Orion does not support suffix)"),
}
_CHAT = {
    **_SAMPLING,
    "messages": (lambda v: True, "a list of messages"),
    "max_completion_tokens": _SAMPLING["max_tokens"],
    "logprobs": (_is(bool), "a boolean"),
    "top_logprobs": (lambda v: _integer(0)(v) and v <= MAX_TOP_LOGPROBS[True], "an integer in [0, 20]"),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") in ("text", "json_object", "json_schema"),
                        '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": '
                        '{"name": ..., "schema": {...}}}'),
    "tools": (lambda v: check_tools(v) is None, 'a non-empty list of {"type": "function", "function": {...}}'),
    "tool_choice": (lambda v: v in ("none", "auto", "required") or (
        isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("function"), dict)
        and isinstance(v["function"].get("name"), str)),
        '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'),
    "parallel_tool_calls": (_is(bool), "a boolean"),
}


def _check_fields(body: dict[str, Any], spec: dict[str, tuple[Callable[[Any], bool], str]]) -> None:
    for name, value in body.items():
        if name == "model":
            continue
        if name not in spec:
            raise APIError(400, f"unknown field {name!r}: see the OpenAI API reference for this endpoint", param=name,
                           code="unknown_field")
        check, expected = spec[name]
        if value is not None and not check(value):
            raise APIError(400, f"{name} must be {expected}, got {json.dumps(value)[:80]} ({_json_type(value)})",
                           param=name, code="invalid_value")


def check_model(body: dict[str, Any], engine: Engine) -> None:
    model = body.get("model")
    if not isinstance(model, str):
        raise APIError(400, f"model must be a string naming the served model ({engine.model_id!r}), "
                       f"got {_json_type(model)}", param="model", code="invalid_value")
    if model != engine.model_id:
        raise APIError(404, f"the model {model!r} does not exist: this server serves {engine.model_id!r} "
                       f"(GET /v1/models)", param="model", code="model_not_found")


# -- prompts ---------------------------------------------------------------------------------------
def _completion_prompt(prompt: Any, engine: Engine) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return engine.encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        bad = [t for t in prompt if not 0 <= t < engine.vocab_size]
        if bad:
            raise APIError(400, f"prompt token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})",
                           param="prompt", code="invalid_value")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise APIError(400, f"prompt holds {len(prompt)} prompts: Orion serves one prompt per request, send "
                       f"them as separate requests", param="prompt", code="invalid_value")
    raise APIError(400, f"prompt must be a string or a non-empty list of token ids, got {_json_type(prompt)}",
                   param="prompt", code="invalid_value")


def _chat_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise APIError(400, f"messages must be a non-empty list of messages, got {_json_type(messages)}",
                       param="messages", code="invalid_value")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f"{where} must be an object with role and content", param=where, code="invalid_value")
        extra = set(message) - {"role", "content", "name", "tool_calls", "tool_call_id"}
        if extra:
            raise APIError(400, f"{where} has unsupported fields {sorted(extra)}: Orion takes role, content, name, "
                           f"tool_calls and tool_call_id", param=where, code="invalid_value")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise APIError(400, f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {json.dumps(role)}",
                           param=f"{where}.role", code="invalid_value")
        if message.get("tool_calls") is not None:  # an assistant's earlier calls: its content may be null
            if role != "assistant" or not isinstance(message["tool_calls"], list):
                raise APIError(400, f"{where}.tool_calls: a list, on an assistant message only",
                               param=f"{where}.tool_calls", code="invalid_value")
            out.append({**message, "content": _content(message.get("content") or "", f"{where}.content")})
            continue
        out.append({**message, "content": _content(message.get("content"), f"{where}.content")})
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise APIError(400, f'{where}[{j}] must be {{"type": "text", "text": "..."}}: Orion takes text only',
                               param=f"{where}[{j}]", code="invalid_value")
            texts.append(part["text"])
        return "".join(texts)
    raise APIError(400, f"{where} must be a string or a list of text parts, got {_json_type(content)}",
                   param=where, code="invalid_value")


# -- requests --------------------------------------------------------------------------------------
def parse_request(body: dict[str, Any], engine: Engine, chat: bool) -> GenerationRequest:
    """Check ``body`` (a /v1/chat/completions one when ``chat``, else /v1/completions) against ``engine``."""
    _check_fields(body, _CHAT if chat else _COMPLETION)
    check_model(body, engine)
    grammar, fmt = _response_format(body.get("response_format")), None
    if chat:
        tools = body.get("tools")
        choice = body.get("tool_choice") or ("auto" if tools else "none")
        if tools:
            fmt = _tool_format(engine)
            grammar = _tool_grammar(tools, choice, fmt) or grammar
        elif choice != "none":
            raise APIError(400, f"tool_choice {json.dumps(choice)} needs tools", param="tool_choice",
                           code="invalid_value")
        try:
            messages = _chat_messages(body.get("messages"))
            prompt_ids = engine.encode(engine.chat_prompt(messages, tools) if tools else engine.chat_prompt(messages))
        except PromptError as exc:
            raise APIError(400, str(exc), param="messages", code="invalid_value") from exc
        fmt = None if choice == "none" else fmt
    else:
        if "prompt" not in body:
            raise APIError(400, "prompt is required", param="prompt", code="missing_field")
        prompt_ids = _completion_prompt(body["prompt"], engine)
    if not prompt_ids:  # an empty prompt starts from the beginning-of-text token, as transformers does
        if engine.eos_token_id is None:
            raise APIError(400, "the prompt is empty and the tokenizer has no end-of-text token to start from",
                           param="prompt", code="invalid_value")
        prompt_ids = [engine.eos_token_id]
    if len(prompt_ids) > engine.context_length:
        raise APIError(400, f"the prompt has {len(prompt_ids)} tokens, over the model's context length of "
                       f"{engine.context_length}: shorten it", param="messages" if chat else "prompt",
                       code="context_length_exceeded")
    room = engine.context_length - len(prompt_ids) + 1  # the last position's logits give one more token
    requested = body.get("max_completion_tokens") if chat else None
    requested = requested if requested is not None else body.get("max_tokens")
    default = room if chat else 16  # OpenAI's defaults: the context for chat, 16 for completions
    top_k = body.get("top_k")
    params = SamplingParams(
        max_tokens=min(requested if requested is not None else default, room),
        temperature=_get(body, "temperature", 1.0),
        top_k=None if top_k in (None, -1) else top_k,
        top_p=body.get("top_p"),
        min_p=body.get("min_p"),
        repetition_penalty=body.get("repetition_penalty"),
        frequency_penalty=_get(body, "frequency_penalty", 0.0),
        presence_penalty=_get(body, "presence_penalty", 0.0),
        seed=body.get("seed"),
        stop_token_ids=frozenset(() if engine.eos_token_id is None else (engine.eos_token_id,)),
        logit_bias=_logit_bias(body.get("logit_bias"), engine.vocab_size),
        grammar=grammar,
        logprobs=_logprobs(body, chat),
        speculative=body.get("speculative"),
    )
    n = _get(body, "n", 1)
    if n > 1 and (n > engine.max_sequences or not hasattr(engine, "generate_choices")):
        raise APIError(400, f"n={n}: this server generates at most "
                       f"{engine.max_sequences if hasattr(engine, 'generate_choices') else 1} choices per request "
                       f"(--max-sequences)", param="n", code="invalid_value")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    options = body.get("stream_options") or {}
    return GenerationRequest(chat, prompt_ids, params, [s for s in stops if s], bool(body.get("stream")),
                             bool(options.get("include_usage")), fmt, n)


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives each token's log-probability comes with (None: no log-probabilities): chat's
    ``logprobs: true`` with ``top_logprobs``, completions' ``logprobs: <n>``."""
    if not chat:
        return body.get("logprobs")
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    return _get(body, "top_logprobs", 0) if body.get("logprobs") else None


def _response_format(value: dict[str, Any] | None) -> Grammar | None:
    """The grammar of ``response_format`` (None for text)."""
    if value is None or value.get("type") == "text":
        return None
    try:
        if value["type"] == "json_object":
            return Grammar.json_object()
        spec = value.get("json_schema")
        if not (isinstance(spec, dict) and isinstance(spec.get("name"), str) and isinstance(spec.get("schema"), dict)):
            raise APIError(400, 'response_format.json_schema must be {"name": "...", "schema": {...JSON Schema...}} '
                           '(strict and description optional)', param="response_format.json_schema",
                           code="invalid_value")
        return Grammar.json_schema(spec["schema"])
    except StructuredOutputError as exc:
        raise APIError(400, f"response_format: {exc}", param="response_format", code="invalid_value") from exc


def _tool_format(engine: Engine) -> str:
    fmt = engine.tool_format() if hasattr(engine, "tool_format") else None
    if fmt is None:
        raise APIError(400, f"the chat template of {engine.model_id!r} does not render tools, so the model cannot "
                       f"see them: send no tools, or serve a model whose template takes 'tools'", param="tools",
                       code="invalid_value")
    return fmt


def _tool_grammar(tools: list[dict[str, Any]], choice: Any, fmt: str) -> Grammar | None:
    """The grammar that forces a call for ``tool_choice`` "required" or a named function (else None)."""
    if choice in ("none", "auto"):
        return None
    name = choice["function"]["name"] if isinstance(choice, dict) else None
    if name is not None and name not in {t["function"]["name"] for t in tools}:
        raise APIError(400, f"tool_choice names the function {name!r}, which is not in tools",
                       param="tool_choice", code="invalid_value")
    try:
        return tool_call_grammar(tools, fmt, name)
    except StructuredOutputError as exc:
        raise APIError(400, f"tools: {exc}", param="tools", code="invalid_value") from exc


def _logit_bias(value: dict[str, Any] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: token ids (as JSON object keys) to a bias in [-100, 100]."""
    out = []
    for key, bias in (value or {}).items():
        if not (key.isascii() and key.isdigit() and len(key) <= 12 and int(key) < vocab_size):
            raise APIError(400, f"logit_bias key {key[:20]!r} is not a token id in [0, {vocab_size})",
                           param="logit_bias", code="invalid_value")
        if not _number(-LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT)(bias):
            raise APIError(400, f"logit_bias[{key}] must be a number in [-100, 100], got {json.dumps(bias)[:40]}",
                           param="logit_bias", code="invalid_value")
        out.append((int(key), float(bias)))
    return tuple(out)


def _get(body: dict[str, Any], name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value
