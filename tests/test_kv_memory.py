"""Memory sized to use: the KV cache grows by buckets (its surfaces' untouched positions are untouched
pages) and decodes bit for bit as a full-context cache does; token embeddings are read from the
checkpoint file, never through its map; programs run one after the other share small frames too, and
the programs of a prefill bucket one causal mask.

References: a model whose decode programs read full-context caches (the same weights: equal bits
expected), the independent numpy GPT-2 (support.gpt2_reference, 3% of the largest logit as in
test_gpt2_model.py) and numpy indexing of the same tables."""

from __future__ import annotations

import ctypes
import json
import mmap
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from orion.compiler import CompiledGraph
from orion.generation.kv_cache import MASKED, KVCache, context_buckets
from orion.graph import Graph
from orion.models import GPT2, GPT2Config
from orion.models.gpt2.weights import load_hf, random_weights, save_hf
from orion.models.weights_io import table_rows
from support.attention import twins
from support.gpt2_reference import reference_logits

# 384 channels: a 64-position cache is a 48 KiB surface, the ANE's least (ANE-12), so three buckets.
CONFIG = GPT2Config(n_layer=1, n_head=6, n_embd=384, vocab_size=512, n_positions=1024)
PAGE = mmap.PAGESIZE


class FullContextGPT2(GPT2):
    """GPT-2 whose decode_graph hook takes no ``context``: its decode programs read full-context caches."""

    def decode_graph(self, layers, adapters=None):
        return super().decode_graph(layers, adapters)


def resident_bytes(array: np.ndarray, nbytes: int) -> int:
    """Bytes of the ``nbytes`` from ``array``'s (page-aligned) start that are in memory (mincore)."""
    pages = -(-nbytes // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(nbytes), vec) == 0, ctypes.get_errno()
    return PAGE * sum(v & 1 for v in vec)


def test_the_cache_grows_by_buckets_and_decodes_as_a_full_context_cache_bit_for_bit() -> None:
    weights = random_weights(CONFIG, seed=5)
    sized, full = GPT2(CONFIG, weights, progress=False), FullContextGPT2(CONFIG, weights, progress=False)
    assert sized.cache.buckets == (64, 256, 1024) and full.cache.buckets == (1024,)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, CONFIG.vocab_size, 70)]
    np.testing.assert_array_equal(sized.prefill(ids[:60]), full.prefill(ids[:60]))
    assert sized.cache.bucket == 64
    for token in ids[60:]:  # through the growth from 64 to 256 positions
        got = sized.decode_step(token)
        np.testing.assert_array_equal(got, full.decode_step(token))
    assert sized.cache.bucket == 256 and sized.cache.length == full.cache.length == 70
    want = reference_logits(CONFIG, weights, ids)[-1]
    np.testing.assert_allclose(got, want, rtol=0, atol=0.03 * float(np.abs(want).max()))
    # Resident: the cache lives in the decode program's packed input (ANE-37); of the sized one, the
    # 256-position rows; of the full-context one, every page.
    width, row = CONFIG.n_embd, 2 * CONFIG.n_embd
    for model, positions in ((sized, 256), (full, 1024)):
        packed = model._layers[0].inputs["in_packed"]
        k0 = model.cache.keys[0]
        assert np.shares_memory(k0, packed.array) and k0.shape == (1, width, positions)
        held = resident_bytes(packed.array, packed.nbytes)
        assert 2 * width * positions * 2 <= held <= 2 * width * positions * 2 + 4 * PAGE + row
    # A new prompt starts from the shortest bucket again; a fork takes the cache's bucket.
    sized.prefill(ids[:5])
    assert sized.cache.bucket == 64
    twin = sized.fork()
    np.testing.assert_array_equal(twin.decode_step(ids[5]), sized.decode_step(ids[5]))


def storage(cache: KVCache, bucket: int, programs: int = 1) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """Arrays in the shapes the decode programs' inputs give the cache at ``bucket``."""
    tensors = {f"{kind}{i}": np.zeros((1, cache.lanes * cache.width, 1, bucket), np.float16)
               for i in range(cache.layers) for kind in "kv"}
    return tensors, [np.zeros((1, cache.lanes, 1, bucket), np.float16) for _ in range(programs)]


