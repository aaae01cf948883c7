"""orion.origins: a lookup while the cyclic garbage collector frees recorded arrays.

A model load (int8, then lut6, in one process) raised "dictionary changed size during iteration" from
origin_of: listing the records allocates, an allocation can run the collector, and an array it frees drops its
record from the dict being listed."""

from __future__ import annotations

import gc

import numpy as np

from orion import origins


def test_origin_of_holds_while_the_collector_frees_recorded_arrays() -> None:
    kept = np.zeros(100, np.float32)
    origins.record(kept, "kept")
    threshold = gc.get_threshold()
    gc.collect()
    gc.set_threshold(1)  # a collection at every allocation of a tracked object
    try:
        for _ in range(50):
            for i in range(40):  # arrays only a reference cycle keeps alive: freed by the collector, mid-lookup
                cycle: list = [np.zeros(16, np.float32)]
                cycle.append(cycle)
                origins.record(cycle[0], f"cycle {i}")
                del cycle
            assert origins.origin_of(kept) == "kept"
    finally:
        gc.set_threshold(*threshold)
    gc.collect()
    assert origins.origin_of(np.zeros(4, np.float32)) is None
