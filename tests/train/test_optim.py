"""AdamW, the global gradient norm and clipping against torch.optim.AdamW and a float64 numpy reference."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from orion.train.errors import TrainError
from orion.train.optim import AdamW, clip_coefficient, grad_norm
from support.references import require

SHAPES = {"embed": (96, 40), "wq": (40, 40), "norm": (40,), "w1": (300, 700), "bias": (7,)}  # w1 spans 4 blocks
DECAY = {"embed", "wq", "w1"}
HYPER = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def _params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def _grads(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 + step)
    return {n: (rng.standard_normal(s) * 10.0 ** rng.uniform(-4, 1)).astype(np.float32) for n, s in SHAPES.items()}


def _adamw_float64(params, grads_per_step, lr, betas, eps, weight_decay, decay, grad_scales):
    """Textbook AdamW (Loshchilov & Hutter, with torch's bias correction) in float64."""
    p = {n: a.astype(np.float64) for n, a in params.items()}
    m = {n: np.zeros_like(a) for n, a in p.items()}
    v = {n: np.zeros_like(a) for n, a in p.items()}
    b1, b2 = betas
    for t, (grads, scale) in enumerate(zip(grads_per_step, grad_scales, strict=True), start=1):
        for n in p:
            g = grads[n].astype(np.float64) * scale
            if n in decay:
                p[n] *= 1 - lr * weight_decay
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            m_hat, v_hat = m[n] / (1 - b1**t), v[n] / (1 - b2**t)
            p[n] -= lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def test_adamw_matches_torch_over_20_steps() -> None:
    (torch,) = require("torch")
    params = _params()
    opt = AdamW(params, decay=DECAY, **HYPER)
    tp = {n: torch.nn.Parameter(torch.from_numpy(a.copy())) for n, a in params.items()}
    topt = torch.optim.AdamW(
        [{"params": [tp[n] for n in SHAPES if n in DECAY], "weight_decay": HYPER["weight_decay"]},
         {"params": [tp[n] for n in SHAPES if n not in DECAY], "weight_decay": 0.0}],
        lr=HYPER["lr"], betas=HYPER["betas"], eps=HYPER["eps"], foreach=False)
    for step in range(20):
        grads = _grads(step)
        opt.step(grads)
        for n, t in tp.items():
            t.grad = torch.from_numpy(grads[n])
        topt.step()
    for n in SHAPES:
        np.testing.assert_allclose(params[n], tp[n].detach().numpy(), rtol=1e-6, atol=1e-7, err_msg=n)
        # Moments: within 1e-6 of the tensor's largest moment (values that cancel to ~0 differ by an ulp of
        # their inputs, since torch's lerp fuses a multiply-add).
        for mine, theirs in ((opt.exp_avg[n], topt.state[tp[n]]["exp_avg"]),
                             (opt.exp_avg_sq[n], topt.state[tp[n]]["exp_avg_sq"])):
            theirs = theirs.numpy()
            np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-6 * np.abs(theirs).max(), err_msg=n)
    assert opt.step_count == 20


def test_adamw_matches_float64_reference_with_grad_scale() -> None:
    params = _params(1)
    start = {n: a.copy() for n, a in params.items()}
    opt = AdamW(params, decay=DECAY, **HYPER)
    grads_per_step = [_grads(s) for s in range(20)]
    scales = [1.0 / 256 if s % 2 else 0.5 for s in range(20)]
    for grads, scale in zip(grads_per_step, scales, strict=True):
        opt.step(grads, grad_scale=scale)
    ref_p, ref_m, ref_v = _adamw_float64(start, grads_per_step, decay=DECAY, grad_scales=scales, **HYPER)
    for n in SHAPES:
        # fp32 arithmetic against float64: a few ulps of the parameter value over 20 steps.
        np.testing.assert_allclose(params[n], ref_p[n], rtol=2e-6, atol=1e-7, err_msg=n)
        for mine, ref in ((opt.exp_avg[n], ref_m[n]), (opt.exp_avg_sq[n], ref_v[n])):
            np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max(), err_msg=n)
        assert not np.array_equal(params[n], start[n])


def test_weight_decay_only_on_named_tensors() -> None:
    params = _params(2)
    start = {n: a.copy() for n, a in params.items()}
    opt = AdamW(params, lr=0.1, weight_decay=0.5)  # default decay set: the matrices
    assert opt.decay == {"embed", "wq", "w1"}
    opt.step({n: np.zeros(s, np.float32) for n, s in SHAPES.items()})  # zero grads: only decay moves weights
    for n in SHAPES:
        expected = start[n] * (1 - 0.1 * 0.5) if n in opt.decay else start[n]
        np.testing.assert_allclose(params[n], expected, rtol=1e-7, err_msg=n)


