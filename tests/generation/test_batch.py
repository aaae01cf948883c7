"""Batched decode (orion.generation.batch): sequences in the lanes of one model's decode programs give,
token for token, what separate runs of the single-sequence model give, whatever joins or leaves
meanwhile, with per-sequence samplers and adapters, and without a compile per batch size.

References: the same model generating each prompt alone (``CausalLM.generate``, its single-lane
programs); greedy tokens must be equal, sampled ones too (same seed: the same draws from the same
logits up to fp16 rounding of the batched attention, which these prompts do not cross)."""

from __future__ import annotations

import numpy as np
import pytest

import orion
from orion.generation.batch import Batch, BatchFull
from orion.generation.loop import GenerationError
from orion.generation.prefix_cache import PrefixCache
from orion.lora import LoraAdapter
from orion.models import GPT2, GemmaConfig, GPT2Config, Llama, LlamaConfig
from orion.ops import packed_causal_mask
from support.gpt2_fixtures import lively_weights
from support.llama_fixtures import lively

# prefill_chunk 32: the longer prompts are read in chunks, interleaved with the other lanes' decode steps
GPT2_CONFIG = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=300, n_positions=128)
LLAMA_CONFIG = LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=160,
                           max_position_embeddings=128, rope_convention="half", rope_theta=500.0)
# sliding windows of 8 (every layer; Gemma 3's first layer, with its local RoPE): each lane's window mask is its own
WINDOWED = {"mistral-window": LlamaConfig(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=16, hidden_dim=96,
                                          vocab_size=160, max_position_embeddings=128, model_type="mistral",
                                          sliding_window=8),
            "gemma3-window": GemmaConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96,
                                         vocab_size=160, max_position_embeddings=128, sliding_window=8,
                                         sliding_layers=(0,), query_pre_attn_scalar=16, model_type="gemma3_text",
                                         qk_norm=True, rope_theta=1e6)}
LENGTHS = (3, 9, 17, 31, 5, 40, 12, 70)
NEW = 12


def prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in LENGTHS]


@pytest.fixture(scope="module")
def gpt2() -> GPT2:
    return GPT2(GPT2_CONFIG, lively_weights(GPT2_CONFIG, seed=3), progress=False, prefill_chunk=32)


@pytest.fixture(scope="module")
def llama() -> Llama:
    return Llama(LLAMA_CONFIG, lively(LLAMA_CONFIG, seed=4), progress=False, prefill_chunk=32)


@pytest.fixture(scope="module")
def gpt2_lanes(gpt2) -> GPT2:
    return gpt2.with_lanes(8)


def alone(model, prompt: list[int], **options) -> list[int]:
    return list(model.generate(prompt, NEW, **options))


@pytest.mark.parametrize("name", ["gpt2", "llama", *WINDOWED])
def test_eight_prompts_in_one_batch_match_eight_separate_runs(name, request) -> None:
    if name in WINDOWED:
        model = orion.models.random(WINDOWED[name], seed=5, progress=False, prefill_chunk=32)
    else:
        model = request.getfixturevalue(name)
    batched = request.getfixturevalue("gpt2_lanes") if name == "gpt2" else model.with_lanes(8)
    ps = prompts(model.dims.vocab_size)
    want = [alone(model, p, temperature=0) for p in ps]
    assert len({tuple(w) for w in want}) == len(ps)  # different prompts, different continuations
    batch = Batch(batched)
    runs = [batch.submit(p, NEW, temperature=0) for p in ps]
    batch.run()
    assert [r.token_ids for r in runs] == want
    assert all(r.finish_reason == "length" for r in runs) and batch.active == 0


def test_joining_and_leaving_mid_batch_change_no_ones_tokens(gpt2, gpt2_lanes) -> None:
    ps = prompts(GPT2_CONFIG.vocab_size, seed=1)
    lengths = [NEW, 4, NEW, 7, NEW, 2, NEW, NEW]  # some leave early, freeing lanes for later joiners
    want = [list(gpt2.generate(p, n, temperature=0)) for p, n in zip(ps, lengths)]
    batch = Batch(gpt2_lanes)
    runs = [batch.submit(p, n, temperature=0) for p, n in zip(ps[:3], lengths[:3])]
    for _ in range(5):
        batch.step()
    runs += [batch.submit(p, n, temperature=0) for p, n in zip(ps[3:], lengths[3:])]  # join mid-batch
    batch.run()
    assert [r.token_ids for r in runs] == want


