"""orion.models.Llama on the shared runtime against the independent numpy fp32 reference and transformers.

Tolerance: logits agree to 2% of the reference's largest logit magnitude. Orion runs every layer in
fp16 (rounded after each op) on weights 10x llama2.c's init with non-unit norm gains, so activations
are large and fp16 rounding is visible (about 0.3% here); greedy continuations must be identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import orion
from orion import models
from orion.generation import loop, plan
from orion.generation.loop import ContextFull
from orion.generation.plan import sram_fusion_depth
from orion.models import Llama, LlamaConfig
from orion.models.llama.config import ConfigError
from orion.models.llama.weights import save_hf, save_llama2c, to_rope_convention
from orion.runtime.builder import ProgramBuilder
from support import references
from support.llama_fixtures import lively
from support.llama_reference import reference_greedy, reference_logits

TOLERANCE = 0.02  # of max |logit| (fp16 compute)
CONTEXT = 32
CONFIGS = {
    "gqa8x2-interleaved-tied": LlamaConfig(
        dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=160,
        max_position_embeddings=CONTEXT, rope_convention="interleaved", tie_embeddings=True),
    "gqa8x2-half-qwen2-bias-untied": LlamaConfig(
        dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=160,
        max_position_embeddings=CONTEXT, rope_convention="half", qkv_bias=True, model_type="qwen2", rope_theta=1e6),
    "mha4-head-dim16-half-untied": LlamaConfig(  # an explicit head_dim: 4 x 16 query channels from dim 48
        dim=48, n_layers=3, n_heads=4, n_kv_heads=4, head_dim=16, hidden_dim=64, vocab_size=96,
        max_position_embeddings=CONTEXT, rope_convention="half", rope_theta=500.0),
}



def close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE * float(np.abs(want).max()))


def prompt(config: LlamaConfig, n: int, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed + n).integers(0, config.vocab_size, n)]


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def model(request) -> Llama:
    config = CONFIGS[request.param]
    return Llama(config, lively(config, seed=len(request.param)), progress=False)


@pytest.mark.parametrize("length", [1, 7, CONTEXT])
def test_logits_match_the_reference(model, length) -> None:
    ids = prompt(model.config, length)
    close(model.logits(ids), reference_logits(model.config, model.weights, ids))


def test_prefill_then_decode_to_the_end_of_the_context(model) -> None:
    ids = prompt(model.config, CONTEXT)
    want = reference_logits(model.config, model.weights, ids)
    close(model.prefill(ids[:3]), want[2])
    for i in range(3, CONTEXT):
        close(model.decode_step(ids[i]), want[i])
    assert model.cache.length == CONTEXT
    with pytest.raises(ContextFull, match=f"holds {CONTEXT} tokens, the context length is {CONTEXT}"):
        model.decode_step(0)


def test_greedy_output_is_identical(model) -> None:
    ids = prompt(model.config, 4, seed=9)
    got = list(model.generate(ids, 20))
    assert got == reference_greedy(model.config, model.weights, ids, 20)
    assert len(set(got)) > 4  # a non-degenerate continuation


def test_gqa_cache_holds_only_the_kv_heads(model) -> None:
    c = model.config
    assert model.cache.width == c.n_kv_heads * c.head_dim and model.cache.context == CONTEXT
    assert len(model.cache.keys) == c.n_layers and model.cache.keys[0].shape[:2] == (1, c.n_kv_heads * c.head_dim)


def test_fork_keeps_the_cache_independent(model) -> None:
    ids = prompt(model.config, 6, seed=2)
    want = reference_logits(model.config, model.weights, ids + [3, 0])
    model.prefill(ids)
    twin = model.fork()
    close(twin.decode_step(3), want[6])
    close(model.decode_step(3), want[6])
    close(twin.decode_step(0), want[7])
    assert (model.cache.length, twin.cache.length) == (7, 8)


def test_the_lm_head_on_the_cpu_matches_too() -> None:
    config = CONFIGS["gqa8x2-half-qwen2-bias-untied"]
    weights = lively(config, seed=4)
    cpu = Llama(config, weights, lm_head="cpu", progress=False)
    assert cpu.decode_plan.dispatches_per_token == len(cpu.decode_plan.layer_programs)
    ids = prompt(config, 5)
    want = reference_logits(config, weights, ids + [7])
    close(cpu.logits(ids), want[:5])
    close(cpu.prefill(ids), want[4])
    close(cpu.decode_step(7), want[5])
    assert list(cpu.generate(ids[:2], 8)) == reference_greedy(config, weights, ids[:2], 8)


def test_both_rope_conventions_give_the_same_model() -> None:
    config = CONFIGS["gqa8x2-interleaved-tied"]
    weights = lively(config, seed=6)
    half_config, half_weights = to_rope_convention(config, weights, "half")
    ids = prompt(config, 9)
    want = reference_logits(config, weights, ids)
    close(Llama(half_config, half_weights, progress=False).logits(ids), want)


def test_fusion_depth_is_sized_to_the_sram_and_falls_back(monkeypatch) -> None:
    config = CONFIGS["mha4-head-dim16-half-untied"]
    weights = lively(config, seed=1)
    default = Llama(config, weights, progress=False)
    assert default.decode_plan.fusion_depth == sram_fusion_depth(config.n_layers, 2 * config.layer_param_count()) == 3
    real = ProgramBuilder.build_all

    def refuse_deep(self, kind, graphs, max_layers=1, **options):
        if kind == "decode" and max_layers > 1:
            raise orion.CompileError(f"simulated ANE compile failure at fusion depth {max_layers}")
        return real(self, kind, graphs, max_layers, **options)

    monkeypatch.setattr(ProgramBuilder, "build_all", refuse_deep)
    layered = Llama(config, weights, progress=False)
    decode = layered.decode_plan
    assert decode.fusion_depth == 1 and len(decode.layer_programs) == config.n_layers
    assert decode.dispatches_per_token == config.n_layers + len(decode.head_programs)
    ids = prompt(config, 4)
    want = reference_logits(config, weights, ids + [5])
    layered.prefill(ids)
    close(layered.decode_step(5), want[4])
    close(layered.logits(ids), want[:4])


def test_the_lm_head_runs_in_vocabulary_chunks(monkeypatch) -> None:
    """A small SRAM budget splits the LM head into several programs; their logits join seamlessly."""
    config = CONFIGS["gqa8x2-half-qwen2-bias-untied"]
    weights = lively(config, seed=5)
    monkeypatch.setattr(loop, "vocab_chunks", lambda vocab, hidden: plan.vocab_chunks(vocab, hidden, budget=12_000))
    chunked = Llama(config, weights, progress=False)
    ranges = chunked.decode_plan.head_ranges
    assert len(ranges) == len(chunked.decode_plan.head_programs) == 3
    assert [r.start for r in ranges[1:]] == [r.stop for r in ranges[:-1]] and ranges[-1].stop == config.vocab_size
    ids = prompt(config, 6)
    want = reference_logits(config, weights, ids + [8])
    close(chunked.logits(ids), want[:6])
    chunked.prefill(ids)
    close(chunked.decode_step(8), want[6])


def test_a_context_that_is_not_a_power_of_two() -> None:
    """The last prefill bucket reaches past the context (padding lanes); the prompt may fill the context."""
    config = replace(CONFIGS["gqa8x2-interleaved-tied"], max_position_embeddings=40)
    weights = lively(config, seed=8)
    m = Llama(config, weights, progress=False)
    ids = prompt(config, 40)
    close(m.logits(ids), reference_logits(config, weights, ids))
    with pytest.raises(ContextFull, match="41 tokens exceed the context length 40"):
        m.prefill(ids + [1])


def test_beyond_the_context_is_an_error_or_a_stop(model) -> None:
    ids = prompt(model.config, 4)
    with pytest.raises(ContextFull, match=f"{CONTEXT + 1} tokens exceed the context length {CONTEXT}"):
        model.logits(prompt(model.config, CONTEXT + 1))
    room = CONTEXT - len(ids)
    assert len(list(model.generate(ids, room + 10))) == room + 1  # then generation stops: no garbage


def test_a_shorter_context_caps_the_cache() -> None:
    config = replace(CONFIGS["gqa8x2-interleaved-tied"], max_position_embeddings=64)
    weights = lively(config, seed=3)
    short = Llama(config, weights, context=CONTEXT, progress=False)
    assert short.cache.context == CONTEXT
    ids = prompt(config, CONTEXT)
    close(short.prefill(ids[:5]), reference_logits(config, weights, ids[:5])[4])
    with pytest.raises(ContextFull, match=f"exceed the context length {CONTEXT}"):
        short.prefill(ids + [1])
    with pytest.raises(ConfigError, match="context=65"):
        Llama(config, weights, context=65, progress=False)


def test_the_program_cache_keeps_contexts_apart(tmp_path, monkeypatch) -> None:
    """One on-disk program cache, the same weights, two cache lengths: each model gets its own programs."""
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    config = replace(CONFIGS["gqa8x2-interleaved-tied"], max_position_embeddings=64)
    weights = lively(config, seed=4)
    first, longer, again = (Llama(config, weights, context=t, progress=False) for t in (CONTEXT, 64, CONTEXT))
    assert first.builder.cached == 0 and longer.builder.cached == 0  # a longer cache is not a cache hit
    assert again.builder.built == 0 and again.builder.cached > 0
    ids = prompt(config, 40)
    want = reference_logits(config, weights, ids)
    for m in (first, longer, again):
        m.prefill(ids[:30])
        close(m.decode_step(ids[30]), want[30])


def test_the_registry_loads_directories_and_llama2c_files(tmp_path) -> None:
    config = replace(CONFIGS["gqa8x2-interleaved-tied"], n_heads=4, bos_token_id=1, eos_token_ids=(2,))
    weights = lively(config, seed=5)
    ids = prompt(config, 6)
    want = reference_logits(config, weights, ids)
    save_llama2c(tmp_path / "stories.bin", config, weights)
    from_bin = models.load(tmp_path / "stories.bin", progress=False)
    assert isinstance(from_bin, Llama) and from_bin.config.rope_convention == "interleaved"
    close(from_bin.logits(ids), want)
    with pytest.raises(orion.OrionError, match="no tokenizer.json next to this llama2.c checkpoint"):
        from_bin.tokenizer  # noqa: B018
    for model_type in ("llama", "mistral"):
        save_hf(tmp_path / model_type, replace(config, model_type=model_type), weights)
        loaded = models.load(tmp_path / model_type, progress=False)
        assert loaded.config.model_type == model_type and loaded.config.rope_convention == "half"
        close(loaded.logits(ids), want)
    assert {"llama", "qwen2", "mistral"} <= set(models.model_types())
    assert "stories110m" in models.shape_names()
    with pytest.raises(orion.OrionError, match=r"or a \.bin file"):
        models.load(tmp_path / "missing")


def test_stories110m_shape() -> None:
    config = LlamaConfig.stories110m()
    assert (config.dim, config.n_layers, config.n_heads, config.hidden_dim, config.vocab_size) == \
        (768, 12, 12, 2048, 32000)
    assert (config.rope_convention, config.rope_theta, config.tie_embeddings) == ("interleaved", 10000.0, True)
    assert config.param_count() == 109_529_856


TEXT_CONFIG = replace(CONFIGS["gqa8x2-half-qwen2-bias-untied"], bos_token_id=1)
TEXT_PROMPT = [5, 9, 4]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """A Qwen2 directory with a word-level tokenizer.json ("w<i>" is id i); its EOS is the 7th greedy token."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    directory = tmp_path_factory.mktemp("qwen2")
    weights = lively(TEXT_CONFIG, seed=2)
    greedy = reference_greedy(TEXT_CONFIG, weights, TEXT_PROMPT, 12)
    save_hf(directory, replace(TEXT_CONFIG, eos_token_ids=(greedy[6],)), weights)
    tok = Tokenizer(tok_models.WordLevel({f"w{i}": i for i in range(TEXT_CONFIG.vocab_size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    return directory, greedy[: greedy.index(greedy[6]) + 1]


def continuation(tokenizer, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text ``new_ids`` add after the prompt, as the tokenizer decodes the whole sequence; a final
    end-of-sequence id adds no text (generate_text streams text incrementally, without the EOS)."""
    if new_ids and new_ids[-1] in tokenizer.eos_token_ids:
        new_ids = new_ids[:-1]
    return tokenizer.decode(prompt_ids + new_ids)[len(tokenizer.decode(prompt_ids)):]


def test_text_generation_stops_at_the_eos_of_the_model_config(text_dir) -> None:
    directory, want = text_dir
    m = models.load(directory, progress=False)
    assert m.display_name == "Qwen2" and m.tokenizer.eos_token_ids == (want[-1],)
    prompt = " ".join(f"w{t}" for t in TEXT_PROMPT)
    expected = continuation(m.tokenizer, m.tokenizer.encode(prompt), want)
    assert "".join(m.generate_text(prompt, 12)) == expected and expected.startswith(" w")


def test_a_llama2c_file_uses_the_tokenizer_json_beside_it_with_bos_1_and_eos_2(text_dir, tmp_path) -> None:
    import shutil

    config = replace(CONFIGS["gqa8x2-interleaved-tied"], n_heads=4, bos_token_id=1, eos_token_ids=(2,))
    weights = lively(config, seed=7)
    save_llama2c(tmp_path / "model.bin", config, weights)
    shutil.copy(text_dir[0] / "tokenizer.json", tmp_path)
    m = models.load(tmp_path / "model.bin", progress=False)
    assert m.tokenizer.encode("w5 w9") == [1, 5, 9] and m.tokenizer.eos_token_ids == (2,)
    greedy = reference_greedy(config, weights, [1, 5, 9], 10)
    want = greedy[: greedy.index(2) + 1] if 2 in greedy else greedy
    assert "".join(m.generate_text("w5 w9", 10)) == continuation(m.tokenizer, [1, 5, 9], want)


def test_bos_follows_the_tokenizer_post_processor_when_no_file_says(text_dir, tmp_path) -> None:
    """Llama 3 style: tokenizer.json's post-processor adds BOS, tokenizer_config.json has no add_bos_token."""
    import shutil

    from tokenizers import Tokenizer, processors

    directory = text_dir[0]
    for name in ("config.json", "model.safetensors"):
        shutil.copy(directory / name, tmp_path)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert models.load(directory, progress=False).tokenizer.encode("w5 w9") == [5, 9]  # no post-processor: no BOS
    tok.post_processor = processors.TemplateProcessing(single="w1 $A", special_tokens=[("w1", 1)])
    tok.save(str(tmp_path / "tokenizer.json"))
    assert models.load(tmp_path, progress=False).tokenizer.encode("w5 w9") == [1, 5, 9]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    assert models.load(tmp_path, progress=False).tokenizer.encode("w5 w9") == [5, 9]  # the file's word wins


def run_module(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ORION_CACHE_DIR": "off"}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, env=env)


def test_the_command_line_streams_text_and_benchmarks_a_llama2c_file(text_dir, tmp_path) -> None:
    directory, want = text_dir
    text = " ".join(f"w{t}" for t in TEXT_PROMPT)
    out = run_module("orion", "generate", "--model", str(directory), "--prompt", text, "--max-new-tokens", "12")
    assert out.returncode == 0, out.stderr
    tokenizer = models.load(directory, progress=False).tokenizer
    assert out.stdout == text + continuation(tokenizer, tokenizer.encode(text), want) + "\n"
    config = replace(CONFIGS["gqa8x2-interleaved-tied"], n_heads=4)
    save_llama2c(tmp_path / "tiny.bin", config, lively(config))
    out = run_module("orion.bench", "decode", "--model", str(tmp_path / "tiny.bin"), "--prompt-tokens", "3",
                     "--new-tokens", "4", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["parameters"] == config.param_count() and result["config"]["rope_convention"] == "interleaved"
    assert result["dispatches_per_token"] >= 2 and result["bytes_per_token"] > 2 * config.param_count()


# -- against transformers on checkpoints it saved ----------------------------------------------------

def _hf_model(kind: str, tied: bool, seed: int):
    torch, transformers = references.require("torch", "transformers")
    torch.manual_seed(seed)
    shape = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 80, "num_hidden_layers": 2,
             "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": CONTEXT,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2}
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, rope_theta=500.0))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape, rope_theta=1e6))
    with torch.no_grad():  # lively weights: every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.08))
    return torch, model.eval()


@pytest.mark.parametrize("kind,tied", [("llama", False), ("qwen2", True)])
def test_orion_matches_transformers_on_a_checkpoint_it_saved(tmp_path, kind, tied) -> None:
    torch, hf = _hf_model(kind, tied, seed=11 + tied)
    hf.save_pretrained(tmp_path)
    m = models.load(tmp_path, progress=False)
    assert (m.config.model_type, m.config.qkv_bias, m.config.tie_embeddings) == (kind, kind == "qwen2", tied)
    ids = [int(i) for i in np.random.default_rng(5).integers(0, 96, CONTEXT)]
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].float().numpy()
    close(m.logits(ids), want)
    close(m.prefill(ids[:4]), want[3])
    close(m.decode_step(ids[4]), want[4])
    hf.generation_config.eos_token_id = None  # greedy through EOS, as generate(stop=None) does
    with torch.no_grad():
        hf_greedy = hf.generate(torch.tensor([ids[:3]]), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert list(m.generate(ids[:3], 16)) == hf_greedy[0, 3:].tolist()


def test_llama_text_stops_on_a_string_and_streams_sentencepiece_text_whole(tmp_path) -> None:
    """The stop-string and incremental-text rules hold for the Llama family: a Metaspace (SentencePiece)
    tokenizer with byte fallback (byte tokens join into characters), and a stop string that spans tokens."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers import models as tok_models

    config = replace(CONFIGS["gqa8x2-interleaved-tied"], n_heads=4, vocab_size=320)  # 259 specials + merges
    tok = Tokenizer(tok_models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tok.train_from_iterator(["the engine runs café 日本 tokens one at a time"] * 20,
                            trainers.BpeTrainer(vocab_size=config.vocab_size, special_tokens=specials))
    assert tok.get_vocab_size() <= config.vocab_size
    save_hf(tmp_path, replace(config, bos_token_id=1, eos_token_ids=(2,)), lively(config, seed=5))
    tok.save(str(tmp_path / "tokenizer.json"))
    m = models.load(tmp_path, progress=False)
    ids = list(m.generate("the engine", 12))
    new = [t for t in ids if t != 2][:12]
    full = continuation(m.tokenizer, m.tokenizer.encode("the engine"), new)
    assert "".join(m.generate_text("the engine", 12)) == full  # random weights may emit invalid bytes: as decode does
    assert len(full) > 3
    stop = full[1:3]  # a two-character stop string, wherever tokens split it
    assert "".join(m.generate_text("the engine", 12, stop=stop)) == full[: full.index(stop)]
