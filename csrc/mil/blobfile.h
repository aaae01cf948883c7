// BLOBFILE weight files (docs/hardware.md §5): a 64-byte file header, then per tensor a 64-byte chunk
// header (magic 0xDEADBEEF, payload size, absolute payload offset) followed by the payload.
// The MIL `offset` of a tensor is the offset of its chunk header (64 for a one-tensor file).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace orion::mil::blobfile {

inline constexpr uint64_t kFileHeaderSize = 64;
inline constexpr uint64_t kChunkHeaderSize = 64;
inline constexpr uint32_t kChunkMagic = 0xDEADBEEF;

// The chunk header's data-type code: coremltools' MILBlob BlobDataType (Blob/BlobDataType.hpp).
enum class DataType : uint32_t { fp16 = 1, fp32 = 2, uint8 = 3, int8 = 4, int4 = 8, uint4 = 11, uint6 = 13 };
// Whether `code` is one of DataType's codes.
bool is_data_type_code(uint32_t code);
inline constexpr uint64_t kAlignment = 64;  // every chunk header and payload starts at a multiple of 64

struct Payload {
    std::string_view bytes;
    DataType dtype = DataType::fp16;
    uint32_t padding_bits = 0;  // sub-byte types: unused bits of the last byte (coremltools' padding_size_in_bits)
};

struct Chunk {
    uint64_t header_offset;  // the MIL offset
    uint64_t data_offset;    // absolute offset of the payload
    uint64_t size;           // payload bytes
};

// One file holding every payload in order, laid out as coremltools' StorageWriter does: the file
// header's count field is the number of payloads, each chunk header starts at the next multiple of
// 64 after the previous payload (zero padding between), its payload right after it.
std::string write(const std::vector<Payload>& payloads);
// The bytes of that file, and the file written into `out` (that many bytes; each payload copied once).
uint64_t file_size(const std::vector<Payload>& payloads);
void write_into(const std::vector<Payload>& payloads, char* out);
// Chunk header offsets write() would give these payload sizes.
std::vector<uint64_t> chunk_offsets(const std::vector<uint64_t>& payload_sizes);

// The chunk whose header is at `offset`. Throws ConstraintError (BLOB_OFFSET) when `offset` does
// not point at a chunk header, CompileError when the file is truncated or inconsistent. `what`
// names the file in messages.
Chunk read_chunk(std::string_view file, uint64_t offset, const std::string& what);

}  // namespace orion::mil::blobfile
