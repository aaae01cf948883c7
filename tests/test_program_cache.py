"""The program caches: lowered programs on disk (verified, rebuilt when damaged), the emulator's packed
panels on disk (mapped at a warm start, packed again when damaged) and compiled programs in this process
(never handing out an unloaded one).

Reference: numpy float32 of the small linear + relu graph (tolerance 2e-2 relative to its scale, fp16)."""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import threading
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import orion
from orion import program_cache
from orion._core import kernels
from orion.compiler import compile_lowered
from orion.program_cache import PANELS, compile_cached, lower_cached, panel_files
from orion.runtime.builder import ProgramBuilder

RNG = np.random.default_rng(0)
W = RNG.standard_normal((64, 64)).astype(np.float32) * 0.1
X = RNG.standard_normal((1, 64, 1, 32)).astype(np.float32)


def graph() -> orion.Graph:
    g = orion.Graph("cached_block")
    g.output(g.relu(g.linear(g.input("x", [1, 64, 1, 32]), W)), "y")
    return g


def reference() -> np.ndarray:
    return np.maximum(W @ X[0, :, 0, :], 0)[None, :, None, :]


def check_runs(compiled) -> None:
    want = reference()
    np.testing.assert_allclose(compiled(x=X)["y"], want, rtol=0, atol=2e-2 * float(np.abs(want).max()))


def test_a_damaged_entry_is_rebuilt_with_one_warning(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    description = {"test": "damaged entry"}
    first, cached = lower_cached(description, graph)
    assert not cached
    weight_file = max(tmp_path.glob("blobs/*"), key=lambda f: f.stat().st_size)
    weight_file.write_bytes(weight_file.read_bytes()[:-100])  # truncated, as by a full disk
    capsys.readouterr()
    again, cached = lower_cached(description, graph)
    warning = capsys.readouterr().err.strip().splitlines()
    assert not cached and len(warning) == 1
    assert "program cache entry" in warning[0] and "damaged" in warning[0] and "rebuilding" in warning[0]
    assert again.weights == first.weights
    check_runs(compile_lowered(again))
    third, cached = lower_cached(description, graph)  # the rebuilt entry is good
    assert cached and third.weights == first.weights and capsys.readouterr().err == ""


@pytest.mark.parametrize("where", ["a file", "below a file"])
def test_cache_dir_that_is_not_a_directory(tmp_path, monkeypatch, where) -> None:
    file = tmp_path / "plain"
    file.write_text("not a directory")
    setting = file if where == "a file" else file / "cache"
    monkeypatch.setenv("ORION_CACHE_DIR", str(setting))
    with pytest.raises(orion.OrionError, match=r"ORION_CACHE_DIR.*(not a directory|cannot create).*ORION_CACHE_DIR=off"):
        lower_cached({"test": "cache dir"}, graph)


def test_unloading_a_compiled_graph_does_not_poison_the_process_cache() -> None:
    first = orion.compile_graph(graph())
    check_runs(first)
    first.program.unload()
    again = orion.compile_graph(graph())
    assert again.program.loaded
    check_runs(again)


def test_buckets_share_layer_weights_on_disk(tmp_path, monkeypatch) -> None:
    from orion.models import GPT2, GPT2Config
    from orion.program_cache import BLOBS, flush, usage
    from support.gpt2_fixtures import lively_weights

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    config = GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=512, n_positions=128)
    weights = lively_weights(config, seed=0)
    model = GPT2(config, weights, fusion_depth=1, progress=False)
    model.prepare(1)  # the decode layer programs (at depth 1 they wait for their first use)
    flush()  # their packed panels are written by a thread: count them here, not in the buckets' growth
    after_decode = usage(tmp_path)["bytes"]
    for n in (5, 40, 70):  # three prefill buckets: 32, 64 and 128 tokens
        model.prefill(list(range(n)))
    flush()
    layer_bytes = 2 * sum(a.size for name, a in weights.arrays() if name.startswith("blocks."))
    grown = usage(tmp_path)["bytes"] - after_decode
    assert grown < layer_bytes / 2  # three buckets add MIL text and small constants, not the layers again
    blob_bytes = sum(f.stat().st_size for f in (tmp_path / BLOBS).iterdir())
    assert layer_bytes <= blob_bytes < 1.5 * (layer_bytes + 2 * weights.wte.size)


def test_size_cap_evicts_least_recently_used_entries(tmp_path, monkeypatch) -> None:
    from orion.program_cache import enforce_cap, usage

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    descriptions = [{"test": "lru", "n": i} for i in range(3)]
    lower_cached(descriptions[0], graph)
    one = usage(tmp_path)["bytes"]
    lower_cached(descriptions[1], graph)  # the same weights: only the MIL and layout are new
    two = usage(tmp_path)["bytes"]
    assert two - one < one / 4
    import os
    import time
    entry_0 = next(p for p in tmp_path.iterdir() if (p / "manifest.json").is_file())
    past = time.time() - 100
    for p in tmp_path.iterdir():
        if (p / "manifest.json").is_file():
            os.utime(p / "manifest.json", (past, past))
    assert lower_cached(descriptions[0], graph)[1]  # a hit refreshes entry 0
    del entry_0
    monkeypatch.setenv("ORION_CACHE_MAX_SIZE", str(two))
    lower_cached(descriptions[2], graph)  # over the cap: the least recently used entry (1) goes
    assert usage(tmp_path)["entries"] == 2 and usage(tmp_path)["bytes"] <= two
    assert lower_cached(descriptions[0], graph)[1] and lower_cached(descriptions[2], graph)[1]
    assert not lower_cached(descriptions[1], graph)[1]
    enforce_cap(tmp_path, 0)  # only the newest entry survives a zero cap; its blobs stay
    assert usage(tmp_path)["entries"] == 1
    check_runs(compile_lowered(lower_cached(descriptions[1], graph)[0]))


