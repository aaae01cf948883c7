"""The fuzz targets in CI: every saved finding replays cleanly, and a short seeded run of each target
finds nothing. Both run in subprocesses, so a crash is counted instead of killing the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TARGETS = ["mil", "grammar", "blobfile", "weights", "model_dir", "server", "resume"]
# server and resume run Orion end to end (an HTTP request and a generation; a resumed training step):
# a few hundred inputs each, the campaign of issue 26 ran 100,000 and 10,000 (tests/fuzz/README.md).
RUNS = {"mil": 3000, "grammar": 3000, "blobfile": 2000, "weights": 2000, "model_dir": 300, "server": 150,
        "resume": 50}


def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, ORION_COMPILE_BUDGET="1000000000", ORION_CACHE_DIR="off")
    return subprocess.run([sys.executable, str(HERE / "run.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("target", TARGETS)
def test_saved_findings_replay_cleanly(target, tmp_path):
    findings = sorted((HERE / "regressions" / target).glob("*")) if (HERE / "regressions" / target).is_dir() else []
    if not findings:
        pytest.skip(f"no saved findings for {target}")
    result = _run([target, *map(str, findings)], tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.parametrize("target", TARGETS)
def test_short_seeded_fuzz_run_finds_nothing(target, tmp_path):
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    seeds = HERE / "corpus" / target
    shutil.copytree(seeds, corpus) if seeds.is_dir() else corpus.mkdir()
    result = _run([target, f"-runs={RUNS[target]}", "-seed=1", "-timeout=20", "-rss_limit_mb=4096",
                   f"-artifact_prefix={tmp_path}/", str(corpus)], tmp_path, timeout=600)
    artifacts = sorted(p.name for p in tmp_path.glob("*-*") if p.is_file())
    assert result.returncode == 0 and not artifacts, f"{artifacts}\n{result.stderr[-4000:]}"
