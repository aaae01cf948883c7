"""Resident pages of file maps: dropping them once their bytes have been copied elsewhere.

Weight files read through ``mmap`` (the program cache's blobs, a safetensors checkpoint) count in
the process's RSS for every page touched. Once a compiled program holds its own copy of the weights
(the emulator packs them), the mapped pages are only needed again if someone reads the bytes again;
``MADV_DONTNEED`` drops them from this process (the kernel's page cache keeps them, so a later read
faults them back in cheaply, with the same contents).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable


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
    """Drops the resident pages of every distinct file map behind ``buffers`` (others are skipped);
    returns how many maps were advised. The bytes stay readable."""
    maps = {id(m): m for m in map(map_of, buffers) if m is not None and not m.closed}
    for m in maps.values():
        m.madvise(mmap.MADV_DONTNEED)
    return len(maps)
