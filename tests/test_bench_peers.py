"""benchmarks/bench_peers.py keeps going when a child fails: the failure is reported with its log, and the
other engines' figures and ratios are still there. The children are faked (no model is run) except for one
real child process that fails."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from support.benchmarks import benchmark_module


@pytest.fixture(scope="module")
def bench():
    yield from benchmark_module("bench_peers.py")


def test_a_failing_child_names_its_error_and_log(bench, tmp_path):
    """A real child process that raises: ChildFailed carries its exit status, last line and log path."""
    with pytest.raises(bench.ChildFailed) as caught:
        bench.spawn("prepare", {}, tmp_path, 1, "broken-prepare")  # no "workdir" in the spec: KeyError
    record = caught.value.record
    assert record["child"] == "broken-prepare" and record["exit_status"] != 0
    assert "KeyError" in record["error"] and Path(record["log"]).exists()
    assert "KeyError" in Path(record["log"]).read_text()


def fake_child(bench, broken: set[str], role: str, spec: dict[str, Any], workdir: Path, threads: int, tag: str,
               cold: bool = False) -> dict[str, Any]:
    """What each child role returns, with made-up figures; a tag naming a broken engine fails as a child does."""
    if any(name in tag for name in broken):
        log = workdir / f"{tag}.log"
        log.write_text("Traceback (most recent call last):\nRuntimeError: engine exploded\n")
        raise bench.ChildFailed(tag, 1, log)
    if role == "prepare":
        return {"model": spec["model"], "family": "llama", "hf_dir": "", "orion_source": "", "real": False,
                "peer_types": {}, "gguf": {"f16": ""}, "vocab_size": 512,
                "context": 256, "n_layer": 2, "hidden": 64, "kv_dim": 32, "params": 100_000,
                "matrix_params": 80_000, "head_params": 10_000, "small_params": 256}
    if role == "probe":
        return {"threads": threads, "array_mib": 1, "dram_gbs": 10.0, "dram_1thread_gbs": 8.0,
                "in_cache_1thread_gbs": 50.0, "method": "fake"}
    if role == "warm_up":
        return {"warm_up_mib": spec["warm_up_mib"], "seconds": 2.0, "gbs": spec["warm_up_mib"] / 2048}
    speed = 20.0 if spec["engine"] == "orion" else 10.0
    if role == "workload":
        prefill = {str(n): {"first_s": 0.1, "warm_s": [0.05]} for n in spec["prefill_lengths"]}
        return {"load_s": 1.0, "versions": {}, "prefill": prefill, "peak_rss_mib": 100.0,
                "decode": {"tokens": [1, 2, 3], "step_s": [1 / speed] * 2, "tok_s": speed, "p50_ms": 1e3 / speed}}
    return {"to_main_s": 0.1, "to_loaded_s": 0.5, "to_first_token_s": 1.0, "peak_rss_mib": 90.0}


def run_with(bench, monkeypatch, tmp_path, broken: set[str], passes: int = 2, profile: bool = False,
             spawn: Any = None) -> tuple[int, dict[str, Any]]:
    monkeypatch.setattr(bench, "spawn", spawn or (lambda *a, **k: fake_child(bench, broken, *a, **k)))
    monkeypatch.setattr(bench, "available_engines", lambda wanted: (wanted, []))
    out = tmp_path / "out.json"
    args = argparse.Namespace(threads=1, models=["tiny-llama", "tiny-gpt2"], seed=0, flash_attn=True, check=False,
                              profile=profile, json=str(out))
    status = bench.run(args, bench.QUICK, passes, ["orion", "llama.cpp-f16", "transformers"], tmp_path)
    return status, json.loads(out.read_text())


def test_a_crashing_engine_is_reported_and_the_run_goes_on(bench, monkeypatch, tmp_path, capsys):
    status, out = run_with(bench, monkeypatch, tmp_path, broken={"transformers-workload", "-profile"},
                           profile=True)
    printed = capsys.readouterr().out
    assert status == 1  # a child failed
    for model in ("tiny-llama", "tiny-gpt2"):
        result = out["models"][model]
        assert result["ran"] == ["orion", "llama.cpp-f16"]
        assert [f["engine"] for f in result["failed"]] == ["transformers", "transformers"]
        assert result["ratios"]["orion"]["llama.cpp-f16"]["decode_tok_s"]["per_pass"] == [2.0, 2.0]
        assert "transformers" not in result["ratios"]["orion"]
        assert result["orion_profile"] is None
    assert len(out["failures"]) == 2 * 2 + 2  # two passes of two models, and their profiles
    assert "tiny-llama-p0-transformers-workload FAILED (exit status 1): RuntimeError: engine exploded" in printed
    assert str(tmp_path / "tiny-gpt2-profile.log") in printed


def test_a_model_that_cannot_be_prepared_is_skipped(bench, monkeypatch, tmp_path, capsys):
    status, out = run_with(bench, monkeypatch, tmp_path, broken={"tiny-llama-prepare"}, passes=1)
    assert status == 1
    assert out["models"]["tiny-llama"]["failed"]["child"] == "tiny-llama-prepare"
    assert out["models"]["tiny-gpt2"]["ran"] == ["orion", "llama.cpp-f16", "transformers"]
    assert "tiny-llama: skipped: tiny-llama-prepare FAILED" in capsys.readouterr().out


def test_a_clean_run_exits_0(bench, monkeypatch, tmp_path):
    status, out = run_with(bench, monkeypatch, tmp_path, broken=set(), passes=1)
    assert status == 0 and out["failures"] == []


def test_every_start_runs_right_after_a_memory_warm_up(bench, monkeypatch, tmp_path, capsys):
    """Each start process (warm or cold, every engine) follows a child touching WARM_UP_WEIGHTS x the model's fp16
    weight bytes (at least 1 GiB), so that no start finds memory another child left it; the report gives their rates."""
    spawned: list[tuple[str, str, dict[str, Any]]] = []

    def recording(*args: Any, **kwargs: Any) -> dict[str, Any]:
        spawned.append((args[0], args[4], args[1]))
        return fake_child(bench, set(), *args, **kwargs)

    status, _ = run_with(bench, monkeypatch, tmp_path, broken=set(), passes=1, spawn=recording)
    assert status == 0
    starts = [i for i, (role, _, _) in enumerate(spawned) if role == "start"]
    assert len(starts) == 2 * 4  # two models: orion's warm and cold starts, llama.cpp's and transformers' starts
    for i in starts:
        role, tag, spec = spawned[i - 1]
        assert role == "warm_up" and tag == f"{spawned[i][1]}-warm-up"
        assert spec["warm_up_mib"] == 1024  # the fake model's 100,000 parameters: the 1 GiB floor
    assert sum(role == "warm_up" for role, _, _ in spawned) == len(starts)
    assert "each start process ran right after a child touching 1024 MiB of new memory" in capsys.readouterr().out


def test_each_childs_kernel_memory_events_are_counted_and_reported(bench, monkeypatch, tmp_path, capsys):
    """Compaction stalls and refused huge pages during each child (/proc/vmstat) are summed per engine in the report,
    so a run slowed by them says so; a machine without /proc/vmstat reports none."""
    counts = iter(range(0, 1000, 3))  # each read 3 more of every event: a child sees 3 of each
    monkeypatch.setattr(bench, "kernel_memory_events", lambda: dict.fromkeys(bench.KERNEL_EVENTS, next(counts)))
    probed = bench.spawn("probe", {"threads": 1, "probe_mib": 8}, tmp_path, 1, "probe")  # a real child, fast
    assert probed["kernel_events"] == dict.fromkeys(bench.KERNEL_EVENTS, 3)  # read before and after it
    monkeypatch.undo()
    result = {"passes": [{"load_before": [0.0] * 3,
                          "orion": {"workload": {"kernel_events": {"compact_stall": 2, "thp_fault_fallback": 5}},
                                    "start": {"kernel_events": {"compact_stall": 1, "thp_fault_fallback": 0}}},
                          "llama.cpp-f16": {"failed": {}}}]}
    line = bench.kernel_events_line(result)
    assert "orion 3 compaction stalls, 5 huge pages refused" in line and "llama.cpp" not in line
    assert bench.kernel_events_line({"passes": [{"orion": {"workload": {}}}]}) is None
    events = bench.kernel_memory_events()
    assert events == {} or set(events) == set(bench.KERNEL_EVENTS)
