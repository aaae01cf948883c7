"""``python -m orion.bench train`` (its main, in this process): runs on a tiny model in seconds and prints every
figure the issue asks for; the M4 cost model is the stated formula over the plan's FLOPs and dispatches (checked
by hand-written arithmetic); without torch it says so and reports Orion alone."""

from __future__ import annotations

import pytest

from orion.bench import train as bench
from orion.bench.__main__ import main as bench_main


def test_cli_runs_a_tiny_model_side_by_side_with_pytorch(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    assert bench_main(["train", "--model", "tiny-gpt2", "--seq", "32", "--steps", "2", "--prefer", "ane"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0]: line for line in out.splitlines()}
    assert "ms/step" in lines["orion"] and "tokens/s" in lines["orion"]
    assert "4 ANE dispatches/step, 0.00 compiles/step" in lines["orion"]  # 2 layers x (forward, gradient)
    assert "FLOPs ANE" in lines["orion"] and "2 threads" in lines["pytorch"]
    assert "x PyTorch's time per step" in lines["ratio"]
    orion_loss, torch_loss = (float(lines[k].rsplit("first loss ", 1)[1]) for k in ("orion", "pytorch"))
    assert orion_loss == pytest.approx(torch_loss, rel=1e-3)  # same weights, same batch
    assert "M4 cost model" in out and "1,345 ms per 4 x 256-token step" in out and "load average" in out


def test_m4_cost_model_and_orion_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "torch_available", lambda: "No module named 'torch'")
    result = bench.run("tiny-llama", seq=256, steps=1, prefer="ane")
    text = bench.report(result)
    assert "pytorch: not run (No module named 'torch'); Orion alone" in text and "ratio" not in text
    assert result["compiles_per_step"] == 0 and result["dispatches_per_step"] == 4
    cost = bench.M4CostModel()
    ane_s = result["ane_gflop"] * 1e9 / (19e12 * 0.25)
    want = ane_s * 1e3 + 4 * 0.095 + result["cpu_gflop"] * 1e9 / 1e12 * 1e3 + result["params"] * 28 / 120e9 * 1e3
    assert result["m4"]["total"] == pytest.approx(want, rel=1e-9)
    (_, _, n, _, orion_paper), (_, _, _, _, maderix) = result["m4_published"]
    assert n == 4 and maderix == pytest.approx(want, rel=1e-9)
    assert orion_paper == pytest.approx(want + 3 * (want - result["params"] * 28 / 120e9 * 1e3), rel=1e-9)
    assert f"{cost.describe()}" in text and "1,345 ms per 4 x 256-token step" in text
    assert "the published run is Stories110M; this is tiny-llama" in text


def test_profile_splits_the_step_into_parts_that_add_up() -> None:
    """``--profile``: the step's disjoint parts (each found by cProfile, none left empty by a renamed function)
    and the rest add up to the step; the emulator's per-program profile names both layer programs."""
    result = bench.run("tiny-llama", seq=32, steps=1, prefer="ane", torch=False, profile=True)
    parts = dict(result["profile"]["parts"])
    named = [label for label, _ in bench.STEP_PARTS]
    assert all(parts[label] > 0 for label in named if label != "weights' fp16 range check")  # fp16 copies: ~0
    assert sum(parts[label] for label in named) + parts["the rest (Python, numpy)"] == pytest.approx(parts["step"])
    assert parts["layer gradient programs"] + parts["layer forward programs"] >= parts["  of the programs: emulator evaluate"]
    assert result["profile"]["emulator"].count("\nprogram ") == 2
    assert "where Orion's step goes" in bench.report(result)


def test_a_skipped_first_step_is_reported_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss scaler may skip a step (non-finite gradients): its loss is None, and the report says so."""
    monkeypatch.setattr(bench, "torch_available", lambda: "No module named 'torch'")
    result = bench.run("tiny-llama", seq=32, steps=1, prefer="ane")
    result["first_loss"] = None
    assert "first loss none (step skipped: non-finite gradients)" in bench.report(result)
