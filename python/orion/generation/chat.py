"""Chat templates: the Jinja template of a model directory (``chat_template.jinja``, ``chat_template.json``
or ``tokenizer_config.json``'s ``chat_template``, found as transformers finds it), rendered the way
transformers renders it (a sandboxed environment, ``trim_blocks``/``lstrip_blocks``, ``raise_exception``,
``strftime_now`` and a ``tojson`` that does not escape HTML). Templates from model repositories are
untrusted code, hence the sandbox. Jinja is imported when a template is first compiled, not with this
module: every model load imports it, and Jinja cost ~20 ms of a warm start that reads no template."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orion.errors import OrionError
from orion.generation.hf_files import read_json_object

if TYPE_CHECKING:
    import jinja2


class ChatTemplateError(OrionError, ValueError):
    """A chat template cannot be read or rendered, or the messages are not a chat."""


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 saves the template
CHAT_TEMPLATE_JSON = "chat_template.json"  # {"chat_template": ...}: processors' (and older) form
ADDITIONAL_TEMPLATES_DIR = "additional_chat_templates"  # <name>.jinja: named templates beside the default


class ChatTemplate:
    """One model's chat template; ``render(messages, ...)`` gives the prompt text."""

    def __init__(self, template: str | list[dict[str, str]], path: Path,
                 special_tokens: dict[str, str] | None = None) -> None:
        """``special_tokens``: ``bos_token``/``eos_token`` strings the template sees."""
        import jinja2

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
        except (jinja2.exceptions.TemplateError, RecursionError, MemoryError, ValueError) as err:
            raise ChatTemplateError(f"{path}: chat_template cannot be compiled: {type(err).__name__}: {err}") \
                from None

    def uses(self, variable: str) -> bool:
        """Whether the template reads ``variable`` (e.g. ``tools``) from its context."""
        return variable in self._variables

    @cached_property
    def _variables(self) -> set[str]:
        import jinja2.meta

        return jinja2.meta.find_undeclared_variables(_compile(self.source).environment.parse(self.source))

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[Any] | None = None, **special: str) -> str:
        """The text of ``messages`` (dicts with ``role`` and ``content``), ending with the assistant's
        turn opened when ``add_generation_prompt``; ``tools`` (function schemas) reach the template when
        given; ``special`` gives ``bos_token``/``eos_token``."""
        import jinja2

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
        except Exception as err:  # the template is untrusted code: whatever it raises is its fault
            raise ChatTemplateError(f"{self.path}: the chat_template failed on these messages "
                                    f"({type(err).__name__}: {err}); fix the template") from None


def read_chat_template(directory: Path, tokenizer_config: dict[str, Any],
                       special_tokens: dict[str, str] | None = None) -> ChatTemplate | None:
    """The chat template of model directory ``directory``, or None when it has none. As transformers
    reads them: ``chat_template.jinja`` first, then ``chat_template.json``, then ``tokenizer_config.json``'s
    ``chat_template`` (a string, or named templates of which ``default`` is used); named templates in
    ``additional_chat_templates/`` supply ``default`` when none of those does."""
    jinja, as_json = directory / CHAT_TEMPLATE_FILE, directory / CHAT_TEMPLATE_JSON
    if jinja.is_file():
        return ChatTemplate(_read_text(jinja), jinja, special_tokens)
    if as_json.is_file():
        data = read_json_object(as_json)
        if "chat_template" not in data:
            raise ChatTemplateError(f"{as_json}: no 'chat_template' entry; fix the file or remove it")
        return ChatTemplate(data["chat_template"], as_json, special_tokens)
    if tokenizer_config.get("chat_template") is not None:
        return ChatTemplate(tokenizer_config["chat_template"], directory / "tokenizer_config.json", special_tokens)
    default = directory / ADDITIONAL_TEMPLATES_DIR / "default.jinja"
    return ChatTemplate(_read_text(default), default, special_tokens) if default.is_file() else None


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ChatTemplateError(f"{path}: not a readable UTF-8 text file ({err})") from None