def test_a_lone_lane_steps_on_the_one_lane_programs_with_the_many_lane_steps_logits(gpt2, gpt2_lanes) -> None:
    # One sequence decodes alone (on ``alone``), across the 64-position bucket, with a truncation (a speculative
    # rejection) and a second sequence joining and leaving in between (lanes steps, then alone again).
    p, q = prompts(GPT2_CONFIG.vocab_size, seed=8)[4:6]
    gpt2.prepare(GPT2_CONFIG.n_positions)
    solo = gpt2.fork()

    def run(batch: Batch) -> tuple[list[int], list[np.ndarray]]:
        a, b = batch.join(p), None
        tokens, seen = [], []
        for step in range(80):
            seen.append(batch.logits(a))
            tokens.append(int(np.argmax(seen[-1])))
            if step == 30:  # tokens 26.. rejected: 26 checked again (the chunk programs), its next token chosen
                batch.truncate(a, len(p) + 26)
                del tokens[27:]
                tokens.append(int(np.argmax(batch.check(a, tokens[-1:])[-1])))
            if step == 40:
                b = batch.join(q)
            if step == 52:
                batch.leave(b)
                b = None
            if b is not None and batch.ready(b):
                batch.feed(b, int(np.argmax(batch.logits(b))))
            batch.feed(a, tokens[-1])
        return tokens, seen

    got_tokens, got_logits = run(Batch(gpt2_lanes, alone=solo))  # first: a cache left by the same run is no help
    want_tokens, want_logits = run(Batch(gpt2_lanes))
    assert int(solo.cache.lengths[0]) > 64  # it stepped alone, into the second bucket
    assert got_tokens == want_tokens
    for got, want in zip(got_logits, want_logits):
        np.testing.assert_array_equal(got, want)  # the one-lane programs compute a lane as the many-lane ones do
    assert want_tokens[:27] == list(gpt2.generate(p, 27, temperature=0))  # the lanes' steps: the model's tokens
    with pytest.raises(GenerationError, match="one-lane model"):
        Batch(gpt2_lanes, alone=gpt2_lanes)


def read_together(model, ps: list[list[int]]) -> list[np.ndarray]:
    """The logits after each of ``ps``, joined at once and read in one step (one packed pass)."""
    batch = Batch(model)
    sequences = [batch.join(p) for p in ps]
    batch.advance()
    assert all(batch.ready(s) for s in sequences), "the prompts were not read in one step"
    return [batch.logits(s) for s in sequences]


@pytest.mark.parametrize("name", ["gpt2", "llama", *WINDOWED])
def test_prompts_joining_together_are_read_in_one_pass_as_separate_runs_read_them(name, request) -> None:
    if name in WINDOWED:  # prompts of 9 and 17 tokens cross their windows of 8
        model = orion.models.random(WINDOWED[name], seed=5, progress=False, prefill_chunk=32)
    else:
        model = request.getfixturevalue(name)
    lanes = request.getfixturevalue("gpt2_lanes") if name == "gpt2" else model.with_lanes(4)
    assert lanes.packs_prompts and lanes.options.packed_chunk == 32
    ps = [p for p in prompts(model.dims.vocab_size, seed=8) if len(p) < 20][:3]  # 3, 9 and 17 tokens: 29 lanes
    got = read_together(lanes, ps)
    for p, logits in zip(ps, got):  # each prompt attends to itself alone: GPT-2's logits are bit for bit the
        # separate run's; the others' within fp16 rounding (their RoPE tables inputs here, consts in the prompt program)
        want = model.prefill(p)
        np.testing.assert_allclose(logits, want, rtol=0, atol=0 if name == "gpt2" else 1e-3 * np.abs(want).max())
    batch = Batch(lanes)
    runs = [batch.submit(p, NEW, temperature=0) for p in ps]
    batch.run()
    assert [r.token_ids for r in runs] == [alone(model, p, temperature=0) for p in ps]


def test_with_a_prefix_cache_new_prompts_are_read_together_and_stored(gpt2) -> None:
    lanes = gpt2.with_lanes(4)
    lanes.prefix_cache = PrefixCache(1 << 24)  # keeps prompts of 16 tokens or more
    ps = [p for p in prompts(GPT2_CONFIG.vocab_size, seed=8) if len(p) < 20][:3]  # 3, 9 and 17 tokens
    for p, logits in zip(ps, read_together(lanes, ps)):
        np.testing.assert_array_equal(logits, gpt2.prefill(p))
    assert len(lanes.prefix_cache) == 1 and lanes._packable(ps[0])
    assert not lanes._packable(ps[2] + [1, 2])  # starts with the stored prompt: copies it in, reads the rest alone