def test_cache_info_and_clear_commands(tmp_path, monkeypatch) -> None:
    import os
    import subprocess
    import sys

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    lower_cached({"test": "cli"}, graph)
    env = {**os.environ, "ORION_CACHE_MAX_SIZE": "2G"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "orion", "cache", *a], capture_output=True, text=True,
                                    env=env, timeout=120)
    info = run("info")
    assert info.returncode == 0 and str(tmp_path) in info.stdout
    assert "1 programs, " in info.stdout and "of a 2147 MB cap" in info.stdout
    cleared = run("clear")
    assert cleared.returncode == 0 and "removed" in cleared.stdout and list(tmp_path.iterdir()) == []
    bad = subprocess.run([sys.executable, "-m", "orion", "cache", "info"], capture_output=True, text=True,
                         env={**env, "ORION_CACHE_MAX_SIZE": "lots"}, timeout=120)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ORION_CACHE_MAX_SIZE='lots'")


def test_entries_sharing_a_blob_read_it_as_one_map(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    built = [lower_cached({"test": "shared blob", "entry": i}, graph)[0] for i in range(2)]
    first, cached = lower_cached({"test": "shared blob", "entry": 0}, graph)
    second, cached_too = lower_cached({"test": "shared blob", "entry": 1}, graph)
    assert cached and cached_too and len(list((tmp_path / "blobs").iterdir())) == len(first.weights)
    for path, data in first.weights.items():
        assert data == built[0].weights[path]  # the same bytes as the lowering wrote
        assert isinstance(data, memoryview) and data.readonly
        assert data.obj is second.weights[path].obj  # one map of the blob for both entries
    check_runs(compile_lowered(first))
    check_runs(compile_lowered(second))


def test_a_warm_read_checks_no_blob_another_entry_stamped(tmp_path, monkeypatch) -> None:
    """A blob's CRC is computed when written; an entry referencing the blob later refreshes its time (a use
    stamp), which must not make the next process compute every blob's CRC again (the Qwen-shape warm
    start spent seconds there). A truncated blob is still caught (its size is part of the memo's key)."""
    import gc
    import time

    from orion import program_cache

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    lower_cached({"test": "stamped blob", "entry": 0}, graph)
    blobs = sorted((tmp_path / "blobs").iterdir())
    times_before = [b.stat().st_mtime_ns for b in blobs]
    time.sleep(0.01)
    lower_cached({"test": "stamped blob", "entry": 1}, graph)  # the same weights: the blobs' times are refreshed
    assert [b.stat().st_mtime_ns for b in blobs] != times_before
    program_cache._MEMO.clear()  # as a new process: no in-process memo, no open map
    program_cache._MEMO_LOGS.clear()
    gc.collect()
    computed: list[int] = []
    real = program_cache._checksum
    monkeypatch.setattr(program_cache, "_checksum", lambda data: computed.append(len(data)) or real(data))
    first, cached = lower_cached({"test": "stamped blob", "entry": 0}, graph)
    assert cached and len(computed) == 2  # the entry's own two files (MIL, layout); no blob
    check_runs(compile_lowered(first))
    del first
    program_cache._MEMO.clear()
    program_cache._MEMO_LOGS.clear()
    gc.collect()
    blob = max(blobs, key=lambda b: b.stat().st_size)
    blob.write_bytes(blob.read_bytes()[:-64])  # truncated in place (same inode)
    again, cached = lower_cached({"test": "stamped blob", "entry": 0}, graph)
    assert not cached
    check_runs(compile_lowered(again))


def test_storing_entries_walks_the_cache_once_not_per_entry(tmp_path, monkeypatch) -> None:
    """The cap is checked against a running count: a cold start of N programs walks the cache once (it
    walked it after each entry, quadratic in N), and still evicts once the count passes the cap."""
    from orion import program_cache

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    walks: list[int] = []
    real = program_cache._stored_bytes
    monkeypatch.setattr(program_cache, "_stored_bytes", lambda root: walks.append(1) or real(root))
    for i in range(4):
        lower_cached({"test": "one walk", "n": i}, graph)
    assert len(walks) == 1
    assert program_cache._STORED[tmp_path] == real(tmp_path)  # the running count is the cache's size
    monkeypatch.setenv("ORION_CACHE_MAX_SIZE", str(real(tmp_path) + 1))  # the next entry goes over the cap
    lower_cached({"test": "one walk", "n": 4}, graph)
    assert program_cache.usage(tmp_path)["entries"] < 5  # evicted
    assert program_cache._STORED[tmp_path] == real(tmp_path) <= int(program_cache.max_size())


def test_a_mapped_weight_is_range_checked_once_per_process(tmp_path, monkeypatch) -> None:
    """Programs sharing a checkpoint weight (decode, prefill, every KV bucket) check its values (finite, in
    fp16 range) once: a view of a read-only file map cannot change. A bad mapped weight is refused every
    time, and a writable array is checked every time."""
    import mmap

    weights = RNG.standard_normal((2, 64, 64)).astype(np.float16)
    weights[1, 3, 5] = np.nan
    path = tmp_path / "weights.bin"
    path.write_bytes(weights.tobytes())
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    good, bad = (np.frombuffer(mapped, np.float16, 64 * 64, offset=i * 64 * 64 * 2).reshape(64, 64) for i in range(2))
    writable = good.copy()
    from orion.graph import builder

    checks: list[int] = []
    real = builder._all_finite
    monkeypatch.setattr(builder, "_all_finite", lambda a: checks.append(np.size(a)) or real(a))

    def build(w: np.ndarray) -> orion.Graph:
        g = orion.Graph("mapped_weight")
        g.output(g.linear(g.input("x", [1, 64, 1, 32]), w), "y")
        return g

    def weight_checks(w: np.ndarray) -> int:
        before = len(checks)
        build(w)
        return sum(1 for n in checks[before:] if n == w.size)

    assert weight_checks(good) == 1 and weight_checks(good) == 0  # once per process
    assert weight_checks(writable) == 1 and weight_checks(writable) == 1  # a writable array: every time
    for _ in range(2):
        with pytest.raises(orion.OrionError, match="NaN"):
            build(bad)
    del good, bad


def test_a_weight_shared_by_programs_is_serialized_hashed_and_checksummed_once(tmp_path, monkeypatch) -> None:
    """Programs baking the same checkpoint values (a view of a read-only map, or a fused array derived from
    such views: orion.graph.lineage) serialize, hash and checksum their weight file once per process; a later
    program emits the stored blob. A writable array is serialized every time. Every program still computes
    the numpy reference (fp16 tolerance)."""
    import mmap

    from orion import blobfile, compiler
    from orion.graph import lineage

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    halves = RNG.standard_normal((2, 32, 64)).astype(np.float16)
    path = tmp_path / "weights.bin"
    path.write_bytes(halves.tobytes())
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    top, bottom = (np.frombuffer(mapped, np.float16, 32 * 64, offset=i * 32 * 64 * 2).reshape(32, 64) for i in range(2))
    serialized, hashed, summed = [], [], []
    real_write, real_sum, real_sha = blobfile.write, program_cache._checksum, hashlib.sha256
    monkeypatch.setattr(blobfile, "write", lambda a, **kw: serialized.append(np.size(a)) or real_write(a, **kw))
    monkeypatch.setattr(program_cache, "_checksum", lambda d: summed.append(len(d)) or real_sum(d))
    monkeypatch.setattr(compiler.hashlib, "sha256", lambda d=b"": hashed.append(len(d)) or real_sha(d))

    def run(weight_of, seq: int) -> None:
        def build() -> orion.Graph:
            g = orion.Graph("shared_weight")
            g.output(g.linear(g.input("x", [1, 64, 1, seq]), weight_of()), "y")
            return g

        lowered, _ = lower_cached({"test": "shared_weight", "seq": seq, "weight": weight_of.__name__}, build)
        x = RNG.standard_normal((1, 64, 1, seq)).astype(np.float32)
        want = (np.asarray(weight_of(), np.float64) @ x[0, :, 0, :])[None, :, None, :]
        got = compile_cached(lowered)(x=x)["y"]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-2 * float(np.abs(want).max()))

    def mapped_view() -> np.ndarray:
        return top

    def stacked() -> np.ndarray:  # a fused projection: derived anew by every graph from the same views
        return lineage.derived(np.concatenate([top, bottom]), "concatenate", [top, bottom])

    writable = np.array(top)

    def copied() -> np.ndarray:
        return writable

    for weight_of, rows, programs, expected in ((mapped_view, 32, 3, 1), (stacked, 64, 3, 1), (copied, 32, 2, 2)):
        serialized.clear(), hashed.clear(), summed.clear()
        for seq in (32, 64, 128)[:programs]:
            run(weight_of, seq)
        file_bytes = len(real_write(np.zeros((rows, 64), np.float16)))
        assert (serialized.count(rows * 64), hashed.count(file_bytes), summed.count(file_bytes)) == (expected,) * 3
    assert lineage.key_of(top) is not None and lineage.key_of(writable) is None  # no key: its values may change