def test_growing_keeps_the_filled_positions_and_the_masks() -> None:
    cache = KVCache(layers=2, kv_heads=12, head_dim=64, context=256, buckets=(32, 64, 256), lanes=2)
    rng = np.random.default_rng(0)
    filled = rng.standard_normal((768, 16)).astype(np.float16)
    assert cache.bucket_for(16) == 32
    cache.attach(32, *storage(cache, 32, programs=2))
    cache.keys[1][1, :, :16] = filled
    cache.filled(1, 16)
    cache.keys[0][0, :, :3] = 2.0
    cache.filled(0, 3)
    assert cache.bucket_for(33) == 64 and cache.bucket_for(20) == 32
    cache.attach(64, *storage(cache, 64, programs=2))  # past the bucket: rows move to the 64-position layout
    assert cache.bucket == 64 and cache.keys[1].shape == (2, 768, 64)
    np.testing.assert_array_equal(cache.keys[1][1, :, :16], filled)
    assert np.all(cache.keys[0][0, :, :3] == 2.0) and list(cache.lengths) == [3, 16]
    for mask in cache.masks:  # every program's copy of the mask
        np.testing.assert_array_equal(mask[1], np.r_[np.zeros(16), np.full(48, MASKED)].astype(np.float16))
        np.testing.assert_array_equal(mask[0], np.r_[np.zeros(3), np.full(61, MASKED)].astype(np.float16))
    grown = KVCache(layers=2, kv_heads=12, head_dim=64, context=256, buckets=(32, 64, 256), lanes=2)
    grown.attach(64, *storage(grown, 64, programs=2))
    grown.filled(0, 3)
    grown.filled(1, 16)
    grown.appended([0, 1])  # a decode step's position on each lane: filled(lane, n + 1) of both
    cache.filled(0, 4)
    cache.filled(1, 17)
    assert list(grown.lengths) == list(cache.lengths) == [4, 17]
    for got, want in zip(grown.masks, cache.masks):
        np.testing.assert_array_equal(got, want)
    cache.filled(0, 3)
    cache.filled(1, 16)
    twin = KVCache(layers=2, kv_heads=12, head_dim=64, context=256, buckets=(32, 64, 256), lanes=2)
    twin.attach(64, *storage(twin, 64))
    twin.copy_lane(cache, 1, 0)  # a fork of lane 1 into lane 0
    assert list(twin.lengths) == [16, 0]
    np.testing.assert_array_equal(twin.keys[1][0, :, :16], filled)
    cache.clear(1)
    assert list(cache.lengths) == [3, 0] and np.all(cache.masks[0][1] == np.float16(MASKED))
    cache.clear()
    assert cache.bucket_for(3) == 32  # empty: back to the shortest
    with pytest.raises(ValueError, match="context is 256"):
        cache.bucket_for(257)


def test_buckets_keep_the_positions_on_the_lane_axis() -> None:
    assert context_buckets(768, 1024, "fp16") == (64, 256, 1024)
    assert context_buckets(64, 1024, "fp16") == (1024,)  # 64 x 256 fp16 is under the ANE's least surface
    assert context_buckets(384, 100, "fp16") == (64, 100)