@pytest.mark.parametrize("length", [17, 40], ids=["packable", "read in chunks"])
def test_a_prompt_the_prefix_cache_holds_is_not_read_again_and_decodes_with_the_others(gpt2, monkeypatch,
                                                                                       length) -> None:
    """A repeated prompt (its every position but the last in the prefix cache) joins with no prefill: its positions
    are copied in and its last token decodes in the step it joins at, with the other lanes'; its tokens are a
    separate run's (greedy)."""
    lanes = gpt2.with_lanes(4)
    lanes.prefix_cache = PrefixCache(1 << 24)  # keeps prompts of 16 tokens or more
    p = next(q for q in prompts(GPT2_CONFIG.vocab_size, seed=8) if len(q) == length)
    want = alone(gpt2, p, temperature=0)
    batch = Batch(lanes)
    first = batch.submit(p, NEW, temperature=0)
    batch.run()
    assert first.token_ids == want and len(lanes.prefix_cache) == 1

    def read(*args):
        raise AssertionError("a prompt held by the prefix cache was read again")

    monkeypatch.setattr(lanes, "_prefill_pieces", read)
    monkeypatch.setattr(lanes, "_read_packed", read)
    again = [batch.submit(p, NEW, temperature=0) for _ in range(3)]
    batch.step()  # the three join and this one decode step gives each its first token
    assert [len(r.token_ids) for r in again] == [1, 1, 1]
    batch.run()
    assert [r.token_ids for r in again] == [want] * 3 and lanes.prefix_cache.stats.hits == 3


def test_a_packed_read_without_the_per_prompt_mask_is_caught(gpt2, gpt2_lanes, monkeypatch) -> None:
    """The comparison above fails when the prompts see each other: a plain causal mask over the packed lanes."""
    ps = [p for p in prompts(GPT2_CONFIG.vocab_size, seed=8) if len(p) < 20][:3]
    causal = lambda lengths, seq: packed_causal_mask([seq], seq)  # noqa: E731 -- one prompt: plain causal
    monkeypatch.setattr("orion.generation.loop.packed_causal_mask", causal)
    got = read_together(gpt2_lanes, ps)
    np.testing.assert_array_equal(got[0], gpt2.prefill(ps[0]))  # the first prompt sees only itself anyway
    for p, logits in zip(ps[1:], got[1:]):
        assert np.abs(logits - gpt2.prefill(p)).max() > 1e-2


def test_lanes_level_join_feed_fork_leave(gpt2, gpt2_lanes) -> None:
    p, q = prompts(GPT2_CONFIG.vocab_size, seed=2)[2:4]
    want_p, want_q = alone(gpt2, p, temperature=0), alone(gpt2, q, temperature=0)
    batch = Batch(gpt2_lanes)
    a = batch.join(p)
    logits = batch.logits(a)
    twin = batch.fork(a)  # a second choice of the same prompt: the same cache and logits
    np.testing.assert_array_equal(batch.logits(twin), logits)
    b = batch.join(q)  # read over the next steps, while a and twin decode
    tokens: dict[int, list[int]] = {a: [], twin: [], b: []}
    for step in range(NEW):
        for s, got in tokens.items():
            got.append(int(np.argmax(batch.logits(s))))
            if len(got) < NEW:
                batch.feed(s, got[-1])
        if step == 4:
            batch.leave(twin)  # leaves mid-way, its token fed: the others are unchanged
            left = tokens.pop(twin)
    assert tokens[a] == want_p and tokens[b] == want_q and left == want_p[:5]
    with pytest.raises(GenerationError, match="no sequence"):
        batch.logits(twin)


def test_a_full_batch_refuses_another_lane(gpt2) -> None:
    batch = Batch(gpt2.with_lanes(2))
    batch.join([1, 2, 3])
    batch.join([4, 5])
    with pytest.raises(BatchFull, match="all 2 lanes"):
        batch.join([6])


def test_samplers_are_per_sequence(gpt2, gpt2_lanes) -> None:
    ps = prompts(GPT2_CONFIG.vocab_size, seed=5)[:4]
    settings = [dict(temperature=0.9, seed=1), dict(temperature=0.7, top_k=20, seed=2),
                dict(temperature=1.1, top_p=0.8, seed=3), dict(temperature=0, repetition_penalty=1.3)]
    want = [alone(gpt2, p, **s) for p, s in zip(ps, settings)]
    batch = Batch(gpt2_lanes)
    runs = [batch.submit(p, NEW, **s) for p, s in zip(ps, settings)]
    runs.append(batch.submit(ps[0], NEW, stop=[want[0][3]], temperature=0.9, seed=1))  # a stop token
    batch.run()
    assert [r.token_ids for r in runs[:4]] == want
    assert runs[4].token_ids == want[0][:4] and runs[4].finish_reason == "stop" and runs[4].stopped_by == want[0][3]