def test_the_weight_keys_compiled_with_are_the_sha256_of_the_bytes(tmp_path, monkeypatch) -> None:
    """The emulator trusts a weight key without hashing (orion.compile's weight_keys): compile_lowered must
    give each weight file's true SHA-256, for a fresh lowering and for a cached read of a blob."""
    import hashlib

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    seen = []
    real = orion.compile
    monkeypatch.setattr(orion, "compile", lambda mil, weights, **kw: seen.append((weights, kw["weight_keys"]))
                        or real(mil, weights, **kw))
    w = np.random.default_rng(7).standard_normal((64, 64)).astype(np.float32) * 0.1  # this test's own programs

    def own_graph() -> orion.Graph:
        g = orion.Graph("keyed_block")
        g.output(g.relu(g.linear(g.input("x", [1, 64, 1, 32]), w)), "y")
        return g

    want = np.maximum(w @ X[0, :, 0, :], 0)[None, :, None, :]
    for expect_cached in (False, True):
        lowered, cached = lower_cached({"test": "weight keys"}, own_graph)
        assert cached == expect_cached
        compiled = compile_lowered(lowered, profile="permissive" if cached else "hardware")  # another program key
        np.testing.assert_allclose(compiled(x=X)["y"], want, rtol=0, atol=2e-2 * float(np.abs(want).max()))
    assert len(seen) == 2
    for weights, keys in seen:
        assert keys and keys == {path: hashlib.sha256(bytes(data)).hexdigest() for path, data in weights.items()}


# -- files of packed panels (compile_cached) ----------------------------------------------------------------------
def _panel_graph(seed: int, cout: int = 72) -> tuple[orion.Graph, np.ndarray]:
    """A linear of its own weight (not shared with other tests' programs): ``cout`` = 72 leaves the last panel
    of 16 output channels half empty."""
    w = np.random.default_rng(seed).standard_normal((cout, 64)).astype(np.float32) * 0.1
    g = orion.Graph(f"panels_{seed}")
    g.output(g.relu(g.linear(g.input("x", [1, 64, 1, 32]), w)), "y")
    return g, w


def _released(compiled) -> None:
    """Unloads ``compiled`` and frees its packed weights, as a new process would start without them."""
    compiled.program.unload()
    del compiled
    gc.collect()


def _packed_here() -> set[str]:
    return {key for key, _ in kernels.keyed_conv_panels()}


@pytest.mark.skipif(orion.backend() != "emulator", reason="the emulator's packed weights")
def test_a_warm_compile_maps_the_stored_panels_instead_of_packing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    g, w = _panel_graph(11)
    lowered, _ = lower_cached({"test": "panels"}, lambda: g)
    first = compile_cached(lowered)
    y = first(x=X)["y"]
    want = np.maximum(w @ X[0, :, 0, :], 0)[None, :, None, :]
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-2 * float(np.abs(want).max()))
    program_cache.flush()
    (stored,) = (tmp_path / PANELS).iterdir()  # the one conv weight, named by its blob, offset, shape and layout
    digest = stored.name[:64]
    assert digest in lowered.file_digests.values() and f"-72x64.{kernels.conv_panel_layout()}." in stored.name
    # Its bytes are the panel layout: 16 output channels interleaved per input channel, the last panel zero-padded.
    padded = np.zeros((80, 64), np.float16)
    padded[:72] = w.astype(np.float16)
    panels = padded.reshape(5, 16, 64).transpose(0, 2, 1)
    assert stored.read_bytes() == panels.tobytes()
    key = next(iter(panel_files(tmp_path, [digest])))
    _released(first)
    assert key not in _packed_here()
    lowered, cached = lower_cached({"test": "panels"}, lambda: g)
    again = compile_cached(lowered)
    assert cached and key not in _packed_here()  # read from the file, not packed
    assert np.array_equal(again(x=X)["y"], y)
    _released(again)


