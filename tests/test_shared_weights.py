"""The emulator holds one packed copy of each distinct 1x1 conv weight, shared by every program
that bakes it (a model's prefill buckets and decode programs), and frees it with the last one."""

from __future__ import annotations

import gc
import hashlib

import numpy as np
import pytest

import orion
from orion._core import kernels
from support.weighted import ACT, TEXT, reference, weights

pytestmark = pytest.mark.skipif(orion.backend() != "emulator", reason="the emulator's packed weights")


def test_programs_with_one_weight_share_one_packed_copy_and_compute_the_same() -> None:
    gc.collect()
    count0, bytes0 = kernels.shared_conv_weights()
    w1, wa, ba = weights(11)
    w2, wb, bb = weights(12)
    x = np.random.default_rng(3).standard_normal(ACT).astype(np.float16)
    first, second = orion.compile(TEXT, w1), orion.compile(TEXT, w1)
    count1, bytes1 = kernels.shared_conv_weights()
    assert count1 == count0 + 1 and bytes1 - bytes0 == wa.size * 2  # one copy, fp16
    other = orion.compile(TEXT, w2)
    assert kernels.shared_conv_weights()[0] == count0 + 2  # a different weight: its own copy
    y1, y2, y3 = first(x=x)["y"], second(x=x)["y"], other(x=x)["y"]
    assert np.array_equal(y1, y2)
    np.testing.assert_allclose(y1, reference(x, wa, ba), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(y3, reference(x, wb, bb), rtol=2e-2, atol=2e-2)
    first.unload()
    assert kernels.shared_conv_weights()[0] == count0 + 2  # `second` still holds it
    second.unload()
    other.unload()
    gc.collect()
    assert kernels.shared_conv_weights() == (count0, bytes0)



def _key(files: dict[str, bytes]) -> dict[str, str]:
    return {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}


def test_weights_compiled_with_keys_are_shared_by_key_and_compute_their_own_values() -> None:
    gc.collect()
    count0, bytes0 = kernels.shared_conv_weights()
    w1, wa, ba = weights(21)
    w2, wb, bb = weights(22)
    x = np.random.default_rng(4).standard_normal(ACT).astype(np.float16)
    first = orion.compile(TEXT, w1, weight_keys=_key(w1))
    second = orion.compile(TEXT, {p: bytes(d) for p, d in w1.items()}, weight_keys=_key(w1))  # other buffers
    assert kernels.shared_conv_weights() == (count0 + 1, bytes0 + wa.size * 2)
    other = orion.compile(TEXT, w2, weight_keys=_key(w2))
    assert kernels.shared_conv_weights()[0] == count0 + 2
    y1, y2, y3 = first(x=x)["y"], second(x=x)["y"], other(x=x)["y"]
    assert np.array_equal(y1, y2)
    np.testing.assert_allclose(y1, reference(x, wa, ba), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(y3, reference(x, wb, bb), rtol=2e-2, atol=2e-2)
    for p in (first, second, other):
        p.unload()
    gc.collect()
    assert kernels.shared_conv_weights() == (count0, bytes0)


def test_a_key_that_names_other_bytes_is_refused() -> None:
    w1, _, _ = weights(31)
    w2, _, _ = weights(32)
    held = orion.compile(TEXT, w1, weight_keys=_key(w1))
    with pytest.raises(ValueError, match="names bytes that differ"):
        orion.compile(TEXT, w2, weight_keys=_key(w1))  # w2's bytes under w1's key
    held.unload()


def test_weight_keys_must_name_weight_files() -> None:
    w1, _, _ = weights(41)
    with pytest.raises(orion.CompileError, match="no weight file"):
        orion.compile(TEXT, w1, weight_keys={"@model_path/weights/other.bin": "0" * 64})
    with pytest.raises(orion.CompileError, match="is empty"):
        orion.compile(TEXT, w1, weight_keys={path: "" for path in w1})


def test_new_weights_of_a_keyed_program_are_not_taken_for_the_old_ones() -> None:
    """with_weights reloads without the keys the program was compiled with (they named the old bytes)."""
    w1, _, _ = weights(51)
    w2, wb, bb = weights(52)
    x = np.random.default_rng(5).standard_normal(ACT).astype(np.float16)
    first = orion.compile(TEXT, w1, weight_keys=_key(w1))
    np.testing.assert_allclose(first.with_weights(w2)(x=x)["y"], reference(x, wb, bb), rtol=2e-2, atol=2e-2)
    first.unload()
