"""The engine protocol for any Orion model (an :class:`orion.generation.loop.CausalLM`).

What it takes from the model runtime: ``orion.models.load(dir, progress=)``, ``dims.context`` and
``dims.vocab_size``, ``tokenizer`` (``encode``/``decode``/``eos_token_id``), ``prefill(ids)`` and
``decode_step(id)`` returning float32 logits, ``fork()`` for each extra concurrent sequence, and
``next_token`` (greedy/temperature/top-k/top-p) from ``orion.generation.sampling``.

Chat prompts use ``chat_template`` from the directory's ``tokenizer_config.json``, rendered with
Jinja2 in a sandbox as Hugging Face renders it. Without a template, the plain format is one line
``"{role}: {content}"`` per message, then ``"assistant:"``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from orion import models
from orion.generation.loop import CausalLM
from orion.generation.sampling import next_token
from orion.generation.tokenizer import load_tokenizer
from orion.serve.engine import PromptError, SamplingParams
from orion.serve.logits import LogitsProcessor

TOKENIZER_CONFIG = "tokenizer_config.json"


class ModelEngine:
    """Serves one model; up to ``max_sequences`` sequences at once, each with its own KV cache."""

    def __init__(self, model: CausalLM, model_id: str, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None, max_sequences: int = 4) -> None:
        if max_sequences < 1:
            raise ValueError(f"max_sequences={max_sequences}: use 1 or more")
        self.model = model
        self.tokenizer = model.tokenizer  # raises TokenizerNotFound when the model has none
        self.model_id = model_id
        self.context_length = model.dims.context
        self.vocab_size = model.dims.vocab_size
        self.eos_token_id = self.tokenizer.eos_token_id
        self.max_sequences = max_sequences
        self.chat_template = chat_template
        if chat_template is not None:
            _check_template(chat_template)  # a broken template fails at load, not at the first chat request
        self._special_tokens = special_tokens or {}
        self._free: list[CausalLM] = [model]  # sequences (the model and its forks) not generating now
        self._sequences = 1

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str], model_id: str | None = None, progress: bool = True,
                       max_sequences: int = 4) -> ModelEngine:
        """Load (and compile) the Hugging Face model directory ``path``; the tokenizer is checked first."""
        load_tokenizer(path)  # a missing or broken tokenizer.json fails before the compile
        template, special = read_chat_template(Path(path))
        model = models.load(path, progress=progress)
        return cls(model, model_id or Path(path).resolve().name, template, special, max_sequences)

    # -- text ---------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        if self.chat_template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return render_chat_template(self.chat_template, messages, self._special_tokens)

    # -- generation ---------------------------------------------------------------------------------
    def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                 cancelled: Callable[[], bool]) -> Iterator[int]:
        sequence = self._acquire()
        healthy = False
        try:
            yield from self._steps(sequence, list(prompt_ids), params, cancelled)
            healthy = True
        except GeneratorExit:  # closed early by the caller: the sequence is intact
            healthy = True
            raise
        finally:
            if healthy:
                self._free.append(sequence)
            else:  # a failure mid-step may leave its cache half-written: drop it
                self._sequences -= 1

    def _steps(self, sequence: CausalLM, ids: list[int], params: SamplingParams,
               cancelled: Callable[[], bool]) -> Iterator[int]:
        rng = np.random.default_rng(params.seed)
        process = LogitsProcessor(params, ids, self.vocab_size)
        logits = sequence.prefill(ids)
        for produced in range(params.max_tokens):
            token = next_token(process(logits), params.temperature, params.top_k, params.top_p, rng)
            process.record(token)
            yield token
            done = token in params.stop_token_ids or produced + 1 == params.max_tokens
            if done or len(ids) + produced >= self.context_length or cancelled():
                return
            logits = sequence.decode_step(token)

    def _acquire(self) -> CausalLM:
        if self._free:
            return self._free.pop()
        if self._sequences >= self.max_sequences:
            raise RuntimeError(f"all {self.max_sequences} sequences are generating: the scheduler must not "
                               f"open more generators than max_sequences")
        self._sequences += 1
        return self.model.fork()


def read_chat_template(directory: Path) -> tuple[str | None, dict[str, str]]:
    """``chat_template`` (the default one when several are named) and the special-token strings
    (``bos_token``, ``eos_token``, ...) of ``directory/tokenizer_config.json``; (None, {}) without one."""
    path = directory / TOKENIZER_CONFIG
    if not path.is_file():
        return None, {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PromptError(f"{path}: not valid JSON ({exc}); fix or remove the file") from exc
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise PromptError(f"{path}: chat_template must be a string or a list of named templates with a 'default'")
    special = {}
    for key, value in config.items():
        if key.endswith("_token"):
            content = value.get("content") if isinstance(value, dict) else value
            if isinstance(content, str):
                special[key] = content
    return template, special


def render_chat_template(template: str, messages: Sequence[dict[str, str]], special: dict[str, str]) -> str:
    """Render a Hugging Face chat template with the generation prompt, as ``apply_chat_template`` does."""
    import jinja2

    try:
        return _compiled(template).render(messages=list(messages), add_generation_prompt=True, **special)
    except jinja2.TemplateError as exc:
        raise PromptError(f"the chat template in {TOKENIZER_CONFIG} fails: {exc}") from exc


def _check_template(template: str) -> None:
    import jinja2

    try:
        _compiled(template)
    except jinja2.TemplateError as exc:
        raise PromptError(f"the chat template in {TOKENIZER_CONFIG} does not parse: {exc}; fix or remove it") from exc


def _raise_exception(message: str) -> None:
    raise PromptError(f"the chat template refuses these messages: {message}")


@functools.lru_cache(maxsize=8)
def _compiled(template: str):  # noqa: ANN202  (a jinja2.Template; jinja2 is imported lazily)
    """``template`` parsed once, in a sandbox with Hugging Face's extras (``raise_exception``, ``tojson``)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)