@pytest.mark.skipif(orion.backend() != "emulator", reason="the emulator's packed weights")
def test_panels_are_written_by_a_writer_thread_and_named_only_once_whole(tmp_path, monkeypatch) -> None:
    """A cold start's compiles do not wait for the files of panels: store_panels queues them to one writer
    thread; until a file is whole it has no name panel_files would find (another program packs again)."""
    import threading

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    g, w = _panel_graph(16)
    lowered, _ = lower_cached({"test": "panel writer"}, lambda: g)
    hold = threading.Event()
    program_cache._writer().submit(hold.wait)  # the writer is busy
    try:
        compiled = compile_cached(lowered)
        digests = lowered.file_digests.values()
        assert not (tmp_path / PANELS).exists() and panel_files(tmp_path, digests) == {}
        assert program_cache.store_panels(tmp_path, digests) == 0  # queued once, not again
    finally:
        hold.set()
    program_cache.flush()
    (stored,) = (tmp_path / PANELS).iterdir()
    assert list(panel_files(tmp_path, digests).values()) == [str(stored)]
    assert stored.read_bytes() == np.pad(w.astype(np.float16), ((0, 8), (0, 0))).reshape(5, 16, 64) \
        .transpose(0, 2, 1).tobytes()
    _released(compiled)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork")
def test_a_forked_child_gets_a_writer_of_its_own() -> None:
    """The parent's writer thread is not in a forked child: the child's flush must not wait for it forever."""
    import os
    import signal

    program_cache._writer().submit(lambda: None).result()
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 when its flush and a write of its own finish within 10 s
        signal.alarm(10)
        program_cache.flush()
        program_cache._writer().submit(lambda: None).result()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(orion.backend() != "emulator", reason="the emulator's packed weights")
@pytest.mark.parametrize("damage", ["truncated", "another weight's panels"])
def test_a_damaged_panel_file_is_packed_again_with_one_warning(tmp_path, monkeypatch, capsys, damage) -> None:
    import zlib

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    g, w = _panel_graph(12 if damage == "truncated" else 13)
    lowered, _ = lower_cached({"test": "damaged panels"}, lambda: g)
    first = compile_cached(lowered)
    y = first(x=X)["y"]
    _released(first)
    program_cache.flush()
    (stored,) = (tmp_path / PANELS).iterdir()
    if damage == "truncated":  # as by a full disk: its CRC is computed again (another size) and differs
        stored.write_bytes(stored.read_bytes()[:-64])
        expected = "damaged or missing"
    else:  # a whole, consistent file (its CRC in its name) of other values: the emulator's samples refuse it
        other = np.zeros((80, 64), np.float16)
        other[:72] = np.random.default_rng(99).standard_normal((72, 64)).astype(np.float16)
        data = other.reshape(5, 16, 64).transpose(0, 2, 1).tobytes()
        stored.unlink()
        stored = stored.with_name(f"{stored.name.rsplit('.', 1)[0]}.{zlib.crc32(data):08x}")
        stored.write_bytes(data)
        program_cache._PANEL_NAMES.clear()  # as a new process lists them
        expected = "does not hold this weight's values"
    capsys.readouterr()
    again = compile_cached(lower_cached({"test": "damaged panels"}, lambda: g)[0])
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and expected in warning[0] and str(stored) in warning[0]
    assert np.array_equal(again(x=X)["y"], y)  # packed again from the weight
    program_cache.flush()
    (rewritten,) = (tmp_path / PANELS).iterdir()  # and stored again
    assert rewritten.read_bytes() == np.pad(w.astype(np.float16), ((0, 8), (0, 0))).reshape(5, 16, 64) \
        .transpose(0, 2, 1).tobytes()
    _released(again)


@pytest.mark.skipif(orion.backend() != "emulator", reason="the emulator's packed weights")
def test_orion_compile_refuses_a_panel_file_of_the_wrong_size(tmp_path) -> None:
    import hashlib

    from support.weighted import TEXT, W_OFFSET, weights

    files, _, _ = weights(61)
    ((path, data),) = files.items()
    digest = hashlib.sha256(data).hexdigest()
    short = tmp_path / "short"
    short.write_bytes(bytes(100))
    with pytest.raises(ValueError, match=r"packed weight file '.*short' holds 100 bytes.*cache clear"):
        orion.compile(TEXT, files, weight_keys={path: digest},
                      packed_weights={f"{digest}@{W_OFFSET}/64x64": str(short)})


@pytest.mark.skipif(orion.backend() != "emulator", reason="the emulator's packed weights")
def test_panels_are_evicted_with_their_blobs_and_cleared(tmp_path, monkeypatch) -> None:
    import os
    import time

    from orion.program_cache import MANIFEST, clear, enforce_cap

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    for seed in (14, 15):
        g, _ = _panel_graph(seed)
        _released(compile_cached(lower_cached({"test": "panel eviction", "seed": seed}, lambda g=g: g)[0]))
    program_cache.flush()
    assert len(list((tmp_path / PANELS).iterdir())) == 2
    past = time.time() - 1000  # past the blobs' grace period; the second entry stays the newest
    for path in tmp_path.rglob("*"):
        os.utime(path, (past, past))
    newest = max((p for p in tmp_path.iterdir() if (p / MANIFEST).is_file()), key=lambda p: p.stat().st_ctime)
    os.utime(newest / MANIFEST)
    enforce_cap(tmp_path, 0)  # only the newest entry survives, with its blobs and their panels
    (kept,) = (tmp_path / PANELS).iterdir()
    assert (tmp_path / "blobs" / kept.name[:64]).is_file()
    clear(tmp_path)
    assert not (tmp_path / PANELS).exists()