def map_resident_bytes(path: Path) -> int:
    """Resident bytes of this process's maps of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


def test_embeddings_are_read_from_the_file_not_through_its_map(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ORION_CACHE_DIR", str(tmp_path / "cache"))
    config = GPT2Config(n_layer=1, n_head=4, n_embd=64, vocab_size=8192, n_positions=128)
    save_hf(tmp_path / "hf", config, random_weights(config, seed=2))
    model = GPT2.from_pretrained(tmp_path / "hf", progress=False)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, config.vocab_size, 100)]
    model.prefill(ids)
    for token in ids[:8]:
        model.decode_step(token)
    assert map_resident_bytes(tmp_path / "hf" / "model.safetensors") < 64 << 10  # the table is 2 MiB
    _, weights = load_hf(tmp_path / "hf")
    wte, source = weights.wte, weights.source
    np.testing.assert_array_equal(table_rows(wte, ids, source), np.asarray(wte)[ids])
    np.testing.assert_array_equal(table_rows(weights.wpe, range(3, 40), source), np.asarray(weights.wpe)[3:40])
    np.testing.assert_array_equal(table_rows(wte, [7], None), np.asarray(wte)[[7]])  # no file: indexing
    np.testing.assert_array_equal(table_rows(weights.wpe, [9, 3, 4, 5, 0], source), np.asarray(weights.wpe)[[9, 3, 4, 5, 0]])
    with pytest.raises(IndexError, match="outside the table's 8192 rows"):
        table_rows(wte, [8192], source)
    rows = np.asarray(model.embed(ids[:3], [17, 2, 3]))  # a decode step's lanes: each token at its own position
    np.testing.assert_array_equal(rows, np.asarray(wte)[ids[:3]].astype(np.float32) + np.asarray(weights.wpe)[[17, 2, 3]])


def test_a_table_row_past_a_truncated_file_is_an_error_naming_it(tmp_path) -> None:
    config = GPT2Config(n_layer=1, n_head=4, n_embd=64, vocab_size=512, n_positions=128)
    save_hf(tmp_path / "hf", config, random_weights(config, seed=2))
    _, weights = load_hf(tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    offsets = [f.offset_of(weights.wte) for mapped in weights.source.files for f in mapped.views()]
    end = next(o for o in offsets if o is not None) + 100 * 64 * weights.wte.dtype.itemsize
    if end >= path.stat().st_size:
        pytest.skip("the table is the file's last tensor")
    with open(path, "r+b") as f:  # the map keeps its pages; the file now ends inside row 100
        f.truncate(end + 10)
    np.testing.assert_array_equal(table_rows(weights.wte, [99], weights.source), np.asarray(weights.wte)[[99]])
    with pytest.raises(OSError, match=r"model\.safetensors: short read of row 100"):
        table_rows(weights.wte, [3, 100], weights.source)


SMALL_FRAMES = textwrap.dedent("""
    import ctypes, json, sys
    import numpy as np
    import orion
    sys.path.insert(0, sys.argv[1])
    from support.handmil import const, op, program, ttype

    C, S, N = 64, 256, 48  # 16,384-element (64 KiB fp32) intermediates, as a short prompt's; N programs
    act = ttype("fp16", [1, C, 1, S])

    def text(i):
        return program({"x": act}, [const("a", "fp16", 0.5 + i / 64), op("m", act, "mul", x="x", y="a"),
                                    op("t", act, "tanh", x="m"), op("s", act, "sigmoid", x="t"),
                                    op("out", act, "tanh", x="s")], ["out"])

    def rss():
        # Heap memory freed by the builds goes back first: glibc keeps freed blocks mapped at will,
        # and this counts what the programs hold.
        ctypes.CDLL(None).malloc_trim(0)
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024

    programs = [orion.compile(text(i)) for i in range(N)]
    ins, outs = programs[0].allocate_surfaces()
    x = np.random.default_rng(0).standard_normal((1, C, 1, S)).astype(np.float16)
    ins["x"].write(x)
    programs[0].evaluate(ins, outs)  # surfaces and the pool's first buffers
    base = rss()
    for p in programs[1:]:
        p.evaluate(ins, outs)
    grown = rss() - base
    a = np.float64(np.float16(0.5 + (N - 1) / 64))
    f16 = lambda v: v.astype(np.float16).astype(np.float64)
    ref = f16(np.tanh(f16(1 / (1 + np.exp(-f16(np.tanh(f16(x.astype(np.float64) * a))))))))
    print(json.dumps({"grown": grown, "worst": float(np.max(np.abs(outs["out"].read().astype(np.float64) - ref)))}))
""")


def test_programs_share_the_frames_of_small_intermediates() -> None:
    """Intermediates of 16 Ki elements (a 16-token prefill's [768, 16] or a decode's padded I/O) are
    pooled too: 47 more programs with three 64 KiB intermediates each add about nothing (unpooled they
    would hold 9 MiB); the result matches numpy rounded like the ANE (fp16 per op)."""
    out = subprocess.run([sys.executable, "-c", SMALL_FRAMES, str(Path(__file__).resolve().parent)],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["worst"] <= 2e-3, result  # fp16 rounding of values below 1 in magnitude
    assert result["grown"] < 2 << 20, result  # 47 x 3 x 64 KiB = 8.8 MiB when each program keeps its own


def attention_program(seq: int, scale: float) -> tuple[CompiledGraph, CompiledGraph]:
    """GPT-2's causal attention over ``seq`` tokens (the fused chain, its mask a const) and its unfused twin."""
    g = Graph("attn")
    q, k, v = (g.mul(g.input(n, [1, 64, 1, seq]), scale, name=f"{n}_scaled") for n in "qkv")
    g.output(g.attention(q, k, v, 2, causal=True, name="core"), "y")
    return twins(g)


