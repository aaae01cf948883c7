"""Chat templates: the Jinja ``chat_template`` of a model's ``tokenizer_config.json``, rendered the way
transformers renders it (a sandboxed environment, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``,
``strftime_now`` and a ``tojson`` that does not escape HTML). Templates from model repositories are
untrusted code, hence the sandbox."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from orion.errors import OrionError


class ChatTemplateError(OrionError, ValueError):
    """A chat template cannot be read or rendered, or the messages are not a chat."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ChatTemplate:
    """One model's chat template; ``render(messages, ...)`` gives the prompt text."""

    def __init__(self, template: str | list[dict[str, str]], path: Path,
                 special_tokens: dict[str, str] | None = None) -> None:
        """``special_tokens``: ``bos_token``/``eos_token`` strings the template sees."""
        self.special_tokens = dict(special_tokens or {})
        if isinstance(template, list):  # named templates: transformers uses "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str):
            raise ChatTemplateError(f"{path}: chat_template is neither a Jinja string nor a list with a "
                                    f"'default' template; fix the file or remove the entry")
        self.source, self.path = template, path
        try:
            self._template = _compile(template)
        except jinja2.exceptions.TemplateSyntaxError as err:
            raise ChatTemplateError(f"{path}: chat_template line {err.lineno}: {err.message}") from None

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[Any] | None = None, **special: str) -> str:
        """The text of ``messages`` (dicts with ``role`` and ``content``), ending with the assistant's
        turn opened when ``add_generation_prompt``; ``tools`` (function schemas) reach the template when
        given; ``special`` gives ``bos_token``/``eos_token``."""
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in messages):
            raise ChatTemplateError('a chat is a list of {"role": ..., "content": ...} dicts, e.g. '
                                    '[{"role": "user", "content": "Hello"}]')
        try:
            extra: dict[str, Any] = {} if tools is None else {"tools": tools}
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt, **extra,
                                         **special)
        except jinja2.exceptions.TemplateError as err:
            raise ChatTemplateError(f"{self.path}: the chat_template refused these messages: {err}") from None