def test_an_entry_stored_by_the_writer_is_named_only_once_its_blobs_are_whole(tmp_path, monkeypatch) -> None:
    """``lower_cached(wait=False)`` returns before the writer thread stores the entry: the program compiles from
    the bytes in memory, nothing is on disk under a name a reader would take, and a program asked again meanwhile
    is read back once stored. A write failing mid-entry (a full disk) leaves no entry and no temporary files."""
    import threading

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    hold = threading.Event()
    program_cache._writer().submit(hold.wait)  # the writer is busy
    try:
        lowered, cached = lower_cached({"test": "writer entry"}, graph, wait=False)
        assert not cached and list((tmp_path / "blobs").iterdir()) == []
        assert [p.name for p in tmp_path.iterdir()] == ["blobs"]  # no entry, not even a temporary one yet
        check_runs(compile_lowered(lowered))
    finally:
        hold.set()
    again, cached = lower_cached({"test": "writer entry"}, graph)  # waits for the queued entry, then reads it
    assert cached and again.weights == lowered.weights
    check_runs(compile_lowered(again))

    real = program_cache._write_blob
    calls: list[object] = []

    def full_disk(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(program_cache, "_write_blob", full_disk)
    other = np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)

    def two_weights() -> orion.Graph:
        g = orion.Graph("two_weights")
        x = g.input("x", [1, 64, 1, 32])
        g.output(g.linear(g.relu(g.linear(x, W)), other), "y")
        return g

    before = {p.name for p in tmp_path.iterdir()}
    lower_cached({"test": "failed entry"}, two_weights)
    assert len(calls) == 2 and {p.name for p in tmp_path.iterdir()} == before  # no entry, no .tmp- directory
    assert not [p for p in (tmp_path / "blobs").iterdir() if p.name.startswith(".tmp-")]
    monkeypatch.setattr(program_cache, "_write_blob", real)
    _, cached = lower_cached({"test": "failed entry"}, two_weights)
    assert not cached and lower_cached({"test": "failed entry"}, two_weights)[1]


def test_the_writer_holds_a_bounded_amount_of_weight_bytes_and_yields_to_the_foreground(tmp_path, monkeypatch) -> None:
    """Past QUEUE_BYTES of queued weight files, lower_cached(wait=False) waits for the writer to store the entries
    queued before its own (a large model's cold start must not hold a second copy of all its weights); on Linux
    the writer runs 10 nice levels below the thread that started the process's work."""
    import sys
    import threading

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(program_cache, "QUEUE_BYTES", 0)
    for seed in (81, 82):  # weights of their own: each queues its bytes
        lower_cached({"test": f"bounded queue {seed}"}, lambda seed=seed: _panel_graph(seed)[0], wait=False)
    assert program_cache.usage(tmp_path)["entries"] >= 1 and len(program_cache._QUEUE) <= 1  # the first stored
    program_cache.flush()
    if sys.platform == "linux":
        writer = program_cache._writer().submit(threading.get_native_id).result()
        assert os.getpriority(os.PRIO_PROCESS, writer) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)


def test_the_writer_holds_at_most_a_sixteenth_of_a_models_weights(tmp_path, monkeypatch) -> None:
    """A caller giving its model's weight bytes waits past queue_bound of them (a sixteenth, at most QUEUE_BYTES) for
    the entries queued before its newest (which compiles meanwhile): a small model's cold start must not hold half
    its weights again for the writer. Each entry's 9 KiB weight file is over a sixteenth of 8 KiB, so the first is
    stored before the second lower_cached returns; unbounded (no weight_bytes, 128 MiB) the second is still queued
    behind the slowed writer when the third returns."""
    import time

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    assert program_cache.queue_bound(None) == program_cache.QUEUE_BYTES == 128 << 20
    assert program_cache.queue_bound(16 << 20) == 1 << 20 and program_cache.queue_bound(4 << 30) == 128 << 20
    store = program_cache._store

    def slow_store(*args) -> None:
        time.sleep(0.5)
        store(*args)

    def entries() -> int:
        return program_cache.usage(tmp_path)["entries"]

    monkeypatch.setattr(program_cache, "_store", slow_store)
    graphs = [_panel_graph(seed)[0] for seed in (71, 72, 73)]  # weights of their own: each queues its bytes
    lowered, _ = lower_cached({"test": "share 1"}, lambda: graphs[0], wait=False, weight_bytes=8 << 10)
    assert sum(map(len, lowered.weights.values())) > 8 << 10 >> 4
    assert entries() == 0 and len(program_cache._QUEUE) == 1  # the newest is not waited for
    lower_cached({"test": "share 2"}, lambda: graphs[1], wait=False, weight_bytes=8 << 10)
    assert entries() == 1 and len(program_cache._QUEUE) == 1
    lower_cached({"test": "unbounded"}, lambda: graphs[2], wait=False)
    assert entries() == 1 and len(program_cache._QUEUE) == 2
    program_cache.flush()
    assert entries() == 3


@pytest.mark.parametrize("size", [0, 100, 3 * 8192, 3 * 8192 + 5])
def test_a_files_digest_is_the_sha256_of_its_pieces_sha256(tmp_path, monkeypatch, size) -> None:
    """file_digest hashes the pieces on threads: it must be the SHA-256 of the size and of each piece's SHA-256
    (computed here with hashlib alone), the same for the same bytes under another name, other for a changed byte."""
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(program_cache, "DIGEST_PIECE", 8192)  # several pieces of a small file
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    want = hashlib.sha256(f"orion file digest\0{8192}\0{size}\0".encode())
    for start in range(0, size, 8192):
        want.update(hashlib.sha256(data[start:start + 8192]).digest())
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(data)
    second.write_bytes(data)
    assert program_cache.file_digest(first) == program_cache.file_digest(second) == want.hexdigest()
    if size:
        changed = bytearray(data)
        changed[-1] ^= 1
        second.write_bytes(bytes(changed))
        assert program_cache.file_digest(second) != want.hexdigest()


def test_a_file_changed_within_a_clock_tick_is_hashed_every_time(tmp_path, monkeypatch) -> None:
    """A rewrite within one tick of the file system's clock can keep a file's size and times, so a memo keyed
    by its identity could stand for the bytes before it: a file changed less than RACY_NS ago is hashed at
    every call; an older one once."""
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "weights.bin"
    path.write_bytes(b"a" * 4096)
    st = path.stat()  # what a same-tick rewrite of the same size leaves, times included
    computed = []

    def digest() -> str:
        computed.append(path.read_bytes())
        return hashlib.sha256(computed[-1]).hexdigest()

    valid = lambda text: len(text) == 64  # noqa: E731
    first = program_cache._by_identity(path, "sha256", digest, valid, st=st)
    path.write_bytes(b"b" * 4096)
    assert program_cache._by_identity(path, "sha256", digest, valid, st=st) != first
    aged = SimpleNamespace(st_dev=st.st_dev, st_ino=st.st_ino, st_size=st.st_size,
                           st_mtime_ns=st.st_mtime_ns - 10 * program_cache.RACY_NS,
                           st_ctime_ns=st.st_ctime_ns - 10 * program_cache.RACY_NS)
    for _ in range(2):
        assert program_cache._by_identity(path, "sha256", digest, valid, st=aged) == hashlib.sha256(b"b" * 4096).hexdigest()
    assert len(computed) == 3



