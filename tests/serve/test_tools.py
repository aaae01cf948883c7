"""Tool calls: the parser of each family's format (whole and streamed at every split), and the server with
the openai client. A random-weight model never writes a call by itself, so the end-to-end tests either
constrain decoding to a call (tool_choice "required" or a named function: the model's own sampled
arguments, validated against the tool's schema) or serve an engine whose output is scripted text (labelled
as such), which tests the server's parsing and streaming of a call the model is told to write."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence

import httpx
import jsonschema
import openai
import pytest

from orion import models
from orion.generation.structured import GrammarProcessor
from orion.serve.app import create_app
from orion.serve.engine import SamplingParams
from orion.serve.model_engine import ModelEngine
from orion.serve.tools import HERMES, LLAMA3, ToolCall, ToolCallParser, tool_call_grammar, tool_format
from support import references

from .conftest import LIMITS, serving, write_model
from .test_bad_input import assert_error, chat, post

# A ChatML template that renders tools and earlier calls as Qwen2.5's does (trimmed).
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions:\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n"
    'Answer a call as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call><|im_end|>\n{% endif %}'
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant"
    "{%- for tc in m.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]


# -- the parser ---------------------------------------------------------------------------------------------
HERMES_REPLY = ('Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}\n'
                '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>')
LLAMA3_REPLY = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "C"}}'


def parse(fmt: str, pieces: Sequence[str]) -> list[str | ToolCall]:
    parser = ToolCallParser(fmt)
    items = [item for piece in pieces for item in parser.feed(piece)] + parser.finish()
    merged: list[str | ToolCall] = []
    for item in items:  # adjacent text pieces joined, so that any split gives the same list
        if isinstance(item, str) and merged and isinstance(merged[-1], str):
            merged[-1] += item
        else:
            merged.append(item)
    return [(i.name, json.loads(i.arguments)) if isinstance(i, ToolCall) else i for i in merged]


@pytest.mark.parametrize(("fmt", "reply", "want"), [
    (HERMES, HERMES_REPLY, ["Let me look. ", ("get_weather", {"city": "Oslo", "unit": "C"}), "\n",
                            ("get_time", {"zone": "UTC"})]),
    (HERMES, "no call here <tool_", ["no call here <tool_"]),
    (HERMES, "<tool_call>{not json}</tool_call> ok", ["<tool_call>{not json}</tool_call> ok"]),
    (HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": {}}", ['<tool_call>{"name": "f", "arguments": {}}']),
    (LLAMA3, LLAMA3_REPLY, [("get_weather", {"city": "Oslo", "unit": "C"})]),
    (LLAMA3, ' {"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', [("a", {}), ("b", {"x": 1})]),
    (LLAMA3, "It is sunny {maybe}", ["It is sunny {maybe}"]),
    (LLAMA3, '{"weather": "sunny"}', ['{"weather": "sunny"}']),
])
def test_parser_whole_and_at_every_split(fmt, reply, want) -> None:
    assert parse(fmt, [reply]) == want
    for cut in range(1, len(reply)):
        assert parse(fmt, [reply[:cut], reply[cut:]]) == want, cut
    assert parse(fmt, list(reply)) == want


def test_content_streams_before_the_call_ends() -> None:
    parser = ToolCallParser(HERMES)
    assert parser.feed("Sure, <tool") == ["Sure, "]  # the partial tag is held back, the rest shown at once
    assert parser.feed('_call>{"name": "f", "arguments": {}') == []
    (call,) = parser.feed("}</tool_call>")
    assert call.name == "f" and json.loads(call.arguments) == {}


def test_format_from_the_template() -> None:
    assert tool_format(TOOLS_TEMPLATE) == HERMES
    assert tool_format("{{ '<|python_tag|>' }}{% if m.role == 'ipython' %}{% endif %}") == LLAMA3


# -- the server ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tools_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("gpt2-tools"), chat_template=TOOLS_TEMPLATE, context=1024)


@pytest.fixture(scope="module")
def tools_engine(tools_dir) -> ModelEngine:
    return ModelEngine.from_directory(tools_dir, progress=False, max_sequences=2)


@pytest.fixture(scope="module")
def tools_url(tools_engine) -> Iterator[str]:
    with serving(create_app(tools_engine, limits=LIMITS)) as url:
        yield url


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


ASK = [{"role": "user", "content": "weather in Oslo?"}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("seed", [0, 1])
def test_constrained_call_is_returned_as_tool_calls(tools_url, tools_engine, choice, seed) -> None:
    reply = client_of(tools_url).chat.completions.create(
        model=tools_engine.model_id, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=90, temperature=1.0,
        seed=seed)
    choice_ = reply.choices[0]
    assert choice_.finish_reason == "tool_calls", choice_.message
    (call,) = choice_.message.tool_calls
    tool = {t["function"]["name"]: t for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    assert call.type == "function" and call.id.startswith("call_") and not choice_.message.content
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"


def test_constrained_call_streams(tools_url, tools_engine) -> None:
    stream = client_of(tools_url).chat.completions.create(
        model=tools_engine.model_id, messages=ASK, tools=TOOLS, max_tokens=90, temperature=0.8, seed=3,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, stream=True)
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["get_time"] and calls[0].index == 0
    jsonschema.validate(json.loads(calls[0].function.arguments), TIME["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_llama3_format_constrained_and_parsed(tools_dir) -> None:
    """Llama 3's format end to end below the server: a call constrained by its grammar, parsed by its parser."""
    model = models.load(tools_dir, progress=False)
    guide = GrammarProcessor(tool_call_grammar(TOOLS, LLAMA3), model.tokenizer)
    text = "".join(model.generate_text(ASK, 90, temperature=1.0, seed=4, logits_processor=guide))
    parser = ToolCallParser(LLAMA3)
    items = [*parser.feed(text), *parser.finish()]
    assert len(items) == 1 and isinstance(items[0], ToolCall), text
    tool = {t["function"]["name"]: t for t in TOOLS}[items[0].name]
    jsonschema.validate(json.loads(items[0].arguments), tool["function"]["parameters"])


