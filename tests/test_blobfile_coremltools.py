"""Every BLOBFILE Orion writes is read back by Apple's own reader (coremltools' MILBlob
``_BlobStorageReader``) with the same values and dtype, and is byte for byte what Apple's writer
(``_BlobStorageWriter``) produces for the same tensors: fp16, fp32, int8, uint8, and several in one file."""

from __future__ import annotations

import numpy as np
import pytest

from orion import blobfile

storage = pytest.importorskip("coremltools.libmilstoragepython")

READ = {np.float16: "read_fp16_data", np.float32: "read_float_data", np.int8: "read_int8_data",
        np.uint8: "read_uint8_data"}
WRITE = {np.float16: "write_fp16_data", np.float32: "write_float_data", np.int8: "write_int8_data",
         np.uint8: "write_uint8_data"}


def tensors() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((3, 5)).astype(np.float16),           # 30 bytes: the next chunk is padded
            rng.integers(-128, 128, size=(7, 3)).astype(np.int8),
            rng.standard_normal(9).astype(np.float32),
            rng.integers(0, 256, size=11).astype(np.uint8),
            rng.standard_normal((64, 64)).astype(np.float16)]


def apple_read(path: str, offset: int, dtype: type) -> np.ndarray:
    values = getattr(storage._BlobStorageReader(path), READ[dtype])(offset)
    return np.asarray(values).view(np.float16) if dtype is np.float16 else np.asarray(values)


def apple_write(path: str, arrays: list[np.ndarray]) -> list[int]:
    writer = storage._BlobStorageWriter(path, truncate_file=True)
    offsets = [getattr(writer, WRITE[a.dtype.type])(a.reshape(-1).view(np.uint16) if a.dtype == np.float16
                                                    else a.reshape(-1)) for a in arrays]
    del writer  # flushes the file
    return offsets


@pytest.mark.parametrize("index", range(5))
def test_one_tensor_files_read_back_by_coremltools(tmp_path, index: int) -> None:
    array = tensors()[index]
    path = str(tmp_path / "w.bin")
    with open(path, "wb") as f:
        f.write(blobfile.write(array, float_dtype=array.dtype if array.dtype == np.float32 else np.float16))
    got = apple_read(path, 64, array.dtype.type)
    assert got.dtype == array.dtype
    np.testing.assert_array_equal(got, array.reshape(-1))


def test_several_tensors_in_one_file_match_coremltools_byte_for_byte(tmp_path) -> None:
    arrays = tensors()
    mixed = [a for a in arrays if a.dtype != np.float32]  # fp16, int8, uint8 (fp32: the next test)
    data, offsets = blobfile.write_many(mixed)
    ours, apple = str(tmp_path / "ours.bin"), str(tmp_path / "apple.bin")
    with open(ours, "wb") as f:
        f.write(data)
    assert offsets == apple_write(apple, mixed)
    with open(apple, "rb") as f:
        assert data == f.read()
    for array, offset in zip(mixed, offsets):
        got = apple_read(ours, offset, array.dtype.type)
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array.reshape(-1))


def test_fp32_in_a_multi_tensor_file(tmp_path) -> None:
    arrays = [a for a in tensors() if a.dtype != np.float16]
    data, offsets = blobfile.write_many(arrays, float_dtype=np.float32)
    apple = str(tmp_path / "apple.bin")
    assert offsets == apple_write(apple, arrays)
    with open(apple, "rb") as f:
        assert data == f.read()
    path = str(tmp_path / "ours.bin")
    with open(path, "wb") as f:
        f.write(data)
    for array, offset in zip(arrays, offsets):
        np.testing.assert_array_equal(apple_read(path, offset, array.dtype.type), array.reshape(-1))


def test_an_int8_file_is_refused_as_fp16_by_coremltools(tmp_path) -> None:
    """The data-type code is what coremltools checks: an int8 chunk is not fp16 (the old files said 1)."""
    path = str(tmp_path / "q.bin")
    with open(path, "wb") as f:
        f.write(blobfile.write(np.arange(-4, 4, dtype=np.int8)))
    with pytest.raises(Exception, match="type"):
        storage._BlobStorageReader(path).read_fp16_data(64)