def test_a_file_asked_again_is_served_by_the_memo_and_a_changed_one_is_computed_again(tmp_path, monkeypatch) -> None:
    """``_by_identity`` in one process: the same file version again costs one lookup (no path resolution, no
    hashing of its identity, no compute); a truncation in place (same inode, ``times=False`` as for blobs) or a
    rewrite under a new inode is computed again, with no memo cleared."""
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "blob.bin"
    path.write_bytes(b"a" * 4096)
    computed, resolved = [], []

    def crc() -> str:
        computed.append(path.stat().st_size)
        return str(zlib.crc32(path.read_bytes()))

    real_dir = program_cache._real_dir
    monkeypatch.setattr(program_cache, "_real_dir", lambda d: resolved.append(d) or real_dir(d))
    ask = lambda: int(program_cache._by_identity(path, "crc32", crc, str.isdigit, times=False))  # noqa: E731
    assert ask() == zlib.crc32(b"a" * 4096)
    assert ask() == zlib.crc32(b"a" * 4096) and computed == [4096] and len(resolved) == 1
    with path.open("r+b") as f:  # truncated in place: the same inode
        f.truncate(2048)
    assert ask() == zlib.crc32(b"a" * 2048) and computed == [4096, 2048]
    other = tmp_path / "other.bin"
    other.write_bytes(b"b" * 2048)
    os.replace(other, path)  # the same size under a new inode
    assert ask() == zlib.crc32(b"b" * 2048) and computed == [4096, 2048, 2048]



def test_memoized_values_are_one_log_read_once_and_a_damaged_line_is_computed_again(tmp_path, monkeypatch) -> None:
    """``_by_identity`` keeps its values in one log per cache (``files/memo.log``), read once by a new process: the
    hundreds of blob CRCs a warm start asks cost one file read, not one file each. A line that is not intact (a
    torn or damaged write) is skipped and its value computed again; a log past its limit is started again."""
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    paths = [tmp_path / f"blob{i}.bin" for i in range(3)]
    for i, path in enumerate(paths):
        path.write_bytes(bytes([i + 1]) * 4096)
    want = [zlib.crc32(path.read_bytes()) for path in paths]
    computed: list[str] = []

    def ask(path) -> int:
        def crc() -> str:
            computed.append(path.name)
            return str(zlib.crc32(path.read_bytes()))
        return int(program_cache._by_identity(path, "crc32", crc, str.isdigit, times=False))

    def new_process() -> list[str]:
        """The files whose values a new process computes when it asks for all three (and gets them right)."""
        monkeypatch.setattr(program_cache, "_MEMO", {})
        monkeypatch.setattr(program_cache, "_MEMO_LOGS", {})
        computed.clear()
        assert [ask(path) for path in paths] == want
        return list(computed)

    assert [ask(path) for path in paths] == want and computed == [p.name for p in paths]
    log = tmp_path / "cache" / program_cache.FILES / program_cache.MEMO_LOG
    assert [f.name for f in log.parent.iterdir()] == [program_cache.MEMO_LOG] and len(log.read_text().splitlines()) == 3
    opened: list[str] = []
    real_read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: opened.append(self.name) or real_read(self))
    assert new_process() == [] and opened.count(program_cache.MEMO_LOG) == 1
    lines = log.read_text().splitlines(keepends=True)
    value = lines[1].split("\t")[1]
    log.write_text(lines[0] + lines[1].replace(value, value[:-1], 1) + lines[2][:-5])  # a wrong value, a torn line
    assert new_process() == [paths[1].name, paths[2].name]
    monkeypatch.setattr(program_cache, "MEMO_LOG_LIMIT", 10)
    assert new_process() == [p.name for p in paths] and len(log.read_text().splitlines()) == 3

# -- a checkpoint's weight files: named by where their values come from; a changed checkpoint is noticed ----------
def _llama_dir(path, seed: int):
    from orion.models.llama import weights as llama_weights
    from orion.models.llama.config import LlamaConfig

    config = LlamaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=96,
                         max_position_embeddings=32, rope_convention="half")
    llama_weights.save_hf(path, config, llama_weights.random_weights(config, seed=seed), dtype="float16")
    return path


def _load_run(directory):
    """(logits of a fixed prompt, programs built, programs read from the cache)."""
    from orion import models

    model = models.load(directory, progress=False)
    logits = model.logits([5, 17, 3, 60])
    program_cache.flush()  # the builder's entries are stored by the writer thread
    return logits, model.builder.built, model.builder.cached


def test_a_checkpoints_weight_files_are_named_without_hashing_them(tmp_path, monkeypatch) -> None:
    """A cold load hashes the checkpoint once; the fp16 weight files of its values are named by that hash and
    their derivation (``program_cache.derived_digest``), not hashed again. The names are the same in the next
    process, so its warm start finds the same blobs."""
    from orion import compiler

    directory = _llama_dir(tmp_path / "model", seed=1)
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    hashed, real_sha = set(), hashlib.sha256
    monkeypatch.setattr(compiler.hashlib, "sha256", lambda d=b"": hashed.add(real_sha(d).hexdigest()) or real_sha(d))
    _, built, cached = _load_run(directory)
    assert built > 0 and cached == 0
    blobs = {b.name: b.read_bytes() for b in (tmp_path / "cache" / "blobs").iterdir()}
    named = {name for name, data in blobs.items() if real_sha(data).hexdigest() != name}
    checkpoint = (directory / "model.safetensors").stat().st_size
    # The layer weights (views and fused stacks of the checkpoint) are named; computed consts (RoPE tables) hashed.
    assert sum(len(blobs[n]) for n in named) > 0.8 * checkpoint
    assert not {real_sha(blobs[n]).hexdigest() for n in named} & hashed  # none of their bytes went through SHA-256
    # What a name stands for is recomputed from scratch in a fresh process: the same names, all served.
    program_cache._MEMO.clear()
    program_cache._MEMO_LOGS.clear()
    from orion.graph import lineage

    lineage._FACTS.clear()  # noqa: SLF001 (as a new process: nothing remembered under lineage keys)
    _, built, cached = _load_run(directory)
    assert built == 0 and cached > 0
    assert {b.name for b in (tmp_path / "cache" / "blobs").iterdir()} == set(blobs)


