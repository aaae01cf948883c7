"""BF16 checkpoints (how most models are published) are converted once, into a copy in the program cache that
later starts map: the loaded arrays are views of that map, equal bit for bit to torch's bf16 -> fp16
conversion, and a warm start converts nothing. A damaged copy is written again; with the cache off the
tensors are converted into memory, with the same values."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from orion import program_cache
from orion.errors import ConstraintError
from orion.models import load, weights_io
from orion.models.llama.config import LlamaConfig
from orion.models.llama.weights import load_hf, random_weights, save_hf
from orion.runtime.pages import map_of

CONFIG = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=4096,
                     max_position_embeddings=64, rope_convention="half")
IDS = [5, 900, 17, 4000, 33, 2, 71]


def save_bf16(tmp_path, extremes: bool = False):
    weights = random_weights(CONFIG, seed=3)
    if extremes:
        weights.layers[0].wq[0, :3] = [1e-8, -70000.0, 3.0e-5]  # fp16 zero, beyond fp16 (-inf), an fp16 subnormal
    save_hf(tmp_path / "hf", CONFIG, weights, dtype="bfloat16")
    return tmp_path / "hf"


@pytest.fixture
def bf16_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    return save_bf16(tmp_path)


def converted_files(directory) -> list:
    folder = directory.parent / "cache" / program_cache.CONVERTED
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_bf16_tensors_are_views_of_a_converted_copy_equal_to_torchs_conversion(tmp_path, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    bf16_dir = save_bf16(tmp_path, extremes=True)
    _, weights = load_hf(bf16_dir, progress=False)
    (copy,) = converted_files(bf16_dir)
    stored = load_file(str(bf16_dir / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in stored.values())
    mapped = weights.source.files[0].copy
    assert mapped is not None and mapped.path == copy
    for name, array in weights.arrays():
        assert array.dtype == np.float16 and not array.flags.writeable and not array.flags.owndata, name
        assert mapped.offset_of(array) is not None, name  # a view of the copy's map
    wq = weights.layers[0].wq
    reference = stored["model.layers.0.self_attn.q_proj.weight"].to(torch.float16).numpy()
    np.testing.assert_array_equal(wq.view(np.uint16), reference.view(np.uint16))  # bit for bit, -inf included
    assert wq[0, 1] == -np.inf and wq[0, 0] == 0
    with pytest.raises(ConstraintError, match="node 'l0_qkv_weight': the constant has 1 infinite"):
        load(bf16_dir, progress=False)  # refused as the in-memory conversion's -inf is


def test_a_warm_start_maps_the_copy_and_converts_nothing(bf16_dir, monkeypatch) -> None:
    cold = load(bf16_dir, progress=False).logits(IDS)
    (copy,) = converted_files(bf16_dir)
    inode = copy.stat().st_ino
    time.sleep(program_cache.RACY_NS / 1e9)
    monkeypatch.setattr(program_cache, "_MEMO", {})  # as a new process
    monkeypatch.setattr(program_cache, "_MEMO_LOGS", {})
    monkeypatch.setattr(weights_io, "_write_copy", lambda *a: pytest.fail("converted again"))
    model = load(bf16_dir, progress=False)
    assert not any(a.flags.owndata for _, a in model.weights.arrays())  # views of the copy
    np.testing.assert_array_equal(model.logits(IDS), cold)
    assert model.builder.built == 0 and model.builder.cached > 0  # the copy's weight files are named as before
    assert copy.stat().st_ino == inode


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "header"])
def test_a_damaged_copy_is_converted_again_with_one_warning(bf16_dir, monkeypatch, capsys, damage) -> None:
    cold = load(bf16_dir, progress=False).logits(IDS)
    (copy,) = converted_files(bf16_dir)
    data = bytearray(copy.read_bytes())
    if damage == "truncated":
        del data[-2:]
    elif damage == "zeroed":
        data[len(data) // 2:] = bytes(len(data) - len(data) // 2)
    else:
        data[20:24] = b"XXXX"
    copy.write_bytes(bytes(data))
    monkeypatch.setattr(program_cache, "_MEMO", {})
    monkeypatch.setattr(program_cache, "_MEMO_LOGS", {})
    monkeypatch.setenv("ORION_CACHE_DIR", str(bf16_dir.parent / "cache"))
    capsys.readouterr()
    np.testing.assert_array_equal(load(bf16_dir, progress=False).logits(IDS), cold)
    assert capsys.readouterr().err.count("damaged converted copy") == 1
    source = weights_io.MappedSafetensors(bf16_dir / "model.safetensors", convert=False)
    assert converted_files(bf16_dir) == [copy]
    layout = weights_io._copy_layout(source)  # noqa: SLF001
    assert weights_io.copy_agrees(copy, layout, lambda name: weights_io._copy_samples(source, name))  # noqa: SLF001


def test_with_the_cache_off_tensors_are_converted_in_memory_to_the_same_values(bf16_dir, monkeypatch) -> None:
    _, mapped = load_hf(bf16_dir, progress=False)
    monkeypatch.setenv("ORION_CACHE_DIR", "off")
    _, in_memory = load_hf(bf16_dir, progress=False)
    assert in_memory.source.files[0].copy is None
    for (name, a), (_, b) in zip(mapped.arrays(), in_memory.arrays()):
        assert map_of(b) is None and not b.flags.writeable, name  # in memory, read-only
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16), err_msg=name)


def test_an_unwritable_cache_falls_back_to_converting_in_memory(bf16_dir, monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(program_cache.tempfile, "mkstemp", refused)  # as a read-only cache directory
    _, weights = load_hf(bf16_dir, progress=False)
    assert weights.source.files[0].copy is None and converted_files(bf16_dir) == []
    assert all(map_of(a) is None for _, a in weights.arrays())  # in memory


def test_copies_are_evicted_least_recently_used_and_cleared(bf16_dir, tmp_path) -> None:
    cache = tmp_path / "cache"
    load_hf(bf16_dir, progress=False)
    (copy,) = converted_files(bf16_dir)
    usage = program_cache.usage(cache)
    assert usage["converted"] == 1 and usage["bytes"] >= copy.stat().st_size
    past = time.time() - 100
    os.utime(copy, (past, past))
    program_cache.lower_cached({"test": "newer entry"}, _graph)
    program_cache.enforce_cap(cache, program_cache.usage(cache)["bytes"] - 1)  # the copy is the oldest: it goes
    assert converted_files(bf16_dir) == [] and program_cache.usage(cache)["entries"] == 1
    load_hf(bf16_dir, progress=False)
    assert len(converted_files(bf16_dir)) == 1
    program_cache.clear(cache)
    assert converted_files(bf16_dir) == []


def _graph():
    import orion

    g = orion.Graph("lru")
    g.output(g.relu(g.linear(g.input("x", [1, 16, 1, 32]), np.eye(16, dtype=np.float32))), "y")
    return g