class ScriptedEngine(ModelEngine):
    """Test double: the server's engine whose reply is fixed text (as if the model wrote it), then EOS."""

    script = ""

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams,
                 cancelled: Callable[[], bool]) -> Iterator[int]:
        yield from [*self.encode(self.script), self.eos_token_id][:params.max_tokens]


@pytest.fixture(scope="module")
def scripted(tools_dir) -> Iterator[tuple[str, ScriptedEngine]]:
    engine = ScriptedEngine.from_directory(tools_dir, progress=False, max_sequences=1)
    with serving(create_app(engine, limits=LIMITS)) as url:
        yield url, engine


@pytest.mark.parametrize("stream", [False, True])
def test_auto_parses_a_written_call(scripted, stream) -> None:
    url, engine = scripted
    engine.script = HERMES_REPLY
    kwargs = {"model": engine.model_id, "messages": ASK, "tools": TOOLS, "max_tokens": 200}
    client = client_of(url)
    if stream:
        chunks = [c for c in client.chat.completions.create(**kwargs, stream=True) if c.choices]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [c.index for c in calls] == [0, 1]
        reason = chunks[-1].choices[0].finish_reason
    else:
        message = client.chat.completions.create(**kwargs).choices[0]
        content, calls, reason = message.message.content, message.message.tool_calls, message.finish_reason
    assert content == "Let me look. \n" and reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo", "unit": "C"}), ("get_time", {"zone": "UTC"})]
    engine.script = HERMES_REPLY  # tool_choice none: the text as written, no parsing
    reply = client.chat.completions.create(**kwargs, tool_choice="none").choices[0]
    assert reply.message.content == HERMES_REPLY and not reply.message.tool_calls and reply.finish_reason == "stop"


def test_tools_and_calls_are_rendered_by_the_template(tools_dir, tools_url, tools_engine) -> None:
    """The prompt the server builds (seen through vLLM's /tokenize) equals transformers' rendering of the same
    conversation, earlier calls' arguments given as objects as transformers expects."""
    (transformers,) = references.require("transformers")
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": '{"city": "Oslo", "unit": "C"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"}]
    got = httpx.post(tools_url + "/tokenize", json={"messages": messages, "tools": TOOLS}, timeout=10).json()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tools_dir / "tokenizer.json"),
                                 **json.loads((tools_dir / "tokenizer_config.json").read_text()))
    hf_messages = json.loads(json.dumps(messages))
    hf_messages[1]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo", "unit": "C"}
    text = hf.apply_chat_template(hf_messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "get_time" in text and "<tool_response>" in text
    assert got["tokens"] == tools_engine.tokenizer.encode(text, add_special_tokens=False)


def test_tool_errors(base_url, engine, tools_url, tools_engine) -> None:
    assert_error(post(base_url, "/v1/chat/completions", chat(engine, tools=TOOLS)), 400, "tools", "does not render")
    assert_error(post(tools_url, "/v1/chat/completions", chat(tools_engine, tools=[{"type": "function"}])), 400,
                 "tools")
    named = {"type": "function", "function": {"name": "nope"}}
    assert_error(post(tools_url, "/v1/chat/completions", chat(tools_engine, tools=TOOLS, tool_choice=named)), 400,
                 "tool_choice", "not in tools")
    assert_error(post(tools_url, "/v1/chat/completions", chat(tools_engine, tool_choice="required")), 400,
                 "tool_choice", "needs tools")
