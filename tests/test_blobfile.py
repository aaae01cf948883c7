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


def expected_file(payloads: list[bytes], codes: list[int] | None = None) -> bytes:
    """The layout of coremltools' MILBlob StorageFormat.hpp (storage_header{count, version=2}, then per blob a
    blob_metadata{sentinel, mil_dtype, sizeInBytes, offset} and the data, each at a multiple of 64), written
    independently of the implementation."""
    codes = codes or [1] * len(payloads)
    out = bytearray(struct.pack("<II56x", len(payloads), 2))
    for p, code in zip(payloads, codes):
        out += bytes(-len(out) % 64)
        chunk = len(out)
        out += struct.pack("<IIQQ40x", 0xDEADBEEF, code, len(p), chunk + 64)
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
    data = mil.blobfile_write([(p, 3) for p in payloads])
    assert data == expected_file(payloads, [3, 3, 3])
    assert data[0] == 3  # the count field
    assert mil.blobfile_chunk_offsets([2, 0, 7]) == [64, 192, 256]  # 64-byte aligned, as coremltools writes
    assert [mil.blobfile_read_chunk(data, o) for o in (64, 192, 256)] == [(128, 2), (256, 0), (320, 7)]
    assert mil.blobfile_write([]) == expected_file([])


def test_accepts_any_buffer() -> None:
    data = mil.blobfile_write([(bytearray(b"xy"), 1), (memoryview(b"zw"), 1), (np.zeros(2, np.int8), 4)])
    assert data == expected_file([b"xy", b"zw", b"\0\0"], [1, 1, 4])
    assert mil.blobfile_read_chunk(memoryview(bytearray(data)), 192) == (256, 2)


def test_data_type_codes_are_coremltools() -> None:
    """The chunk header's code at +4 is coremltools' BlobDataType: Float16=1, Float32=2, UInt8=3, Int8=4."""
    for array, code in ((np.ones(4, np.float16), 1), (np.ones(4, np.float32), 1), (np.ones(4, np.uint8), 3),
                        (np.ones(4, np.int8), 4)):
        assert struct.unpack_from("<I", blobfile.write(array), 68)[0] == code
    assert struct.unpack_from("<I", blobfile.write(np.ones(4, np.float32), float_dtype=np.float32), 68)[0] == 2
    with pytest.raises(orion.CompileError, match="data-type code 9"):
        mil.blobfile_write([(b"xy", 9)])


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
