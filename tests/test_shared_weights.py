"""The emulator holds one packed copy of each distinct 1x1 conv weight, shared by every program
that bakes it (a model's prefill buckets and decode programs), and frees it with the last one."""

from __future__ import annotations

import gc

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

