"""Pages of weight-sized memory: dropping the resident pages of file maps once their bytes have been
copied elsewhere, and new weight-sized arrays on huge pages.

Weight files read through ``mmap`` (the program cache's blobs, a safetensors checkpoint) count in
the process's RSS for every page touched. Once a compiled program holds its own copy of the weights
(the emulator packs them), the mapped pages are only needed again if someone reads the bytes again;
``MADV_DONTNEED`` drops them from this process (the kernel's page cache keeps them, so a later read
faults them back in cheaply, with the same contents).

An array built once from a checkpoint (a fused projection's stacked weights) is written page by page;
on 4 KiB pages its first writes fault ~250,000 times a gigabyte, on transparent huge pages 512 times
fewer (Qwen2.5-0.5B's 24 stacked gate/up weights, 418 MiB: about 1.05 s to 0.09 s).
"""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Iterable

import numpy as np

HUGE_PAGE_BYTES = 2 << 20  # smaller arrays gain nothing from a huge page
# The anonymous maps behind huge_page_array's arrays: MADV_DONTNEED would zero them, so release_pages skips them.
_ANONYMOUS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


def map_of(data: object) -> mmap.mmap | None:
    """The read-only ``mmap`` behind ``data`` (a memoryview or numpy array of one), else None."""
    seen = 0
    while data is not None and seen < 16:
        if isinstance(data, mmap.mmap):
            return data
        data = getattr(data, "obj", None) if isinstance(data, memoryview) else getattr(data, "base", None)
        seen += 1
    return None


def release_pages(buffers: Iterable[object]) -> int:
    """Drops the resident pages of every distinct file map behind ``buffers`` (other buffers are skipped, and so
    are :func:`huge_page_array`'s anonymous maps, which it would zero); returns how many maps were advised. The
    bytes stay readable."""
    maps = {id(m): m for m in map(map_of, buffers) if m is not None and not m.closed and m not in _ANONYMOUS}
    for m in maps.values():
        m.madvise(mmap.MADV_DONTNEED)
    return len(maps)


def huge_page_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized array for values written once and kept (weights): on an anonymous map advised to use
    transparent huge pages where the OS has them (Linux), else ``np.empty``. The array holds its map."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or size < HUGE_PAGE_BYTES:
        return np.empty(shape, dtype)
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # shared memory would get no THP
    _ANONYMOUS.add(memory)
    try:
        memory.madvise(advice)
    except OSError:  # huge pages turned off: still an array, on small pages
        pass
    return np.ndarray(shape, dtype, buffer=memory)  # the map its base: a view of it keeps this array as its base
