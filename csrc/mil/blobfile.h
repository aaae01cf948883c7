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

struct Chunk {
    uint64_t header_offset;  // the MIL offset
    uint64_t data_offset;    // absolute offset of the payload
    uint64_t size;           // payload bytes
};

// One file holding every payload in order; chunk i starts at 64 + sum_{j<i} (64 + size_j).
std::string write(const std::vector<std::string_view>& payloads);
// Chunk header offsets write() would give these payload sizes.
std::vector<uint64_t> chunk_offsets(const std::vector<uint64_t>& payload_sizes);

// The chunk whose header is at `offset`. Throws ConstraintError (BLOB_OFFSET) when `offset` does
// not point at a chunk header, CompileError when the file is truncated or inconsistent. `what`
// names the file in messages.
Chunk read_chunk(std::string_view file, uint64_t offset, const std::string& what);

}  // namespace orion::mil::blobfile
