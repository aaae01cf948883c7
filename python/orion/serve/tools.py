"""Tool calls: the family's call format found in the model's output, as OpenAI ``tool_calls``.

The tools reach the model through its own chat template (the ``tools`` variable, as transformers
passes them); the format of a call is the one that template teaches:

- ``hermes`` (Qwen2/2.5/3, Hermes, SmolLM3 and most templates that render tools): each call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` anywhere in the reply;
- ``llama3`` (Llama 3.1-3.3, whose templates mention ``<|python_tag|>``/``ipython``): the whole reply is one
  JSON object ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``; several calls
  separated by ``;``).

:class:`ToolCallParser` splits streamed text into content and calls as it arrives, holding back only
what may still become a call. ``tool_choice`` ``"required"`` or a named function constrains decoding
to a call in the family's format (:func:`tool_call_grammar`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from orion.generation.structured import JSON_OPTIONS, Grammar

HERMES, LLAMA3 = "hermes", "llama3"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"


def tool_format(template_source: str) -> str:
    """The call format a chat template teaches: ``llama3`` when it speaks of ``<|python_tag|>`` or the
    ``ipython`` role and not of ``<tool_call>``, else ``hermes``."""
    if _OPEN not in template_source and (_PYTHON_TAG in template_source or "ipython" in template_source):
        return LLAMA3
    return HERMES


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as a JSON text (OpenAI's shape)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self, index: int | None = None) -> dict[str, Any]:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


def _call(payload: str, arguments_key: str) -> ToolCall | None:
    """``{"name": ..., arguments_key: {...}}`` as a call, or None when it is not one."""
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    return ToolCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


class ToolCallParser:
    """Feeds on the reply's text pieces; returns content text and :class:`ToolCall` items in order."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self._pending = ""
        self._started = False  # llama3: the reply's first non-space text decided: a call or content
        self._buffering = False  # llama3: the reply is a call (so far): nothing is shown until the end

    def feed(self, text: str) -> list[str | ToolCall]:
        self._pending += text
        return self._hermes(final=False) if self.fmt == HERMES else self._llama3(final=False)

    def finish(self) -> list[str | ToolCall]:
        """What is left once the reply ends (an unfinished call is content)."""
        return self._hermes(final=True) if self.fmt == HERMES else self._llama3(final=True)

    def _hermes(self, final: bool) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        while self._pending:
            start = self._pending.find(_OPEN)
            if start < 0:
                keep = 0 if final else _partial_suffix(self._pending, _OPEN)
                out.append(self._pending[:len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep:]
                break
            end = self._pending.find(_CLOSE, start)
            if end < 0:
                out.append(self._pending[:start])
                self._pending = self._pending[start:]
                if final:
                    out.append(self._pending)
                    self._pending = ""
                break
            out.append(self._pending[:start])
            payload = self._pending[start + len(_OPEN):end]
            call = _call(payload.strip(), "arguments")
            out.append(call if call is not None else self._pending[start:end + len(_CLOSE)])
            self._pending = self._pending[end + len(_CLOSE):]
        return [item for item in out if item != ""]

    def _llama3(self, final: bool) -> list[str | ToolCall]:
        if not self._started:
            head = self._pending.lstrip()
            if not head and not final:
                return []
            if head and not (head.startswith("{") or head.startswith(_PYTHON_TAG) or _PYTHON_TAG.startswith(head)):
                self._started = True
            elif not final and _PYTHON_TAG.startswith(head):
                return []  # may still become the tag
            else:
                self._started = self._buffering = True
        if self._buffering and not final:
            return []
        text, self._pending = self._pending, ""
        if self._buffering:
            calls = [_call(part, "parameters") for part in text.strip().removeprefix(_PYTHON_TAG).split(";")
                     if part.strip()]
            if calls and all(calls):
                return calls  # type: ignore[return-value]
        return [text] if text else []


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def tool_call_grammar(tools: list[dict[str, Any]], fmt: str, name: str | None = None) -> Grammar:
    """A grammar for one call (of the function ``name``, else of any of ``tools``) in format ``fmt``."""
    functions = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    arguments_key = "parameters" if fmt == LLAMA3 else "arguments"
    options = [{"type": "object", "additionalProperties": False, "required": ["name", arguments_key],
                "properties": {"name": {"const": f["name"]},
                               arguments_key: f.get("parameters") or {"type": "object"}}} for f in functions]
    schema = {"anyOf": options} if len(options) > 1 else options[0]
    if fmt == LLAMA3:
        return Grammar.json_schema(schema)
    schema["x-guidance"] = JSON_OPTIONS
    body = json.dumps(schema)
    return Grammar.lark(f'start: "{_OPEN}\\n" call "\\n{_CLOSE}"\ncall: %json {body}', "the tool call grammar")


def arguments_as_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Earlier assistant ``tool_calls`` with their ``arguments`` JSON text parsed into objects, as chat
    templates expect them (transformers' convention)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_parsed(call) for call in calls]}
        out.append(message)
    return out


def _parsed(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            arguments = json.loads(function["arguments"])
        except ValueError:
            return call
        return {**call, "function": {**function, "arguments": arguments}}
    return call


_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def check_tools(tools: Any) -> str | None:
    """Why ``tools`` is not a list of OpenAI function tools (None when it is)."""
    if not isinstance(tools, list) or not tools:
        return "a non-empty list of tools"
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)):
            return f'a list of {{"type": "function", "function": {{...}}}} (tools[{i}] is not)'
        if not (isinstance(function.get("name"), str) and _NAME.match(function["name"])):
            return f"tools[{i}].function.name: a name of letters, digits, '_', '.' or '-' (at most 64)"
        if not isinstance(function.get("parameters", {}), dict):
            return f"tools[{i}].function.parameters: a JSON Schema object"
    return None
