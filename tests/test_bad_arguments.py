"""Misuse at the API gives an Orion error (or, for an argument of the wrong type, a TypeError raised
before anything is allocated), never another exception: config and tokenizer files, the graph builder,
probe reports, ``orion.compile`` and ``orion.Surface``, sampling settings and chat templates."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models

import orion
from orion.generation.chat import ChatTemplate
from orion.generation.sampling import apply_repetition_penalty, next_token, sampling_probs
from orion.generation.tokenizer import load_tokenizer
from orion.graph import Graph
from orion.probes import load_report, relaxations
from support.text_fixtures import write_model_dir

CONV_MIL = (Path(__file__).parent / "fuzz" / "targets.py").read_text().split('CONV_MIL = """', 1)[1].split('"""')[0]


# -- files ------------------------------------------------------------------------------------------
def test_config_with_a_5000_digit_integer(tmp_path) -> None:
    model = write_model_dir(tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config).replace('"n_layer": 2', '"n_layer": ' + "9" * 5000))
    with pytest.raises(orion.OrionError, match="config.json"):
        orion.models.GPT2.from_pretrained(model, progress=False)


def test_tokenizer_with_an_empty_vocabulary(tmp_path) -> None:
    Tokenizer(models.BPE()).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(orion.OrionError, match="vocabulary is empty"):
        load_tokenizer(tmp_path).encode("hello")


# -- the graph builder ------------------------------------------------------------------------------
def test_node_of_another_graph() -> None:
    other = Graph("other").input("x", [1, 8, 1, 32])
    g = Graph("g")
    x = g.input("x", [1, 8, 1, 32])
    for build in (lambda: g.add(x, other), lambda: g.relu(other), lambda: g.output(other, "y")):
        with pytest.raises(orion.OrionError, match="another graph"):
            build()


@pytest.mark.parametrize("weight", ["abc", None, {"w": 1}, [["a"]]])
def test_weight_that_is_not_numbers(weight) -> None:
    g = Graph("g")
    with pytest.raises(orion.OrionError, match="operand"):
        g.linear(g.input("x", [1, 8, 1, 32]), weight)


def test_pad_beyond_the_tensor_limit_is_refused_before_allocating() -> None:
    g = Graph("g")
    with pytest.raises(orion.OrionError, match="elements"):
        g.pad(g.input("x", [1, 8, 1, 32]), axis=3, before=0, after=2**31)


@pytest.mark.parametrize("report", [[], None, "x", {"schema": None}, {"schema": "orion-probes/1", "backend": "ane",
                                                                       "probes": []}])
def test_malformed_probe_report(report, tmp_path, monkeypatch) -> None:
    from orion import probes

    monkeypatch.setattr(probes, "machine", lambda: {"chip": None, "os": None, "machine": None})
    if isinstance(report, dict) and report.get("schema") == "orion-probes/1":
        report["schema"] = probes.SCHEMA
    with pytest.raises(orion.OrionError):
        relaxations(report)
    (tmp_path / "r.json").write_bytes(b"\xff[")
    with pytest.raises(orion.OrionError, match="r.json"):
        load_report(tmp_path / "r.json")


# -- orion.compile and orion.Surface ----------------------------------------------------------------
def test_compile_of_a_huge_int_is_a_type_error_before_allocating() -> None:
    """``bytes(10**12)`` would allocate a terabyte: the check must come first (run in a child with a
    1 GiB address-space cap, so the old behaviour fails instead of eating the machine)."""
    code = ("import resource, orion\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "try:\n    orion.compile(10**12)\nexcept TypeError as e:\n    print('TypeError', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("TypeError") and "str or bytes" in out.stdout, out.stdout + out.stderr[-2000:]


def test_compile_misuse() -> None:
    with pytest.raises(orion.ParseError, match="lone surrogate"):
        orion.compile(CONV_MIL.replace('string("y")', 'string("y\ud800")'))
    for bad in (-1, 2**62):
        with pytest.raises(orion.CompileError, match="min_surface_bytes"):
            orion.compile(CONV_MIL, {}, min_surface_bytes=bad)
    with pytest.raises(TypeError, match="weights must map"):
        orion.compile(CONV_MIL, [1, 2])


@pytest.mark.parametrize("shape", [(-1, 768, 1, 32), (1, -768, 1, 32), (1, 2**40), (2**20, 2**20)])
def test_surface_with_an_impossible_shape(shape) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(orion.OrionError, match="surface"):
        orion.Surface(shape)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: nothing allocated


def test_surface_argument_types() -> None:
    for shape in ("abc", 5, [1.5, 2], None):
        with pytest.raises(TypeError):
            orion.Surface(shape)
    with pytest.raises(orion.OrionError):
        orion.Surface((1, 32), nbytes=2**62)


# -- sampling and chat templates --------------------------------------------------------------------
def test_the_tiniest_temperature_and_penalty_give_a_distribution() -> None:
    logits = np.array([1.0, 3.0, -2.0, 3.0, 0.0], dtype=np.float32)
    probs = sampling_probs(logits, 5e-324, None, None)
    np.testing.assert_array_equal(probs, [0, 0.5, 0, 0.5, 0])  # the limit: the top logits, evenly
    penalized = apply_repetition_penalty(logits, [0, 1, 2, 4], 5e-324)
    assert np.isfinite(penalized).all() and penalized.dtype == logits.dtype
    assert penalized[0] == penalized[1] == penalized.max() and penalized[2] <= 0 and penalized[4] == 0
    rng = np.random.default_rng(0)
    for temperature in (5e-324, 1e-300):  # the two saturated logits share all the probability
        assert next_token(penalized, temperature, None, None, rng) in (0, 1)
    assert np.isfinite(sampling_probs(penalized, 1.0, None, None)).all()


@pytest.mark.parametrize("template", [
    "{% for i in range(10**9) %}{% endfor %}",  # the sandbox refuses ranges over 100,000 (OverflowError)
    "{{ messages[0]['content'] | int // 0 }}",  # ZeroDivisionError
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",  # RecursionError
])
def test_chat_template_the_sandbox_refuses(template, tmp_path) -> None:
    with pytest.raises(orion.OrionError, match="chat_template"):
        ChatTemplate(template, tmp_path / "tokenizer_config.json").render([{"role": "user", "content": "1"}])
