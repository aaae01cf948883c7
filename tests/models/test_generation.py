"""The model-independent runtime: the registry, the KV cache's shapes, the generation loop's errors
and the tokenizer's special tokens, exercised through GPT-2.

References: the independent numpy GPT-2 (support.gpt2_reference; tolerance 3% of the largest logit,
as in test_gpt2_model.py) and hand-computed shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers import models as tok_models

import orion
from orion import models
from orion.generation.kv_cache import KVCache
from orion.generation.loop import ActivationOverflow, ContextFull
from orion.models import GPT2, GPT2Config
from orion.models.gpt2.config import ConfigError
from orion.models.gpt2.weights import save_hf
from support.gpt2_fixtures import lively_weights
from support.gpt2_reference import reference_logits

CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=512, n_positions=128)
DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000


@pytest.fixture(scope="module")
def model() -> GPT2:
    return GPT2(CONFIG, lively_weights(CONFIG, seed=3), progress=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt2")
    save_hf(directory, CONFIG, lively_weights(CONFIG, seed=3))
    return directory


def test_import_orion_then_models_works() -> None:
    code = "import orion; print(orion.models.GPT2.__name__, orion.models.model_types())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("GPT2 ['gemma2', 'gemma3_text', 'gpt2', 'llama', 'mistral', 'phi3', 'qwen2', 'qwen3', "
                                  "'smollm3']")


def test_load_picks_the_class_from_model_type(model_dir) -> None:
    loaded = models.load(model_dir, progress=False)
    assert type(loaded) is GPT2 and loaded.config == CONFIG
    ids = [3, 1, 4, 1, 5]
    want = reference_logits(CONFIG, loaded.weights, ids)
    np.testing.assert_allclose(loaded.logits(ids), want, rtol=0, atol=0.03 * float(np.abs(want).max()))


def test_load_refuses_an_unknown_or_missing_model_type(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(models.UnknownModel,
                       match=r"config.json: has model_type 'mamba'; "
                             r"Orion runs model types \['gemma2', 'gemma3_text', 'gpt2', 'llama', 'mistral', 'phi3', "
                             r"'qwen2', 'qwen3', 'smollm3'\]"):
        models.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"n_layer": 2}))
    with pytest.raises(models.UnknownModel, match="config.json: has no model_type"):
        models.load(tmp_path)
    with pytest.raises(orion.OrionError, match="no such directory"):
        models.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(orion.OrionError, match="config.json: no such file"):
        models.load(tmp_path / "empty")


def test_a_deeply_nested_config_is_an_orion_error(tmp_path) -> None:
    (tmp_path / "config.json").write_text(DEEP)
    for load in (models.load, GPT2Config.from_hf_json, GPT2.from_pretrained):
        with pytest.raises(orion.OrionError, match=r"config.json: nested too deeply"):
            load(tmp_path)


def test_random_shapes_by_name_or_config() -> None:
    assert {"gpt2", "124m"} <= set(models.shape_names())
    small = models.random(CONFIG, seed=3, progress=False)
    assert type(small) is GPT2 and small.config == CONFIG
    np.testing.assert_array_equal(small.weights.wte, GPT2.random(CONFIG, seed=3, progress=False).weights.wte)
    with pytest.raises(models.UnknownModel, match=r"no random shape named 'gpt5'; the registered shapes are \["):
        models.random("gpt5")
    with pytest.raises(models.UnknownModel, match="dict is not the config of a registered model"):
        models.random({"n_layer": 2})


def test_kv_cache_holds_only_the_kv_heads(model) -> None:
    cache = model.cache  # 4 query heads of 8 channels over 2 KV heads (GQA 2:1) would hold 16 channels
    d = model.dims
    assert cache.keys[0].shape == (1, d.kv_heads * d.head_dim, cache.bucket)
    assert len(cache.keys) == len(cache.values) == d.n_layer and cache.masks[0].shape == (1, cache.bucket)
    small = KVCache(layers=3, kv_heads=2, head_dim=16, context=64)
    assert small.width == 32 and small.buckets == (64,) and small.length == 0


def test_nan_logits_stop_generate_naming_the_step(model, monkeypatch) -> None:
    nan = np.full(CONFIG.vocab_size, np.nan, np.float32)
    monkeypatch.setattr(model, "decode_step", lambda token: nan)
    tokens = model.generate([1, 2, 3], 5)
    assert isinstance(next(tokens), int)  # the prompt's logits are fine
    with pytest.raises(orion.OrionError, match=r"generate: the logits of new token 1 \(position 3\) contain NaN"):
        next(tokens)
    monkeypatch.setattr(model, "prefill", lambda ids: nan)
    with pytest.raises(orion.OrionError, match=r"new token 0 .* contain NaN"):
        list(model.generate([1, 2, 3], 5, temperature=0.7, seed=0))


def test_a_decode_step_names_the_first_layer_that_overflowed() -> None:
    """A step's layer and head programs run in one native call and the outputs are checked after it: an inf in
    layer 1's cached values (what an fp16 overflow leaves) is named at layer 1 of 3, not at the last layer nor at
    layer 0 (whose output surface layer 2's overwrote), and the step counts no position."""
    config = replace(CONFIG, n_layer=3)
    twin = GPT2(config, lively_weights(config, seed=3), progress=False, fusion_depth=1)
    twin.prefill([3, 1, 4])
    twin.cache.values[1][0, :, 1] = np.inf
    with pytest.raises(ActivationOverflow, match=r"^layer 1 overflowed fp16 .* tokens at positions 3 "):
        twin.decode_step(5)
    assert twin.cache.length == 3
    twin.cache.values[1][0, :, 1] = 0.0
    assert np.isfinite(twin.decode_step(5)).all() and twin.cache.length == 4


def test_generate_text_stops_at_the_eos_ids_of_the_model_files(model, model_dir, monkeypatch) -> None:
    vocab = {f"t{i}": i for i in range(CONFIG.vocab_size)}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(model_dir / "tokenizer.json"))
    greedy = list(model.generate([1, 2, 3], 12))
    stop = greedy[4]
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [CONFIG.vocab_size - 1, stop]}))
    loaded = models.load(model_dir, progress=False)
    assert loaded.tokenizer.eos_token_ids == (CONFIG.vocab_size - 1, stop)
    run = loaded.generate_text("t1 t2 t3", 12)
    text = "".join(run)
    # the stream is decode() of the new ids; the stop token's own text is not output
    assert text == " " + " ".join(f"t{t}" for t in greedy[: greedy.index(stop)])
    assert (run.finish_reason, run.stopped_by) == ("stop", stop)