def test_a_mixed_adapter_batch_matches_separate_runs(gpt2) -> None:
    lanes = gpt2.with_lanes(4)
    placements = sorted(lanes.lora_placements())
    rng = np.random.default_rng(9)
    for name in ("a", "b"):
        modules = {path: (rng.normal(0, 0.3, (4, p.in_features)).astype(np.float32),
                          rng.normal(0, 0.3, (p.out_features, 4)).astype(np.float32))
                   for path, p in ((path, lanes.lora_placements()[path]) for path in placements)}
        adapter = LoraAdapter(4, 8.0, modules)
        lanes.add_adapter(adapter, name)
        if name not in gpt2.adapters:
            gpt2.add_adapter(adapter, name)
    ps = prompts(GPT2_CONFIG.vocab_size, seed=6)[:6]
    adapters = [None, "a", "b", "a", None, "b"]
    want = []
    for p, adapter in zip(ps, adapters):
        gpt2.set_adapter(adapter)
        want.append(alone(gpt2, p, temperature=0))
    gpt2.set_adapter(None)
    assert want[1] != alone(gpt2, ps[1], temperature=0)  # the adapters change the tokens
    batch = Batch(lanes)
    runs = [batch.submit(p, NEW, temperature=0, adapter=a) for p, a in zip(ps, adapters)]
    batch.run()
    assert [r.token_ids for r in runs] == want


def test_the_compile_count_does_not_move_with_the_batch_size(gpt2) -> None:
    lanes = gpt2.with_lanes(4)
    ps = prompts(GPT2_CONFIG.vocab_size, seed=7)
    warm = Batch(lanes)  # the prefill buckets these prompts use, compiled once
    for p in ps:
        warm.submit(p, 2, temperature=0)
    warm.run()
    before = orion.compile_count()
    for size in (1, 2, 3, 4):
        batch = Batch(lanes)
        for p in ps[:size]:
            batch.submit(p, NEW, temperature=0)
        batch.run()
        assert orion.compile_count() == before, f"{size} sequences compiled a program"


def test_a_joined_sequence_gets_its_first_logits_before_any_decode_layer_is_built() -> None:
    """``join`` compiles a sequence's decode programs once its prompt is read, before its first decode step (its
    first logits need none): every bucket it reaches then, none in the middle; its logits are, bit for bit, those
    of the order before (``prepare`` first), and a fork of it decodes on the same programs."""
    config = GPT2Config(n_layer=2, n_head=6, n_embd=384, vocab_size=300, n_positions=1024)  # KV buckets 64, 256, 1024
    weights = lively_weights(config, seed=5)
    ids = [int(t) for t in np.random.default_rng(6).integers(0, config.vocab_size, 50)]
    new = 30  # 80 positions: buckets 64 and 256

    def run(eager: bool) -> tuple[list[np.ndarray], list[list[int]]]:
        model = GPT2(config, weights, progress=False, fusion_depth=1).with_lanes(2)
        if eager:
            model.prepare(len(ids) + new)
        batch = Batch(model)
        sequence = batch.join(ids, new_tokens=new)
        rows = [batch.logits(sequence)]
        buckets = [sorted(model.decode_plan.layers_by_context)]
        twin = batch.fork(sequence)
        for step in range(new - 1):
            for s in (sequence, twin):
                batch.feed(s, int(np.argmax(rows[-1])))
            rows.append(batch.logits(sequence))
            np.testing.assert_array_equal(batch.logits(twin), rows[-1])
            if step == 0:
                compiled = orion.compile_count()
                buckets.append(sorted(model.decode_plan.layers_by_context))
        assert orion.compile_count() == compiled and model.cache.bucket == 256
        return rows, buckets

    want, before = run(eager=True)
    got, buckets = run(eager=False)
    assert before == [[64, 256], [64, 256]] and buckets == [[], [64, 256]]
    for step, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b, err_msg=f"step {step}")


def test_an_occupied_cache_keeps_its_bucket_when_the_longest_sequence_leaves() -> None:
    """Only an empty cache shrinks: were the bucket to follow the longest sequence down, every lane's positions
    would move to a shorter one and back as sequences come and go. The short one's tokens are its own run's."""
    config = GPT2Config(n_layer=2, n_head=6, n_embd=384, vocab_size=300, n_positions=1024)  # KV buckets 64, 256, 1024
    model = GPT2(config, lively_weights(config, seed=5), progress=False, fusion_depth=1)
    lanes = model.with_lanes(2)
    assert lanes.cache.buckets == (64, 256, 1024)
    short, long = [7, 3, 11, 5], [int(t) for t in np.random.default_rng(4).integers(0, config.vocab_size, 70)]
    want = alone(model, short, temperature=0)
    batch = Batch(lanes)
    a, b = batch.join(long), batch.join(short)
    got = []
    for step in range(NEW):
        got.append(int(np.argmax(batch.logits(b))))
        batch.feed(b, got[-1])
        if step < 2:
            batch.feed(a, int(np.argmax(batch.logits(a))))
        elif step == 2:
            assert lanes.cache.bucket == 256  # the long sequence's
            batch.leave(a)
    assert lanes.cache.bucket == 256 and got == want
    batch.leave(b)
    batch.logits(batch.join(short))  # the cache was empty: the shortest bucket again
    assert lanes.cache.bucket == 64