def test_programs_baking_one_causal_mask_hold_it_once() -> None:
    """Four prefill-like programs with the same [256, 256] mask each compute what the unfused ops do,
    fused, falling back (scores over the exactness bound) and fused again, against float64 too."""
    pairs = [attention_program(256, 1.0 + i / 8) for i in range(4)]
    rng = np.random.default_rng(4)
    for amplitude in (1.0, 60.0, 1.0):  # 60: the fused kernel declines, the chain's own kernels run
        xs = {n: (rng.standard_normal((1, 64, 1, 256)) * amplitude).astype(np.float16) for n in "qkv"}
        for fused, unfused in pairs:
            np.testing.assert_array_equal(fused(**xs)["y"], unfused(**xs)["y"])
    q, k, v = (xs[n].astype(np.float64).reshape(2, 32, 256) for n in "qkv")
    s = np.where(np.triu(np.ones((256, 256), bool), 1), -np.inf, np.einsum("bdi,bdj->bij", q, k) / np.sqrt(32))
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("bdj,bij->bdi", v, p / p.sum(-1, keepdims=True)).reshape(1, 64, 1, 256)
    got = pairs[0][0](**xs)["y"].astype(np.float64)
    np.testing.assert_allclose(got, want, atol=2e-2 * np.abs(want).max())  # fp16 rounding per op


HELD_MASKS = textwrap.dedent("""
    import ctypes, json, sys
    import orion
    from orion import _core
    from orion.compiler import lower_graph
    from orion.graph import Graph

    def rss():
        # Heap memory freed by the builds (the folded mask's intermediates) goes back first: glibc keeps
        # freed blocks mapped at will, and this counts what the programs hold.
        ctypes.CDLL(None).malloc_trim(0)
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024

    g = Graph("attn")
    q, k, v = (g.input(n, [1, 64, 1, 1024]) for n in "qkv")
    g.output(g.attention(q, k, v, 2, causal=True, name="core"), "y")
    lowered = lower_graph(g)
    first = orion.compile(lowered.mil, lowered.weights)
    base, held = rss(), _core.kernels.shared_consts()
    more = [orion.compile(lowered.mil, lowered.weights) for _ in range(7)]
    print(json.dumps({"held": held, "after": _core.kernels.shared_consts(), "grown": rss() - base}))
    del first, more
    print(json.dumps({"freed": _core.kernels.shared_consts()}))
""")


def test_the_mask_is_held_once_per_process() -> None:
    """Eight programs baking one [1024, 1024] causal mask hold a single 4 MiB fp32 copy (a GPT-2
    1024-token bucket held twelve: 48 MiB), freed with the last program (in a fresh interpreter)."""
    out = subprocess.run([sys.executable, "-c", HELD_MASKS], capture_output=True, text=True, timeout=300, check=True)
    first, second = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert first["held"] == first["after"] == [1, 1024 * 1024 * 4], first
    assert first["grown"] < 8 << 20, first  # seven more copies would be 28 MiB
    assert second["freed"] == [0, 0], second


def test_generate_compiles_the_buckets_it_reaches_before_the_first_decode_step(monkeypatch) -> None:
    """The buckets a generation reaches are compiled after its first token (which needs none of them) and before
    its first decode step: none in the middle of the generation (issue 25 item 3)."""
    import orion
    from orion.generation import loop

    model = GPT2(CONFIG, random_weights(CONFIG, seed=2), progress=False)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, CONFIG.vocab_size, 60)]
    steps = model.generate(ids, 20, temperature=0, ignore_eos=True)
    next(steps)
    assert model.decode_plan.layers_by_context == {}  # one layer, one program: none before the first decode step
    next(steps)
    compiled = orion.compile_count()
    assert sorted(model.decode_plan.layers_by_context) == [64, 256]
    assert len(list(steps)) == 18 and model.cache.bucket == 256  # grew from 64 to 256 positions mid-generation
    assert orion.compile_count() == compiled and sorted(model.decode_plan.layers_by_context) == [64, 256]
    # Short of budget (ANE-11), the reserve for new prompt lengths wins: buckets compile when first used.
    monkeypatch.setattr(loop, "compiles_left", lambda: 2)
    assert model.prepare(1024) == [] and 1024 not in model.decode_plan.layers_by_context


