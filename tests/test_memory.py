"""Memory and start-up: loaded weights are mapped, not copied; a warm start hashes no weights; the
emulator's frames hold no tensor memory between evaluates and pooled frames compute what numpy does."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from orion import compiler, program_cache
from orion.models import GPT2, GPT2Config
from orion.models.gpt2.weights import load_hf, random_weights, save_hf
from support.compiler import mil_schema_check

TESTS = Path(__file__).resolve().parent
# A vocabulary large enough that the embedding dominates: an fp32 copy of it would be plain to see.
CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=8192, n_positions=64)
IDS = [5, 900, 17, 4000, 33, 8191, 2, 71, 64, 1000]


def fp32_bytes(config: GPT2Config) -> int:
    return 4 * config.param_count()


@pytest.fixture
def checkpoint(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    save_hf(tmp_path / "hf", CONFIG, random_weights(CONFIG, seed=4))
    return tmp_path / "hf"


def test_a_loaded_model_holds_no_fp32_copy_of_its_weights(checkpoint) -> None:
    """Every weight array is a read-only view of the checkpoint's map, and building the programs
    (cold: lowered and stored; warm: read back) leaves no host copy of the weights allocated."""
    # The suite's schema replay (conftest.py) imports coremltools on the first program it sees: outside the
    # traced window, since an import deeper than the traced frames escapes the conftest filter (141 MB held
    # when this test ran first or alone).
    mil_schema_check.coremltools()
    for cold in (True, False):
        tracemalloc.start(16)
        try:
            model = GPT2.from_pretrained(checkpoint, progress=False)
            model.prefill(IDS)
            # What the model holds, less the suite's record of every lowered program (conftest.py).
            snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, "*conftest.py",
                                                                                     all_frames=True)])
            held = sum(stat.size for stat in snapshot.statistics("filename"))
        finally:
            tracemalloc.stop()
        assert all(not a.flags.writeable and not a.flags.owndata for _, a in model.weights.arrays()), cold
        assert held < 0.25 * fp32_bytes(CONFIG), (cold, held, fp32_bytes(CONFIG))
        reference = GPT2(CONFIG, random_weights(CONFIG, seed=4), progress=False)  # arrays in memory
        np.testing.assert_array_equal(model.prefill(IDS), reference.prefill(IDS))  # same programs, same numerics


class CountingSha256:
    """hashlib.sha256 that counts the bytes it is given."""

    fed = 0
    real = hashlib.sha256

    def __init__(self, data: bytes = b"") -> None:
        self._h = CountingSha256.real()
        self.update(data)

    def update(self, data) -> None:
        CountingSha256.fed += memoryview(data).nbytes
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def digest(self) -> bytes:
        return self._h.digest()


def test_a_warm_start_hashes_no_weights(checkpoint, monkeypatch) -> None:
    """With the programs cached, loading the model and its first prompt hash only names and MIL text:
    the checkpoint's digest is memoized under its identity and each program's comes from its manifest."""
    time.sleep(program_cache.RACY_NS / 1e9)  # a file changed within a clock tick is hashed every time
    GPT2.from_pretrained(checkpoint, progress=False).prefill(IDS)  # cold: hashes, lowers, stores
    monkeypatch.setattr(program_cache, "_MEMO", {})  # as a new process: no in-memory memo, no programs
    monkeypatch.setattr(program_cache, "_MEMO_LOGS", {})
    monkeypatch.setattr(compiler, "_PROGRAMS", {})
    monkeypatch.setattr(hashlib, "sha256", CountingSha256)
    CountingSha256.fed = 0
    model = GPT2.from_pretrained(checkpoint, progress=False)
    model.prefill(IDS)
    assert model.builder.built == 0 and model.builder.cached > 0
    assert CountingSha256.fed < 0.1 * fp32_bytes(CONFIG), CountingSha256.fed  # MIL text and names only
    # The memo is keyed by the file's identity: rewriting the checkpoint makes it hash the file again.
    before = model.program_identity()["weights"]
    save_hf(checkpoint, CONFIG, random_weights(CONFIG, seed=5))
    monkeypatch.setattr(program_cache, "_MEMO", {})
    monkeypatch.setattr(program_cache, "_MEMO_LOGS", {})
    CountingSha256.fed = 0
    changed = GPT2.from_pretrained(checkpoint, progress=False)
    assert CountingSha256.fed >= (checkpoint / "model.safetensors").stat().st_size
    assert changed.program_identity()["weights"] != before


def test_loading_and_running_on_token_ids_leave_the_tokenizers_library_unimported(tmp_path: Path) -> None:
    """``tokenizers`` (~4 MB resident: its Rust library and objects) is imported when a tokenizer is first loaded,
    not with ``orion.models``: a model run on token ids (the peak-RSS benchmark's workload) never loads it."""
    save_hf(tmp_path / "hf", CONFIG, random_weights(CONFIG, seed=4))
    script = textwrap.dedent(f"""
        import sys
        from orion.models import load
        model = load({str(tmp_path / "hf")!r}, progress=False)
        model.prefill({IDS!r})
        print("tokenizers" in sys.modules)
    """)
    env = {**os.environ, "ORION_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["False"], out


def test_a_replaced_array_is_hashed_by_its_bytes(checkpoint) -> None:
    """The file's digest stands for the weights only while they are the loaded arrays."""
    _, weights = load_hf(checkpoint)
    loaded = weights.content_hash(CONFIG)
    weights.blocks[1].b_fc = weights.blocks[1].b_fc + np.float32(1.0)
    assert weights.content_hash(CONFIG) not in (loaded, random_weights(CONFIG, seed=4).content_hash(CONFIG))


POOLED_FRAMES = textwrap.dedent("""
    import json, sys
    import numpy as np
    import orion
    sys.path.insert(0, sys.argv[1])
    from support.handmil import const, op, program, ttype

    C, S, N = 256, 4096, 12  # 1M-element fp32 frame tensors (4 MiB each), N programs
    act = ttype("fp16", [1, C, 1, S])

    def text(i):
        return program({"x": act}, [const("a", "fp16", 0.5 + i / 8), const("b", "fp16", i / 16),
                                    op("m", act, "mul", x="x", y="a"), op("t", act, "tanh", x="m"),
                                    op("out", act, "add", x="t", y="b")], ["out"])

    def rss():
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024

    first = orion.compile(text(0))
    ins, outs = first.allocate_surfaces()  # one pair of surfaces for all (same names and shapes)
    x = np.random.default_rng(0).standard_normal((1, C, 1, S)).astype(np.float16)
    ins["x"].write(x)
    outs["out"].array[...] = 0  # both surfaces touched before measuring
    grown = []
    base = rss()  # round 1: compiling and running every program; round 2: running them again
    programs = [first] + [orion.compile(text(i)) for i in range(1, N)]
    for rep in range(2):
        for p in programs:
            p.evaluate(ins, outs)
        grown.append(rss() - base)
        base = rss()
    worst = 0.0
    for i, p in enumerate(programs):  # every result against numpy, in the pooled buffers' reuse order
        p.evaluate(ins, outs)
        a, b = np.float64(np.float16(0.5 + i / 8)), np.float64(np.float16(i / 16))
        m = (x.astype(np.float64) * a).astype(np.float16).astype(np.float64)
        ref = np.tanh(m).astype(np.float16).astype(np.float64) + b
        worst = max(worst, float(np.max(np.abs(outs["out"].read().astype(np.float64) - ref))))
    print(json.dumps({"worst": worst, "grown": grown}))
""")


def test_frames_share_pooled_memory_and_match_numpy() -> None:
    """Programs run one after the other share their frames' buffers (inputs and outputs included), so
    twelve programs with 4 MiB fp32 tensors grow the process by about one program's frame, not twelve;
    each result still matches a float64 numpy reference rounded like the ANE (fp16 per op)."""
    out = subprocess.run([sys.executable, "-c", POOLED_FRAMES, str(TESTS)], capture_output=True, text=True,
                         timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["worst"] <= 2e-3, result  # fp16 rounding of values below 2 in magnitude
    per_program = 3 * (4 << 20)  # x, m/t (pooled intermediates) and out, fp32
    assert result["grown"][0] < 2 * per_program, result  # not 12 programs' frames (> 8 per_program)
    assert result["grown"][1] < per_program, result  # a second round allocates nothing new


REDUCTIONS = textwrap.dedent("""
    import json, sys
    import numpy as np
    import orion
    sys.path.insert(0, sys.argv[1])
    from support.handmil import const, op, program, ttype

    C, S, N = 256, 4096, 8  # a reduction's input of 1M elements; N copies of the program
    act, row = ttype("fp16", [1, C, 1, S]), ttype("fp16", [1, 1, 1, S])
    text = program({"x": act}, [const("ax", "int32", [1], [1]), const("kd", "bool", True),
                                op("s", row, "reduce_sum", x="x", axes="ax", keep_dims="kd"),
                                op("m", row, "reduce_max", x="x", axes="ax", keep_dims="kd"),
                                op("out", row, "add", x="s", y="m")], ["out"])

    def rss():
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024

    first = orion.compile(text)
    x = np.random.default_rng(1).standard_normal((1, C, 1, S)).astype(np.float16)
    got = first(x=x)["out"].astype(np.float64)
    base = rss()
    programs = [orion.compile(text) for _ in range(N)]
    grown = rss() - base
    x64 = x.astype(np.float64)
    ref = x64.sum(axis=1, keepdims=True).astype(np.float16).astype(np.float64) + x64.max(axis=1, keepdims=True)
    print(json.dumps({"grown": grown, "worst": float(np.max(np.abs(got - ref))), "scale": float(np.abs(ref).max())}))
""")


def test_a_compiled_reduction_holds_no_per_element_table() -> None:
    """A channel reduction over 1M elements keeps one group entry per row, not an 8-byte index per
    element (16 MiB for two of them), so eight compiled copies barely grow the process; the sums
    still match numpy (fp32 accumulation, one fp16 rounding per op)."""
    out = subprocess.run([sys.executable, "-c", REDUCTIONS, str(TESTS)], capture_output=True, text=True,
                         timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["worst"] <= 2e-3 * result["scale"], result
    assert result["grown"] < 16 << 20, result  # an index table per reduction would be 8 x 16 MiB


def test_a_fused_projections_output_serves_its_halves_consumers() -> None:
    """A [2C, S] tensor cut into two [C, S] halves (a fused projection: q|k|v, gate|up) lends its idle buffer to
    the later [C, S] values instead of sitting idle beside new ones: the pool's peak (live + idle) stays at 6 of
    the halves' size (before: 8, the exact-size buffers of both shapes side by side). Values match numpy."""
    import orion
    from orion._core import kernels
    from support.handmil import const, op, program, ttype

    c, s = 256, 1024
    half, whole = ttype("fp16", [1, c, 1, s]), ttype("fp16", [1, 2 * c, 1, s])
    text = program({"x": whole}, [
        const("k", "fp16", 0.5), op("m", whole, "mul", x="x", y="k"),
        const("b0", "int32", [0, 0, 0, 0], [4]), const("b1", "int32", [0, c, 0, 0], [4]),
        const("z", "int32", [1, c, 1, s], [4]),
        op("a", half, "slice_by_size", x="m", begin="b0", size="z"),
        op("b", half, "slice_by_size", x="m", begin="b1", size="z"),
        op("t", half, "tanh", x="a"), op("u", half, "mul", x="t", y="b"), op("out", half, "add", x="u", y="a")],
        ["out"])
    kernels.release_idle_buffers()
    program_ = orion.compile(text)
    x = np.random.default_rng(5).standard_normal((1, 2 * c, 1, s)).astype(np.float16)
    kernels.buffer_pool(reset_peak=True)
    got = program_(x=x)["out"].astype(np.float64)
    halves = c * s * 4  # bytes of one [C, S] fp32 buffer
    assert kernels.buffer_pool()["peak"] <= 6 * halves, kernels.buffer_pool()

    def fp16(v: np.ndarray) -> np.ndarray:
        return v.astype(np.float16).astype(np.float64)

    m = fp16(x.astype(np.float64) * 0.5)
    a, b = m[:, :c], m[:, c:]
    ref = fp16(fp16(fp16(np.tanh(a)) * b) + a)
    assert np.max(np.abs(got - ref)) <= 4e-3  # fp16 rounding of values below 4 in magnitude (tanh within ulps)


def test_a_new_pooled_buffer_replaces_smaller_idle_ones() -> None:
    """A value larger than every idle buffer (a [4C, S] one after [C, S] ones, as an MLP's hidden layer after the
    attention's projections) is allocated in place of the idle buffers too small for it, not beside them: the
    pool's peak is the 5 [C, S] units live at once (c and the [4C, S] value), not 7 (2 idle [C, S] buffers more).
    Values match numpy."""
    import orion
    from orion._core import kernels
    from support.handmil import const, op, program, ttype

    c, s = 256, 1024
    act, big, row = ttype("fp16", [1, c, 1, s]), ttype("fp16", [1, 4 * c, 1, s]), ttype("fp16", [1, 1, 1, s])
    text = program({"x": act}, [
        op("a", act, "relu", x="x"), op("b", act, "add", x="a", y="x"), op("r", act, "relu", x="b"),
        const("ax", "int32", 1), const("il", "bool", False),
        op("w", big, "concat", values=("r", "r", "r", "r"), axis="ax", interleave="il"),
        const("axes", "int32", [1], [1]), const("kd", "bool", True),
        op("out", row, "reduce_sum", x="w", axes="axes", keep_dims="kd")], ["out"])
    kernels.release_idle_buffers()
    program_ = orion.compile(text, profile="permissive")
    x = np.random.default_rng(6).standard_normal((1, c, 1, s)).astype(np.float16)
    kernels.buffer_pool(reset_peak=True)
    got = program_(x=x)["out"].astype(np.float64)
    unit = c * s * 4  # bytes of one [C, S] fp32 buffer
    assert kernels.buffer_pool()["peak"] <= 5 * unit, kernels.buffer_pool()
    r = np.maximum(x.astype(np.float64), 0) * 2  # relu(relu(x) + x): exact in fp16 for these values
    ref = (4 * r.astype(np.float16).astype(np.float64)).sum(axis=1, keepdims=True).astype(np.float16)
    np.testing.assert_allclose(got, ref.astype(np.float64), rtol=2e-3)
