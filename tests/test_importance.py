"""Importance matrices (orion.importance, llama.cpp's imatrix) and the LUT quantizer that uses them.

The collected values are checked against transformers: forward hooks on the same weights in a Hugging Face
directory see each projection's input, and the mean of its squares per channel is what Orion must give
(tolerance: fp32 sums of a few hundred squares, relative 1e-4). The weighted k-means is checked against the
fixed point of weighted Lloyd's steps computed here in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from orion import importance, models, quant
from orion.importance import ImportanceError
from orion.models import LlamaConfig
from orion.models.llama.graphs import group_rows
from orion.models.llama.weights import random_weights as llama_weights
from orion.models.llama.weights import save_hf as save_llama
from support import references
from support.text_fixtures import write_model_dir

LLAMA = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                    max_position_embeddings=64, qkv_bias=True, model_type="qwen2")
IDS = [int(t) for t in np.random.default_rng(3).integers(0, 128, 70)]


def hooked_mean_squares(torch, model, ids: list[int], window: int) -> dict[str, np.ndarray]:
    """transformers' mean of x**2 per channel of every Linear / Conv1D input, by module path, over ``ids`` run in
    windows of ``window`` tokens (each from position 0, as Orion's calibration runs them)."""
    sums: dict[str, np.ndarray] = {}
    hooks = []
    for path, module in model.named_modules():
        if type(module).__name__ in ("Linear", "Conv1D") and path != "lm_head":
            def hook(_, inputs, __, path=path) -> None:
                x = inputs[0].detach().double().reshape(-1, inputs[0].shape[-1])
                sums[path] = sums.get(path, 0) + (x * x).sum(0).numpy()
            hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        for start in range(0, len(ids), window):
            model(torch.tensor([ids[start:start + window]]))
    for h in hooks:
        h.remove()
    return {path: s / len(ids) for path, s in sums.items()}


def close(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    err = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert err < 1e-4, f"{what}: relative error {err:.2e}"


def test_a_llama_models_importance_is_the_mean_square_of_each_projections_input(tmp_path) -> None:
    torch, transformers = references.require("torch", "transformers")
    weights = llama_weights(LLAMA, seed=5)
    save_llama(tmp_path, LLAMA, weights)
    found = importance.collect(models.load(tmp_path, progress=False), IDS, "random ids", window=32, progress=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ref = hooked_mean_squares(torch, hf, IDS, 32)
    assert len(found.layers) == LLAMA.n_layers and found.tokens == len(IDS)
    for i, layer in enumerate(found.layers):
        hf_layer = f"model.layers.{i}."
        for ours, module in (("wk", "self_attn.k_proj"), ("wv", "self_attn.v_proj"), ("wq_g0", "self_attn.q_proj"),
                             ("wq_g1", "self_attn.q_proj"), ("w_gate", "mlp.gate_proj"), ("w_up", "mlp.up_proj"),
                             ("w_down", "mlp.down_proj")):
            close(layer[ours], ref[hf_layer + module], f"layer {i} {ours}")
        for j in range(LLAMA.group_size):  # o_proj's input columns of query group j
            close(layer[f"wo_g{j}"], ref[hf_layer + "self_attn.o_proj"][group_rows(LLAMA, j)], f"layer {i} wo_g{j}")


def test_a_gpt2_models_importance_is_the_mean_square_of_each_projections_input(tmp_path) -> None:
    torch, transformers = references.require("torch", "transformers")
    write_model_dir(tmp_path)
    found = importance.collect(models.load(tmp_path, progress=False), IDS, "random ids", window=64, progress=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ref = hooked_mean_squares(torch, hf, IDS, 64)
    for i, layer in enumerate(found.layers):
        h = f"transformer.h.{i}."
        for ours, module in (("w_q", "attn.c_attn"), ("w_k", "attn.c_attn"), ("w_v", "attn.c_attn"),
                             ("w_attn_out", "attn.c_proj"), ("w_fc", "mlp.c_fc"), ("w_proj", "mlp.c_proj")):
            close(layer[ours], ref[h + module], f"layer {i} {ours}")


def weighted_lloyd_step(values: np.ndarray, weight: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """One weighted Lloyd step in float64: each value to its nearest centroid, each centroid the weighted mean of
    its values (kept when it has none)."""
    nearest = np.abs(values[:, None] - centroids[None, :]).argmin(axis=1)
    out = centroids.copy()
    for k in range(len(centroids)):
        mass = weight[nearest == k].sum()
        if mass > 0:
            out[k] = (weight[nearest == k] * values[nearest == k]).sum() / mass
    return out


def test_the_weighted_kmeans_converges_to_a_fixed_point_of_weighted_lloyds_steps() -> None:
    rng = np.random.default_rng(0)
    groups = rng.standard_normal((3, 200)) * rng.uniform(0.5, 2.0, (3, 1))
    columns = rng.uniform(0.0, 3.0, 200) ** 3
    found = quant.kmeans_luts(groups, 8, iterations=200, power=1.0, importance=columns)
    for g in range(3):
        weight = columns * np.abs(groups[g]) + np.finfo(np.float64).tiny
        np.testing.assert_allclose(weighted_lloyd_step(groups[g], weight, found[g]), found[g], rtol=1e-9, atol=1e-12)
    plain = quant.kmeans_luts(groups, 8, iterations=200, power=1.0)
    assert not np.allclose(found, plain), "the importance changed nothing"


def test_uniform_importance_gives_the_unweighted_luts_bit_for_bit() -> None:
    w = np.random.default_rng(1).standard_normal((16, 40)).astype(np.float32)
    for bits in (4, 6):
        plain, even = quant.quantize_lut(w, bits), quant.quantize_lut(w, bits, importance=np.full(40, 2.5))
        assert np.array_equal(plain.lut, even.lut) and np.array_equal(plain.indices, even.indices)


def test_a_weight_of_an_important_input_keeps_its_value_better() -> None:
    w = np.random.default_rng(2).standard_normal((8, 64))
    important = np.ones(64)
    important[5] = 1e4
    plain = np.abs(quant.quantize_lut(w, 4).dequantized() - w)[:, 5].mean()
    weighted = np.abs(quant.quantize_lut(w, 4, importance=important).dequantized() - w)[:, 5].mean()
    assert weighted < plain / 4, (weighted, plain)


def test_an_importance_file_round_trips_and_is_refused_for_other_weights_and_modes(tmp_path) -> None:
    save_llama(tmp_path / "a", LLAMA, llama_weights(LLAMA, seed=5))
    save_llama(tmp_path / "b", LLAMA, llama_weights(LLAMA, seed=6))
    found = importance.collect(models.load(tmp_path / "a", progress=False), IDS[:40], "ids", progress=False)
    path = found.save(tmp_path / "a.imatrix")
    assert path.name == "a.imatrix.npz"
    again = importance.read(path)
    assert again.digest == found.digest and again.fingerprint == found.fingerprint and again.tokens == 40
    lut = models.load(tmp_path / "a", progress=False, quant="lut6", profile="permissive", imatrix=path)
    plain = models.load(tmp_path / "a", progress=False, quant="lut6", profile="permissive")
    assert lut.weights.importance is not None and plain.weights.importance is None
    assert lut.program_identity()["importance"] == found.digest and "importance" not in plain.program_identity()
    with pytest.raises(ImportanceError, match="collected on weights"):
        models.load(tmp_path / "b", progress=False, quant="lut6", profile="permissive", imatrix=path)
    for mode in ("fp16", "int8", "int4"):
        with pytest.raises(ImportanceError, match="does not use an importance matrix"):
            models.load(tmp_path / "a", progress=False, quant=mode, profile="permissive", imatrix=path)
    with pytest.raises(ImportanceError, match=r"token ids \[128\] are outside the model's vocabulary"):
        importance.collect(models.load(tmp_path / "a", progress=False), [5, 128], "ids", progress=False)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ImportanceError, match="not an Orion importance file"):
        importance.read(tmp_path / "bad.npz")
    short = importance.Importance(found.layers[:1], found.fingerprint, 40, "one layer")
    with pytest.raises(ImportanceError, match="1 layers, the model has 2"):
        models.load(tmp_path / "a", progress=False, quant="lut4", profile="permissive", imatrix=short)


def test_a_lut_model_with_an_importance_matrix_quantizes_by_it(tmp_path) -> None:
    """The programs' LUTs are the quantizer's with each layer's importance (the graph's quantized consts)."""
    save_llama(tmp_path, LLAMA, llama_weights(LLAMA, seed=5))
    model = models.load(tmp_path, progress=False, quant="lut4", profile="permissive")
    found = importance.collect(model, IDS, "ids", progress=False)
    weighted = models.load(tmp_path, progress=False, quant="lut4", profile="permissive", imatrix=found)
    graph = weighted.prefill_graph(range(1), 32)
    const = next(n for n in graph.nodes if n.op == "const" and "quantized" in n.attrs and "down" in n.name)
    w_down = model.weights.layers[0].w_down
    expected = quant.quantize_lut(w_down, 4, importance=found.layers[0]["w_down"])
    assert np.array_equal(const.attrs["quantized"].lut, expected.lut)
    assert not np.array_equal(quant.quantize_lut(w_down, 4).lut, expected.lut)


def test_the_imatrix_command_writes_a_file_a_lut_model_loads(tmp_path, capsys) -> None:
    from orion.importance_cli import main

    write_model_dir(tmp_path / "m")
    (tmp_path / "cal.txt").write_text("the neural engine runs the model. hello world, hello engine. " * 20)
    assert main(["--model", str(tmp_path / "m"), "--text", str(tmp_path / "cal.txt"), "--out",
                 str(tmp_path / "m.npz"), "--window", "64", "--quiet"]) == 0
    assert "wrote" in capsys.readouterr().out
    lut = models.load(tmp_path / "m", progress=False, quant="lut6", profile="permissive", imatrix=tmp_path / "m.npz")
    assert lut.weights.importance.tokens > 64
    (tmp_path / "empty.txt").write_text("  \n")
    assert main(["--model", str(tmp_path / "m"), "--text", str(tmp_path / "empty.txt"), "--quiet"]) == 1
    assert "empty" in capsys.readouterr().err