def test_a_checkpoint_rewritten_with_the_same_size_and_time_is_not_served_stale_programs(tmp_path, monkeypatch) -> None:
    """Other weights of the same shapes written over the checkpoint, its modification time set back: the cache
    serves none of the old programs (the checkpoint's identity includes its change time, so it is hashed again),
    and the logits are the new weights' (as computed with no cache)."""
    import os

    directory = _llama_dir(tmp_path / "model", seed=1)
    path = directory / "model.safetensors"
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    old_logits, _, _ = _load_run(directory)
    before = path.stat()
    _llama_dir(tmp_path / "other", seed=2)
    path.write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())  # in place: the same inode
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    logits, built, cached = _load_run(directory)
    assert cached == 0 and built > 0
    monkeypatch.setenv("ORION_CACHE_DIR", "off")
    fresh, _, _ = _load_run(directory)
    np.testing.assert_array_equal(logits, fresh)
    assert not np.array_equal(logits, old_logits)


def test_a_touched_checkpoint_with_the_same_bytes_is_still_served(tmp_path, monkeypatch) -> None:
    """Only the checkpoint's times changed: it is hashed again (its identity changed), found the same, and every
    program comes from the cache, reading the same blobs (no new weight file)."""
    import os

    directory = _llama_dir(tmp_path / "model", seed=1)
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    first, built, _ = _load_run(directory)
    blobs = {b.name for b in (tmp_path / "cache" / "blobs").iterdir()}
    stamp = (directory / "model.safetensors").stat().st_mtime_ns + 5_000_000_000
    os.utime(directory / "model.safetensors", ns=(stamp, stamp))
    logits, built_again, cached = _load_run(directory)
    assert built_again == 0 and cached == built
    np.testing.assert_array_equal(logits, first)
    assert {b.name for b in (tmp_path / "cache" / "blobs").iterdir()} == blobs


def _scaled_graph(scale: float) -> orion.Graph:
    g = orion.Graph("scaled_block")
    g.output(g.relu(g.linear(g.input("x", [1, 64, 1, 32]), W * scale)), "y")
    return g


def test_a_builder_compiles_read_programs_on_its_compile_thread_in_order(tmp_path, monkeypatch) -> None:
    """ProgramBuilder.build_all: a program lowered here compiles before the next is lowered (its weights are in
    memory); one read from the cache compiles on the compile thread while the next is read. The programs come
    back in order, and a failed compile is raised only once none is left compiling."""
    from orion.runtime import builder as builder_module

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    scales = [1.0, 2.0, 3.0]
    graphs = [(lambda s=s: _scaled_graph(s), {"scale": s}) for s in scales]
    events: list[tuple[str, str]] = []
    real_lower, real_compile = builder_module.lower_cached, builder_module.compile_cached

    def lower(description, build, **options):
        events.append(("lower", threading.current_thread().name))
        return real_lower(description, build, **options)

    def compile_(lowered, **options):
        events.append(("compile", threading.current_thread().name))
        if os.environ.get("FAIL_SECOND") and sum(e[0] == "compile" for e in events) == 2:
            raise orion.CompileError("simulated compile failure")
        compiled = real_compile(lowered, **options)
        events.append(("compiled", ""))
        return compiled

    monkeypatch.setattr(builder_module, "lower_cached", lower)
    monkeypatch.setattr(builder_module, "compile_cached", compile_)
    cold = ProgramBuilder({"test": "build_all"}, progress=False)
    cold_programs = cold.build_all("block", graphs)
    assert [e[0] for e in events] == ["lower", "compile", "compiled"] * 3 and cold.built == 3
    program_cache.flush()
    events.clear()
    warm = ProgramBuilder({"test": "build_all"}, progress=False)
    programs = warm.build_all("block", graphs)
    assert warm.cached == 3 and {name for kind, name in events if kind == "compile"} == {"orion-compile_0"}
    for compiled, plain, s in zip(programs, cold_programs, scales, strict=True):
        want = np.maximum(s * W @ X[0, :, 0, :], 0)[None, :, None, :]
        np.testing.assert_allclose(compiled(x=X)["y"], want, rtol=0, atol=2e-2 * float(np.abs(want).max()))
        np.testing.assert_array_equal(compiled(x=X)["y"], plain(x=X)["y"])
    pid = os.fork()  # a forked child has no compile thread of its parent's: it builds on one of its own
    if pid == 0:
        signal.alarm(20)
        ok = len(ProgramBuilder({"test": "build_all"}, progress=False).build_all("block", graphs)) == 3
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    events.clear()
    monkeypatch.setenv("FAIL_SECOND", "1")
    with pytest.raises(orion.CompileError, match="simulated"):
        ProgramBuilder({"test": "build_all"}, progress=False).build_all("block", graphs)
    assert [e[0] for e in events].count("compile") == 3 and [e[0] for e in events].count("compiled") == 2


def test_a_builder_building_ahead_returns_programs_still_compiling(tmp_path, monkeypatch) -> None:
    """build_all(..., ahead=True) returns once every program is read from the cache, the programs still compiling
    on the compile thread in order: a program's layout is there at once, its ``program`` when compiled, so the
    first runs while a later one compiles. A failed compile is raised where that program is read."""
    from orion.runtime import builder as builder_module

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    graphs = [(lambda s=s: _scaled_graph(s), {"scale": s}) for s in (1.0, 2.0, 3.0)]
    cold = ProgramBuilder({"test": "ahead"}, progress=False).build_all("block", graphs)
    program_cache.flush()
    release, holding_last, compiled = threading.Event(), threading.Event(), []
    real_compile = builder_module.compile_cached

    def compile_(lowered, **options):
        if len(compiled) == 2:  # the last program: held until the test releases it
            holding_last.set()
            assert release.wait(20)
            if os.environ.get("FAIL_LAST"):
                raise orion.CompileError("simulated compile failure")
        compiled.append(lowered.content_hash)
        return real_compile(lowered, **options)

    monkeypatch.setattr(builder_module, "compile_cached", compile_)
    warm = ProgramBuilder({"test": "ahead"}, progress=False)
    programs = warm.build_all("block", graphs, ahead=True)
    assert warm.cached == 3 and all(isinstance(p, builder_module.CompilingGraph) for p in programs)
    assert [p.layout for p in programs] == [p.layout for p in cold]
    first = programs[0](x=X)["y"]  # returns although the last program cannot compile before release
    assert holding_last.wait(20) and len(compiled) == 2  # the compile thread went on in order to the last
    release.set()
    for program, plain in zip(programs, cold, strict=True):
        np.testing.assert_array_equal(program(x=X)["y"], plain(x=X)["y"])
    assert compiled == [p.content_hash for p in cold]
    np.testing.assert_array_equal(first, cold[0](x=X)["y"])
    compiled.clear()
    release.clear()
    holding_last.clear()
    monkeypatch.setenv("FAIL_LAST", "1")
    failing = ProgramBuilder({"test": "ahead"}, progress=False).build_all("block", graphs, ahead=True)
    np.testing.assert_array_equal(failing[0](x=X)["y"], first)
    release.set()
    with pytest.raises(orion.CompileError, match="simulated"):
        failing[2](x=X)