class InGraphPositions(GPT2):
    """GPT-2 whose position embedding enters layer 0's programs as a per-position input ``pos``
    (the way a rotary model passes its tables), instead of being added on the CPU by ``embed``."""

    def embed(self, ids: list[int], positions: Sequence[int]) -> np.ndarray:
        return self.weights.wte[ids]

    def position_inputs(self, positions: range) -> dict[str, np.ndarray]:
        return {"pos": self.weights.wpe[positions.start:positions.stop].T}

    def decode_graph(self, layers: range) -> orion.Graph:
        return self._with_positions(super().decode_graph(layers), layers)

    def prefill_graph(self, layers: range, seq: int) -> orion.Graph:
        return self._with_positions(super().prefill_graph(layers, seq), layers)

    def _with_positions(self, g: orion.Graph, layers: range) -> orion.Graph:
        if layers.start == 0:
            x = g.inputs[0]
            pos = g.input("pos", x.shape)
            summed = g.add(x, pos, name="x_plus_pos")
            g.replace_uses(x, summed, skip=summed)
            g.move_after(pos, x)
            g.move_after(summed, pos)
        return g


def test_position_inputs_reach_every_layer_program_that_declares_them() -> None:
    weights = lively_weights(CONFIG, seed=5)
    model = InGraphPositions(CONFIG, weights, fusion_depth=1, progress=False)
    ids = [7, 3, 9, 1]
    want = reference_logits(CONFIG, weights, ids + [11, 12])

    def close(got: np.ndarray, ref: np.ndarray) -> None:
        np.testing.assert_allclose(got, ref, rtol=0, atol=0.03 * float(np.abs(ref).max()))

    close(model.prefill(ids), want[3])
    close(model.decode_step(11), want[4])
    close(model.decode_step(12), want[5])
    close(model.logits(ids), want[:4])


def test_progress_false_silences_weight_loading_too(model_dir, monkeypatch, capsys) -> None:
    from orion.models.gpt2 import weights as gpt2_weights

    monkeypatch.setattr(gpt2_weights, "PROGRESS_MIN_BYTES", 0)  # report even this small file
    monkeypatch.setenv("ORION_CACHE_DIR", "off")
    models.load(model_dir, progress=False)
    assert capsys.readouterr().err == ""
    models.load(model_dir)
    err = capsys.readouterr().err
    assert "loading model.safetensors" in err and "compiled 2 programs for GPT-2" in err


def test_context_length_is_read_without_building_the_model(model_dir) -> None:
    assert models.context_length(model_dir) == CONFIG.n_positions
    assert models.context_length("gpt2") == 1024 and models.context_length(CONFIG) == 128
    # every registered shape, Stories110M's interleaved RoPE among them (its config has no Hugging Face form)
    assert {name: models.context_length(name) for name in models.shape_names()} == {
        "124m": 1024, "gpt2": 1024, "stories110m": 1024}


def test_a_gpt2_context_option_caps_the_cache_like_a_llama_one(model_dir) -> None:
    """``context`` (any family, through ``models.load``): the KV cache holds that many positions, the logits are the
    reference's, one position more is refused; a context past ``n_positions`` is an error naming the fix."""
    short = models.load(model_dir, progress=False, context=32)
    assert short.cache.context == 32
    ids = [int(t) for t in np.random.default_rng(5).integers(0, CONFIG.vocab_size, 33)]
    want = reference_logits(CONFIG, lively_weights(CONFIG, seed=3), ids[:20])[-1]
    got = short.prefill(ids[:20])
    assert np.max(np.abs(got - want)) <= 0.03 * np.max(np.abs(want))
    with pytest.raises(ContextFull, match="exceed the context length 32"):
        short.prefill(ids)
    for bad in (129, 0, 1.5, True):
        with pytest.raises(ConfigError, match=f"context={bad!r}; .* n_positions \\(128\\)"):
            models.load(model_dir, progress=False, context=bad)


def test_a_misspelt_load_option_is_refused_before_the_weights_are_read(model_dir, monkeypatch) -> None:
    """An option the model's class does not take is an Orion error naming it, the closest option and the
    accepted ones, raised before the checkpoint is opened (it was a bare TypeError after reading it)."""
    read = []
    monkeypatch.setattr(GPT2, "from_pretrained", classmethod(lambda cls, *a, **k: read.append(a)))
    with pytest.raises(models.UnknownOption, match="GPT2 takes no option 'progres'. Fix: did you mean "
                                                            "'progress'\\? its options are context, .*quant"):
        models.load(model_dir, progres=False)
    with pytest.raises(models.UnknownOption, match="random\\(\\): GPT2 takes no option 'quantt'.*'quant'"):
        models.random("gpt2", quantt="int8")
    assert read == []