def test_gradient_norm_and_clipping_match_torch() -> None:
    (torch,) = require("torch")
    grads = _grads(3)
    ref = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads.values())))
    stats = grad_norm(grads)
    assert stats.nonfinite == 0 and stats.finite
    assert stats.norm == pytest.approx(ref, rel=1e-12)
    tg = [torch.from_numpy(g.copy()) for g in grads.values()]
    tparams = [torch.nn.Parameter(torch.zeros_like(g)) for g in tg]
    for p, g in zip(tparams, tg, strict=True):
        p.grad = g
    torch_norm = float(torch.nn.utils.clip_grad_norm_(tparams, max_norm=1.0))
    assert stats.norm == pytest.approx(torch_norm, rel=1e-6)
    coefficient = clip_coefficient(stats.norm, 1.0)
    for g, p in zip(grads.values(), tparams, strict=True):
        np.testing.assert_allclose(g * np.float32(coefficient), p.grad.numpy(), rtol=1e-6)
    assert clip_coefficient(0.5, 1.0) == 1.0


def test_clipping_fused_into_the_step_equals_clipping_first() -> None:
    grads = _grads(4)
    stats = grad_norm(grads)
    coefficient = clip_coefficient(stats.norm, 0.25)
    assert coefficient < 1
    fused, separate = _params(5), _params(5)
    AdamW(fused, **HYPER).step(grads, grad_scale=coefficient)
    AdamW(separate, **HYPER).step({n: g * np.float32(coefficient) for n, g in grads.items()})
    for n in SHAPES:
        np.testing.assert_allclose(fused[n], separate[n], rtol=1e-6, atol=1e-8, err_msg=n)


def test_vector_and_scalar_paths_give_the_same_bits() -> None:
    rng = np.random.default_rng(11)
    values = rng.standard_normal(64).astype(np.float32)
    grads = rng.standard_normal(64).astype(np.float32)
    whole = {"w": values.copy()}  # 64 elements: the four-lane loop
    singles = {f"s{i}": values[i:i + 1].copy() for i in range(64)}  # one element each: the scalar tail
    a, b = AdamW(whole, weight_decay=0.1, decay={"w"}), AdamW(singles, weight_decay=0.1, decay=set(singles))
    for _ in range(3):
        a.step({"w": grads}, grad_scale=0.3)
        b.step({f"s{i}": grads[i:i + 1] for i in range(64)}, grad_scale=0.3)
    np.testing.assert_array_equal(whole["w"], np.concatenate([singles[f"s{i}"] for i in range(64)]))


def test_nonfinite_values_are_counted_never_rewritten() -> None:
    grads = _grads(6)
    grads["w1"][3, 5] = np.nan
    grads["w1"][299, 699] = np.inf
    grads["norm"][0] = -np.inf
    before = {n: g.copy() for n, g in grads.items()}
    stats = grad_norm(grads)
    assert stats.nonfinite == 3 and not stats.finite
    finite = [np.where(np.isfinite(g), g, 0).astype(np.float64) for g in before.values()]
    assert stats.norm == pytest.approx(float(np.sqrt(sum(np.sum(g**2) for g in finite))), rel=1e-12)
    for n in SHAPES:
        np.testing.assert_array_equal(grads[n], before[n])  # NaN compares equal in assert_array_equal


def test_grad_norm_is_the_same_with_one_thread(tmp_path) -> None:
    script = ("import numpy as np\nfrom orion.train.optim import grad_norm\n"
              "rng = np.random.default_rng(7)\n"
              "g = {str(i): rng.standard_normal(n).astype(np.float32) for i, n in enumerate([5, 1 << 18, 70001])}\n"
              "print(repr(grad_norm(g).norm))\n")
    runs = {threads: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                    env={**os.environ, "ORION_NUM_THREADS": threads}).stdout for threads in ("1", "2")}
    assert runs["1"] == runs["2"] and runs["1"].strip()


def test_grad_norm_is_the_same_on_every_simd_flavour() -> None:
    """The AVX2 sum of squares is the portable loop's bit for bit (same four interleaved double sums, no FMA),
    non-finite values skipped and counted alike; odd sizes leave scalar tails."""
    script = ("import numpy as np\nfrom orion.train.optim import grad_norm\n"
              "rng = np.random.default_rng(9)\n"
              "g = {str(i): (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)\n"
              "     for i, n in enumerate([3, 1 << 17, 70001, 9])}\n"
              "g['1'][[5, 77, 1000]] = [np.nan, np.inf, -np.inf]\n"
              "s = grad_norm(g)\nprint(repr(s.norm), s.nonfinite)\n")
    runs = {simd: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                 env={**os.environ, "ORION_SIMD": simd}).stdout for simd in ("portable", "avx2", "")}
    assert runs["portable"] == runs["avx2"] == runs[""], runs
    assert runs[""].split()[1] == "3"