def test_a_prompt_builds_no_decode_layer_and_the_first_decode_step_does() -> None:
    """At one layer per program, the decode layer programs wait for the first decode step: a prompt's logits
    come from its prefill programs and the LM head, so a (warm) start reaches its first token without them.
    The prompt builds its bucket's programs and nothing more; the steps after (and a fork's) give, bit for bit,
    what a model whose decode layers were compiled before the prompt (``prepare``, as ``generate`` does) gives."""
    config = GPT2Config(n_layer=3, n_head=4, n_embd=64, vocab_size=512, n_positions=256)
    weights = random_weights(config, seed=6)
    ids = [int(t) for t in np.random.default_rng(7).integers(0, config.vocab_size, 20)]
    eager = GPT2(config, weights, progress=False, fusion_depth=1)
    shortest = eager.cache.buckets[0]
    assert eager.prepare(len(ids) + 4) == [shortest] and sorted(eager.decode_plan.layers_by_context) == [shortest]
    lazy = GPT2(config, weights, progress=False, fusion_depth=1)
    programs = lambda: lazy.builder.built + lazy.builder.cached  # noqa: E731 -- built by this model's builder
    heads = len(lazy.decode_plan.head_programs)
    assert lazy.decode_plan.layers_by_context == {} and programs() == heads
    np.testing.assert_array_equal(lazy.prefill(ids), eager.prefill(ids))
    assert lazy.decode_plan.layers_by_context == {} and programs() == heads + config.n_layer  # the prompt bucket's
    twin = lazy.fork()
    for token in ids[:4]:
        want = eager.decode_step(token)
        np.testing.assert_array_equal(lazy.decode_step(token), want)
        np.testing.assert_array_equal(twin.decode_step(token), want)
    assert sorted(lazy.decode_plan.layers_by_context) == [shortest]
    assert programs() == heads + 2 * config.n_layer  # the fork shares the plan


