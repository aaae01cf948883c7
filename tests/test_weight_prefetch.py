"""The emulator's weight prefetch (csrc/emulator/weight_prefetch.h): after a memory-bound 1x1 conv (at most
8 live lanes, as in decode) an idle pool thread reads the weights that followed it last time into the caches.
It is a hint: results are the same with or without it, and it must neither read a freed weight (the request
holds the weights it reads; the sanitizer job runs this file) nor keep an unloaded program's weight alive."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import orion
from orion._core import kernels
from support.weighted import ACT, TEXT, reference, weights

pytestmark = pytest.mark.skipif(orion.backend() != "emulator", reason="the emulator's packed weights")


def live(program: orion.Program, x: np.ndarray, lanes: int) -> np.ndarray:
    """Evaluates with only the first `lanes` lanes of x live: the decode cases the prefetch follows."""
    inputs, outputs = program.allocate_surfaces()
    inputs["x"].write(x)
    program.evaluate(inputs, outputs, live_lanes={"x": lanes})
    return outputs["y"].read()[..., :lanes]


@pytest.mark.parametrize("lanes", [1, 8])
def test_prefetch_follows_the_learned_order_and_lets_unloaded_weights_go(lanes: int) -> None:
    gc.collect()
    count0, _ = kernels.shared_conv_weights()
    made = [weights(seed) for seed in (21, 22, 23)]
    programs = [orion.compile(TEXT, files) for files, _, _ in made]
    x = np.random.default_rng(5).standard_normal(ACT).astype(np.float16)
    expected = [reference(x, w, b)[..., :lanes] for _, w, b in made]
    for _ in range(8):  # the order 0 -> 1 -> 2 -> 0 is learned and prefetched each time round
        for program, want in zip(programs, expected):
            np.testing.assert_allclose(live(program, x, lanes), want, rtol=2e-2, atol=2e-2)
    first = live(programs[0], x, lanes)
    programs[1].unload()  # its weight is queued for prefetch after program 0's conv
    del programs[1]
    gc.collect()
    for _ in range(8):  # now 0 -> 2 -> 0: the stale link to the unloaded weight is replaced
        assert np.array_equal(live(programs[0], x, lanes), first)
        np.testing.assert_allclose(live(programs[1], x, lanes), expected[2], rtol=2e-2, atol=2e-2)
    deadline = time.monotonic() + 5.0  # a request being read is dropped by the worker asynchronously
    while kernels.shared_conv_weights()[0] != count0 + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kernels.shared_conv_weights()[0] == count0 + 2
    for program in programs:
        program.unload()