def test_state_dict_round_trip_continues_identically() -> None:
    a_params, b_params = _params(8), _params(8)
    a = AdamW(a_params, decay=DECAY, **HYPER)
    for s in range(3):
        a.step(_grads(s))
    state = {k: ({n: x.copy() for n, x in v.items()} if isinstance(v, dict) and k.startswith("exp") else v)
             for k, v in a.state_dict().items()}
    for n in SHAPES:
        b_params[n][...] = a_params[n]
    b = AdamW(b_params, lr=1.0, weight_decay=0.0)  # other hyperparameters: the state restores them
    b.load_state_dict(state)
    assert b.step_count == 3 and b.decay == DECAY and b.lr == HYPER["lr"]
    for s in range(3, 6):
        a.step(_grads(s))
        b.step(_grads(s))
    for n in SHAPES:
        np.testing.assert_array_equal(a_params[n], b_params[n])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda g: g.__setitem__("wq", g["wq"].astype(np.float64)), "gradient of 'wq' has dtype float64"),
        (lambda g: g.__setitem__("wq", g["wq"][:, :39]), "gradient of 'wq' is not C-contiguous"),
        (lambda g: g.__setitem__("wq", np.zeros((40, 39), np.float32)), "gradient of 'wq' has shape (40, 39)"),
        (lambda g: g.__setitem__("wq", [[0.0]]), "gradient of 'wq' is a list, not a numpy array"),
        (lambda g: g.pop("norm"), "gradients missing for ['norm']"),
    ],
)
def test_bad_gradients_raise_naming_the_tensor(mutate, message) -> None:
    params = _params(9)
    before = {n: a.copy() for n, a in params.items()}
    opt = AdamW(params, **HYPER)
    grads = _grads(0)
    mutate(grads)
    with pytest.raises(TrainError) as err:
        opt.step(grads)
    assert message in str(err.value)
    assert opt.step_count == 0
    for n in SHAPES:
        np.testing.assert_array_equal(params[n], before[n])  # checked before anything is touched


def test_bad_parameters_and_hyperparameters_raise() -> None:
    with pytest.raises(TrainError, match="'wq' is float64"):
        AdamW({"wq": np.zeros((2, 2))})
    with pytest.raises(TrainError, match=r"decay names \['nope'\]"):
        AdamW(_params(), decay={"nope"})
    params = _params()
    params["wq"].flags.writeable = False
    with pytest.raises(TrainError, match="parameter of 'wq' is read-only"):
        AdamW(params).step(_grads(0))
    with pytest.raises(TrainError, match="beta2=1.0"):
        AdamW(_params(), betas=(0.9, 1.0)).step(_grads(0))
    with pytest.raises(TrainError, match="lr=nan"):
        AdamW(_params()).step(_grads(0), lr=float("nan"))
    with pytest.raises(TrainError, match="lr and grad_scale must be numbers"):
        AdamW(_params()).step(_grads(0), lr="fast")
    with pytest.raises(TrainError, match="not an AdamW state dict"):
        AdamW(_params()).load_state_dict({"step": 1})
    other = AdamW({"x": np.zeros(3, np.float32)}).state_dict()
    with pytest.raises(TrainError, match="exp_avg has tensors"):
        AdamW(_params()).load_state_dict(other)


def test_fp16_copies_written_in_the_step_are_the_clamped_updated_weights() -> None:
    """``halves``: the fp16 copy of each named parameter equals numpy's fp16 rounding of its updated value with the
    finite values clamped to +-FP16_MAX (NaN and Inf kept), and the step returns how many were clamped."""
    from orion.limits import FP16_MAX

    params = _params()
    params["w1"][0, :5] = [7e4, -1e5, np.inf, np.nan, 65504.0]  # beyond fp16 either way, non-finite, the limit
    plain, fused = AdamW({n: p.copy() for n, p in params.items()}, **HYPER), AdamW(params, **HYPER)
    halves = {n: np.full(params[n].shape, 7.0, np.float16) for n in ("w1", "norm")}
    assert plain.step(_grads(1)) == 0
    with np.errstate(invalid="ignore"):
        clamped = fused.step(_grads(1), halves=halves)
    for name, half in halves.items():
        updated = fused.params[name]
        np.testing.assert_array_equal(updated, plain.params[name])  # the master weights as without copies
        finite = np.isfinite(updated)
        expected = np.where(finite, np.clip(updated, -FP16_MAX, FP16_MAX), updated).astype(np.float16)
        np.testing.assert_array_equal(half.view(np.uint16), expected.view(np.uint16))
    w1 = fused.params["w1"]
    assert clamped == int((np.isfinite(w1) & (np.abs(w1) > FP16_MAX)).sum()) == 2


def test_fp16_copies_of_the_wrong_kind_or_name_are_refused() -> None:
    opt = AdamW(_params(), **HYPER)
    with pytest.raises(TrainError, match="fp16 copy of 'w1'.*float16"):
        opt.step(_grads(1), halves={"w1": np.zeros(SHAPES["w1"], np.float32)})
    with pytest.raises(TrainError, match="not parameters"):
        opt.step(_grads(1), halves={"nope": np.zeros(3, np.float16)})