def test_a_warm_first_prefill_runs_its_first_layer_while_the_last_one_compiles(tmp_path, monkeypatch) -> None:
    """A warm start's first prefill binds the programs it read from the cache and runs each layer as soon as its
    program is compiled (build_prefill_plan builds ahead): its first layer program has run before the last one
    compiles, and the logits are the cold start's."""
    from orion import models
    from orion.runtime import builder as builder_module
    from orion.runtime.stage import Stage

    directory = _llama_dir(tmp_path / "model", seed=3)
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    cold = models.load(directory, progress=False, fusion_depth=1)
    want = cold.logits([5, 17, 3, 60])
    program_cache.flush()
    ran, waited = threading.Event(), []
    real_run, real_compile = Stage.run, builder_module.ProgramBuilder._compile

    def run(self, live_lanes=None):
        ran.set()
        return real_run(self, live_lanes)

    def compile_(self, lowered, label, show):
        if label.startswith("prefill layers 1-1"):  # the last layer program of the prompt's bucket
            waited.append(ran.wait(20))
        return real_compile(self, lowered, label, show)

    monkeypatch.setattr(Stage, "run", run)
    monkeypatch.setattr(builder_module.ProgramBuilder, "_compile", compile_)
    warm = models.load(directory, progress=False, fusion_depth=1)
    np.testing.assert_array_equal(warm.logits([5, 17, 3, 60]), want)
    assert warm.builder.built == 0 and waited == [True]


def _fail_one_compile(monkeypatch, label_start: str) -> list[str]:
    """Makes the first compile of a program whose label starts with ``label_start`` raise a CompileError; returns
    the labels that failed."""
    from orion.runtime import builder as builder_module

    real_compile, failures = builder_module.ProgramBuilder._compile, []

    def compile_(self, lowered, label, show):
        if label.startswith(label_start) and not failures:
            failures.append(label)
            raise orion.CompileError("simulated compile failure")
        return real_compile(self, lowered, label, show)

    monkeypatch.setattr(builder_module.ProgramBuilder, "_compile", compile_)
    return failures


def test_a_prefill_plan_whose_ahead_compile_failed_is_built_again_on_the_next_prompt(tmp_path, monkeypatch) -> None:
    """A program the prefill plan read ahead from the cache that fails to compile raises where it first runs, and the
    next prompt builds the plan again instead of raising that error for good; its logits are the cold start's."""
    from orion import models

    directory = _llama_dir(tmp_path / "model", seed=4)
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    want = models.load(directory, progress=False, fusion_depth=1).logits([5, 17, 3, 60])
    program_cache.flush()
    failures = _fail_one_compile(monkeypatch, "prefill layers 1-1")  # the prompt bucket's last layer
    warm = models.load(directory, progress=False, fusion_depth=1)
    with pytest.raises(orion.CompileError, match="simulated"):
        warm.logits([5, 17, 3, 60])
    np.testing.assert_array_equal(warm.logits([5, 17, 3, 60]), want)
    assert len(failures) == 1 and warm.builder.built == 0


def test_a_decode_lm_head_whose_ahead_compile_failed_is_built_again_on_the_next_call(tmp_path, monkeypatch) -> None:
    """The decode plan's LM-head programs are read ahead from the cache too: one that fails to compile raises where
    the head first runs (a prompt's logits), and the next call runs a new build of the head; the logits and the
    greedy tokens after them are the cold start's."""
    from orion import models

    directory = _llama_dir(tmp_path / "model", seed=5)
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    cold = models.load(directory, progress=False, fusion_depth=1)
    want = [cold.prefill([5, 17, 3, 60]), cold.decode_step(7)]
    program_cache.flush()
    failures = _fail_one_compile(monkeypatch, "lm_head")
    warm = models.load(directory, progress=False, fusion_depth=1)
    with pytest.raises(orion.CompileError, match="simulated"):
        warm.prefill([5, 17, 3, 60])
    np.testing.assert_array_equal(warm.prefill([5, 17, 3, 60]), want[0])
    np.testing.assert_array_equal(warm.decode_step(7), want[1])
    assert len(failures) == 1 and warm.builder.built == 0


def test_building_ahead_shows_a_step_per_program_it_compiles_now(tmp_path, monkeypatch) -> None:
    """On a terminal, a batch built ahead shows a step for each program it builds and compiles before returning (a
    cold one); the programs read from the cache compile after the batch's line may have ended, so they show none."""
    from orion.progress import ProgressLine
    from support.terminal import Terminal

    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path))
    graphs = [(lambda s=s: _scaled_graph(s), {"scale": s}) for s in (1.0, 2.0, 3.0)]
    shown = []
    for _ in range(2):  # cold, then warm
        builder = ProgramBuilder({"test": "ahead steps"})
        builder.line = ProgressLine(stream=Terminal())
        builder.begin("blocks", 3)
        programs = builder.build_all("block", graphs, ahead=True)
        builder.end()
        [program.program for program in programs]  # noqa: B018 (all compiled)
        shown.append(builder.line.stream.getvalue())
        program_cache.flush()
    assert shown[0].count("block scale") == 3 and "/3: block scale 3.0" in shown[0]
    assert "block scale" not in shown[1] and "(0 built, 3 loaded from cache)" in shown[1]
