"""Process-wide counts (the emulator's shared packed weights) measured without the garbage collector freeing
other tests' programs in between."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_collection() -> Iterator[None]:
    """Collects now, then keeps the collector off inside the block: programs earlier tests left in reference
    cycles are freed before a count is taken, not while it is being compared."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
