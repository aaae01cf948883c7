"""Structured output through llguidance on a random-weight model: every generated text parses and validates
against its schema (jsonschema, an independent validator), sampled or greedy; a Lark grammar holds too; bad
schemas are clear errors. Unconstrained, the same model writes no JSON at all (the constraint does the work)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from orion import models
from orion.generation.structured import Grammar, GrammarProcessor, StructuredOutputError
from support.text_fixtures import write_model_dir

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "rooms": {"type": "integer", "minimum": 1, "maximum": 40},
        "ok": {"type": "boolean"},
        "kind": {"enum": ["flat", "house", "boat"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    },
    "required": ["city", "rooms", "ok", "kind"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return models.load(write_model_dir(tmp_path_factory.mktemp("gpt2")), progress=False)


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_json_schema_output_validates(model, seed) -> None:
    grammar = Grammar.json_schema(SCHEMA)
    sampling = {} if seed is None else {"temperature": 1.0, "seed": seed}
    run = model.generate_text("the engine", 100, logits_processor=GrammarProcessor(grammar, model.tokenizer),
                              **sampling)
    text = "".join(run)
    assert run.finish_reason == "stop" and run.stopped_by == model.tokenizer.eos_token_id, text
    jsonschema.validate(json.loads(text), SCHEMA)


def test_generate_on_ids_stops_at_the_grammar_end(model) -> None:
    tok = model.tokenizer
    run = model.generate(tok.encode("hello"), 100, temperature=0.8, seed=5,
                         logits_processor=GrammarProcessor(Grammar.json_object(), tok))
    ids = list(run)
    assert ids[-1] == tok.eos_token_id and run.finish_reason == "stop"
    assert isinstance(json.loads(tok.decode(ids[:-1])), dict)


def test_without_the_grammar_the_model_writes_no_json(model) -> None:
    for seed in range(3):
        text = "".join(model.generate_text("the engine", 30, temperature=1.0, seed=seed))
        with pytest.raises(ValueError):
            json.loads(text)


def test_lark_grammar(model) -> None:
    grammar = Grammar.lark('start: "answer: " ("yes" | "no") "."')
    text = "".join(model.generate_text("hello", 20, temperature=1.0, seed=7,
                                       logits_processor=GrammarProcessor(grammar, model.tokenizer)))
    assert text in ("answer: yes.", "answer: no.")


def test_mask_allows_exactly_the_grammar_tokens(model) -> None:
    """After '{"kind":"' under an enum schema, the allowed ids are those whose text continues some enum value
    (the mask checked against the tokenizer's own decode of every id)."""
    tok = model.tokenizer
    schema = {"type": "object", "properties": {"kind": {"enum": ["flat", "house"]}}, "required": ["kind"],
              "additionalProperties": False}
    guide = GrammarProcessor(Grammar.json_schema(schema), tok)
    prefix = tok.encode('{"kind":"', add_special_tokens=False)
    for token in prefix:
        guide.consume(token)
    allowed = {i for i, v in enumerate(guide.mask(np.zeros(model.dims.vocab_size, np.float32))) if v == 0}
    continuations = ('flat"}', 'house"}')
    expected = {i for i in range(tok.vocab_size) if (piece := tok.decode([i]))
                and any(c.startswith(piece) for c in continuations)}
    assert allowed == expected and allowed


@pytest.mark.parametrize("schema, says", [
    ({"type": "nonsense"}, "nonsense"),
    ({"type": "object", "properties": 3}, "cannot be used"),
    ([1, 2], "is an object"),
])
def test_bad_schemas_are_clear_errors(schema, says) -> None:
    with pytest.raises(StructuredOutputError, match=says):
        Grammar.json_schema(schema)