def test_a_streamed_generation_yields_its_first_token_before_any_decode_layer_is_built() -> None:
    """``generate`` reads the prompt before it compiles the decode programs (``prepare``), so its first token
    waits for the prompt's programs and the LM head only; the buckets it reaches come before its first decode
    step. Every step's logits are, bit for bit, those of the order before (``prepare`` first), and a generation
    of one token builds no decode layer at all."""
    config = GPT2Config(n_layer=2, n_head=6, n_embd=384, vocab_size=512, n_positions=1024)  # buckets 64, 256, 1024
    weights = random_weights(config, seed=8)
    ids = [int(t) for t in np.random.default_rng(9).integers(0, config.vocab_size, 50)]
    new = 30  # 80 positions: past the shortest bucket (64)

    def run(model: GPT2, seen: list[np.ndarray]):
        record = lambda history, logits: seen.append(logits.copy()) or logits  # noqa: E731
        return model.generate(ids, new, temperature=0, ignore_eos=True, logits_processor=record)

    eager = GPT2(config, weights, progress=False, fusion_depth=1)
    reach = [t for t in eager.cache.buckets if t < len(ids) + new] + [eager.cache.bucket_for(len(ids) + new)]
    assert len(reach) == 2 and eager.prepare(len(ids) + new) == reach  # the order before: decode programs first
    want_logits: list[np.ndarray] = []
    want = list(run(eager, want_logits))

    lazy = GPT2(config, weights, progress=False, fusion_depth=1)
    programs = lambda: lazy.builder.built + lazy.builder.cached  # noqa: E731 -- built by this model's builder
    heads = len(lazy.decode_plan.head_programs)
    seen: list[np.ndarray] = []
    steps = run(lazy, seen)
    got = [next(steps)]
    assert lazy.decode_plan.layers_by_context == {} and programs() == heads + config.n_layer  # the prompt's bucket
    got.append(next(steps))  # the first decode step: every bucket the generation reaches is compiled before it
    assert sorted(lazy.decode_plan.layers_by_context) == reach
    built = programs()
    got += list(steps)
    assert programs() == built and lazy.cache.bucket == reach[-1]  # none compiled in the middle
    assert got == want and len(seen) == len(want_logits) == new
    for step, (a, b) in enumerate(zip(seen, want_logits)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")

    single = GPT2(config, weights, progress=False, fusion_depth=1)
    assert list(single.generate(ids, 1, temperature=0)) == want[:1] and single.decode_plan.layers_by_context == {}


def test_generate_compiles_what_prepare_before_the_prompt_did_when_the_budget_is_tight(monkeypatch) -> None:
    """With the prompt read first, its compiles come out of ``prepare``'s reserve (it is a prompt of a new length):
    on a budget that fits both decode buckets and the prompt's own bucket only so, the decode buckets and the
    prompt's bucket are those of the order before (``prepare`` first); without that, ``prepare`` would stop a
    bucket short (64 only) and compile 256 in the middle of the generation."""
    import orion
    from orion.generation import loop

    config = GPT2Config(n_layer=2, n_head=6, n_embd=384, vocab_size=512, n_positions=1024)  # buckets 64, 256, 1024
    ids = [int(t) for t in np.random.default_rng(11).integers(0, config.vocab_size, 50)]
    new = 30
    outcomes = []
    for eager in (True, False):  # weights of their own: no program of one is the other's (the compile counts)
        model = GPT2(config, random_weights(config, seed=10 + eager), progress=False, fusion_depth=1)
        plan = model.decode_plan
        assert (len(plan.layer_ranges), len(plan.head_programs), loop.COMPILE_RESERVE) == (2, 1, 2)
        # prepare: 64 and 256 leave 2 + 6 (the reserve: two sets of 3); the prompt's own 64 bucket (2) then
        # leaves room for the 1024 decode bucket (2) and the largest prompt bucket (2): 10 compiles, no fewer.
        limit = orion.compile_count() + 10
        monkeypatch.setattr(loop, "compiles_left", lambda limit=limit: limit - orion.compile_count())
        if eager:
            model.prepare(len(ids) + new)
        steps = model.generate(ids, new, temperature=0, ignore_eos=True)
        next(steps), next(steps)  # the first token, then the first decode step
        ahead = sorted(plan.layers_by_context)
        assert len(list(steps)) == new - 2
        prompts = sorted(seq for seq, *_ in model.programs.prefill_plans)
        outcomes.append((ahead, sorted(plan.layers_by_context), prompts, limit - orion.compile_count()))
    assert outcomes[0] == ([64, 256], [64, 256], [64], 4) and outcomes[1] == outcomes[0], outcomes


def test_prepare_compiles_the_next_decode_steps_bucket_even_into_the_reserve(monkeypatch) -> None:
    """A budget that keeps ``prepare`` from compiling buckets ahead (it leaves COMPILE_RESERVE sets for prompts of
    new lengths) still lets it compile the bucket of the next decode step, which that step would compile anyway:
    the first decode step then compiles nothing (it compiled the model's 24 Qwen2.5-0.5B layers in bench_peers'
    timed steps), and the logits are unchanged."""
    import orion
    from orion.generation import loop

    config = GPT2Config(n_layer=2, n_head=6, n_embd=384, vocab_size=512, n_positions=1024)  # buckets 64, 256, 1024
    weights = random_weights(config, seed=21)
    ids = [int(t) for t in np.random.default_rng(22).integers(0, config.vocab_size, 20)]
    reference = GPT2(config, weights, progress=False, fusion_depth=1)
    want = [reference.prefill(ids)]
    want.append(reference.decode_step(int(np.argmax(want[0]))))
    model = GPT2(config, weights, progress=False, fusion_depth=1)
    plan = model.decode_plan
    first = model.prefill(ids)
    limit = orion.compile_count() + 2 + 5  # one bucket's 2 layer programs, less than the reserve (2 sets of 3) more
    monkeypatch.setattr(loop, "compiles_left", lambda: limit - orion.compile_count())
    assert model.prepare(len(ids) + 100) == [64]  # 256 and 1024 stay for later: the reserve holds
    before = orion.compile_count()
    step = model.decode_step(int(np.argmax(first)))
    assert orion.compile_count() == before and sorted(plan.layers_by_context) == [64]
    np.testing.assert_array_equal(first, want[0])
    np.testing.assert_array_equal(step, want[1])


def test_prompts_share_a_compiled_bucket_when_the_budget_is_short(monkeypatch) -> None:
    """Short of compiles for a prompt bucket of its own (after the decode buckets and the largest prompt
    bucket are reserved), a prompt runs in a compiled bucket that holds it, its tokens the live lanes: the
    same logits, bit for bit, as in its own bucket, and no compile."""
    from orion.generation import loop

    weights = random_weights(CONFIG, seed=4)
    ids = [int(t) for t in np.random.default_rng(5).integers(0, CONFIG.vocab_size, 100)]
    own = GPT2(CONFIG, weights, progress=False)
    expected = {n: own.prefill(ids[:n]) for n in (10, 100)}
    assert sorted(seq for seq, *_ in own._programs.prefill_plans) == [32, 128]

    model = GPT2(CONFIG, weights, progress=False, prefill_chunk=256)
    monkeypatch.setattr(loop, "compiles_left", lambda: 0)
    np.testing.assert_array_equal(model.prefill(ids[:100]), expected[100])  # the largest bucket: 256
    import orion
    compiled = orion.compile_count()
    np.testing.assert_array_equal(model.prefill(ids[:10]), expected[10])  # in the 256 bucket too
    assert orion.compile_count() == compiled
    assert sorted(seq for seq, *_ in model._programs.prefill_plans) == [256]
    tokens = [int(np.argmax(model.decode_step(int(np.argmax(expected[10])))))]
    own.prefill(ids[:10])
    assert tokens == [int(np.argmax(own.decode_step(int(np.argmax(expected[10])))))]


def test_prefill_layer_stages_share_their_key_and_value_surfaces(monkeypatch) -> None:
    """A prefill's layer programs run in turn, each one's keys and values read out before the next runs: the
    stages share one surface per output place, those the program packed together (ANE-37) too, and fill the
    cache and the logits bit for bit as stages with surfaces of their own do (the reference: the same model
    bound without sharing)."""
    from orion.generation import plan
    from orion.models.llama import weights as llama_weights
    from orion.models.llama.config import LlamaConfig
    from orion.models.llama.model import Llama

    config = LlamaConfig(dim=96, n_layers=6, n_heads=4, n_kv_heads=2, head_dim=24, hidden_dim=128, vocab_size=160,
                         max_position_embeddings=256)
    weights = llama_weights.random_weights(config, seed=5)
    ids = [int(i) for i in np.random.default_rng(6).integers(0, 160, 90)]
    model = Llama(config, weights, progress=False, fusion_depth=3)  # 7 outputs a program: packed (ANE-37)
    logits = model.prefill(ids)
    (stages, _), = model._prefill_stages.values()
    assert len(stages) == 2
    packed = {s.surface for stage in stages for s in stage.compiled.layout.outputs if s.name != "x" and s.surface}
    assert packed, "the keys and values of a layer are packed in one surface (ANE-37)"
    for name in packed:
        assert stages[0].outputs[name] is stages[1].outputs[name]

    def unshared(self: plan.PrefillPlan, io_dtype: str):
        return plan._bind(self.layer_programs, self.head_programs, io_dtype)

    monkeypatch.setattr(plan.PrefillPlan, "bind", unshared)
    reference = Llama(config, weights, progress=False, fusion_depth=3)
    np.testing.assert_array_equal(logits, reference.prefill(ids))
    (own, _), = reference._prefill_stages.values()
    assert own[0].outputs[next(iter(packed))] is not own[1].outputs[next(iter(packed))]
    for mine, theirs in zip(model.cache.keys + model.cache.values, reference.cache.keys + reference.cache.values):
        np.testing.assert_array_equal(mine[:, :, :len(ids)], theirs[:, :, :len(ids)])


def test_a_long_prompt_is_embedded_in_pieces_with_the_same_values(monkeypatch) -> None:
    """A prompt's rows are embedded ``EMBED_ROWS`` tokens at a time (its float32 rows are not all held at once):
    the logits and the cache are those of one piece per prompt, bit for bit, chunked prompts too (a piece
    starting at a chunk's first position)."""
    from orion.generation import loop

    weights = random_weights(CONFIG, seed=7)
    ids = [int(i) for i in np.random.default_rng(8).integers(0, CONFIG.vocab_size, 150)]
    runs = []
    for rows in (1 << 20, 7):  # every prompt in one piece; pieces of 7 tokens, across the chunks of 64
        monkeypatch.setattr(loop, "EMBED_ROWS", rows)
        model = GPT2(CONFIG, weights, progress=False, prefill_chunk=64)
        logits = model.prefill(ids)
        runs.append((logits, [a[:, :, :len(ids)].copy() for a in model.cache.keys + model.cache.values]))
    (whole, whole_cache), (pieces, pieces_cache) = runs
    np.testing.assert_array_equal(whole, pieces)
    for a, b in zip(whole_cache, pieces_cache):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(whole, reference_logits(CONFIG, weights, ids)[-1], atol=0.03 * np.abs(whole).max())
