"""BLOBFILE weight files: byte layout of docs/hardware.md §5, round trips and offset errors."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orion
from orion import blobfile
from orion._core import mil


def expected_file(payloads: list[bytes]) -> bytes:
    """The layout of docs/hardware.md §5, written independently of the implementation."""
    out = bytearray(struct.pack("<B3xB59x", 0x01, 0x02))
    for p in payloads:
        chunk = len(out)
        out += struct.pack("<IB3xI4xI44x", 0xDEADBEEF, 0x01, len(p), chunk + 64)
        out += p
    return bytes(out)


def test_single_tensor_layout_matches_facts() -> None:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    data = blobfile.write(w)
    payload = w.astype(np.float16).tobytes()
    assert data == expected_file([payload])
    assert data[64:68] == b"\xef\xbe\xad\xde" and data[80] == 128 and len(data) == 128 + 12
    assert mil.blobfile_read_chunk(data, 64) == (128, 12)


def test_multi_chunk_layout_and_offsets() -> None:
    payloads = [b"\x01\x02", b"", b"abcdefg"]
    data = mil.blobfile_write(payloads)
    assert data == expected_file(payloads)
    assert mil.blobfile_chunk_offsets([2, 0, 7]) == [64, 130, 194]
    assert [mil.blobfile_read_chunk(data, o) for o in (64, 130, 194)] == [(128, 2), (194, 0), (258, 7)]
    assert mil.blobfile_write([]) == expected_file([])


def test_accepts_any_buffer() -> None:
    data = mil.blobfile_write([bytearray(b"xy"), memoryview(b"zw"), np.zeros(2, np.int8)])
    assert data == expected_file([b"xy", b"zw", b"\0\0"])
    assert mil.blobfile_read_chunk(memoryview(bytearray(data)), 130) == (194, 2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(-65504, 65504, width=16), max_size=20), min_size=1, max_size=5))
def test_write_many_read_round_trip(tensors: list[list[float]]) -> None:
    arrays = [np.array(t, dtype=np.float32) for t in tensors]
    data, offsets = blobfile.write_many(arrays)
    assert offsets == mil.blobfile_chunk_offsets([a.size * 2 for a in arrays])
    for array, offset in zip(arrays, offsets):
        np.testing.assert_array_equal(blobfile.read(data, offset), array.astype(np.float16))


def test_read_reshapes_and_keeps_int8() -> None:
    q = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    data = blobfile.write(q)
    back = blobfile.read(data, dtype=np.int8, shape=(3, 4))
    np.testing.assert_array_equal(back, q)
    back[0, 0] = 99  # a copy, not a view of the file
    assert blobfile.read(data, dtype=np.int8)[0] == -6
    with pytest.raises(blobfile.BlobfileError, match="needs 24"):
        blobfile.read(data, dtype=np.int8, shape=(4, 6))
    with pytest.raises(blobfile.BlobfileError, match="int32"):
        blobfile.write(np.zeros(3, np.int32))
    odd = blobfile.write(np.zeros(5, np.int8))  # 5 bytes: not a whole number of fp16 elements (a fuzz finding)
    with pytest.raises(blobfile.BlobfileError, match="not a whole number of float16"):
        blobfile.read(odd)


@pytest.mark.parametrize("offset", [0, 128, 100, 10_000, 2**64 - 1])
def test_bad_offset_is_constraint_ane22(offset: int) -> None:
    data = blobfile.write(np.ones(8, np.float16))
    with pytest.raises(orion.ConstraintError, match="must be the chunk header, 64 for a single-tensor file") as info:
        mil.blobfile_read_chunk(data, offset, "wq.bin")
    assert info.value.constraint == "ANE-22"
    assert "wq.bin" in str(info.value) and str(offset) in str(info.value)


@pytest.mark.parametrize("cut", [10, 63, 70, 127, 130, 143])
def test_truncated_file_is_compile_error(cut: int) -> None:
    data = blobfile.write(np.ones(8, np.float16))[:cut]
    with pytest.raises(orion.CompileError, match="truncated") as info:
        mil.blobfile_read_chunk(data, 64, "wq.bin")
    assert not isinstance(info.value, orion.ConstraintError)


def test_inconsistent_headers_are_compile_errors() -> None:
    data = bytearray(blobfile.write(np.ones(8, np.float16)))
    not_a_blobfile = bytes(data[:4]) + b"\x07" + bytes(data[5:])
    with pytest.raises(orion.CompileError, match="not a BLOBFILE"):
        mil.blobfile_read_chunk(not_a_blobfile, 64)
    data[80] = 100  # payload offset inside the chunk header
    with pytest.raises(orion.CompileError, match="inconsistent"):
        mil.blobfile_read_chunk(data, 64)
