// BLOBFILE weight files, byte layout of docs/hardware.md §5 (little-endian).
#include "mil/blobfile.h"

#include <cstring>

#include "errors.h"

namespace orion::mil::blobfile {

namespace {

constexpr size_t kVersionByte = 4;       // file header: u32 count at 0, u32 version (2) at 4
constexpr size_t kChunkTypeByte = 4;     // chunk header: u32 data-type code (DataType)
constexpr size_t kChunkSizeField = 8;    // payload bytes
constexpr size_t kChunkDataField = 16;   // absolute payload offset
constexpr size_t kChunkPaddingField = 24;  // sub-byte payloads: unused bits of the last byte

void put_u32(char* out, size_t at, uint64_t v) {
    for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_le(std::string_view in, size_t at, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[at + i]);
    return v;
}

}  // namespace

std::vector<uint64_t> chunk_offsets(const std::vector<uint64_t>& payload_sizes) {
    std::vector<uint64_t> offsets;
    uint64_t at = kFileHeaderSize;
    for (uint64_t size : payload_sizes) {
        offsets.push_back(at);
        at += kChunkHeaderSize + size;
        at = (at + kAlignment - 1) / kAlignment * kAlignment;
    }
    return offsets;
}

bool is_data_type_code(uint32_t code) {
    for (DataType d : {DataType::fp16, DataType::fp32, DataType::uint8, DataType::int8, DataType::int4, DataType::uint4,
                       DataType::uint6})
        if (code == static_cast<uint32_t>(d)) return true;
    return false;
}

uint64_t file_size(const std::vector<Payload>& payloads) {
    std::vector<uint64_t> sizes;
    for (const auto& p : payloads) sizes.push_back(p.bytes.size());
    std::vector<uint64_t> offsets = chunk_offsets(sizes);
    uint64_t total = offsets.empty() ? kFileHeaderSize : offsets.back() + kChunkHeaderSize + sizes.back();
    if (total > UINT32_MAX) throw CompileError("BLOBFILE would be " + std::to_string(total) + " bytes; the format's offsets are 32-bit");
    return total;
}

void write_into(const std::vector<Payload>& payloads, char* out) {
    std::vector<uint64_t> sizes;
    for (const auto& p : payloads) sizes.push_back(p.bytes.size());
    std::vector<uint64_t> offsets = chunk_offsets(sizes);
    std::memset(out, 0, kFileHeaderSize);
    put_u32(out, 0, payloads.size());
    out[kVersionByte] = 0x02;
    uint64_t end = kFileHeaderSize;  // zero the alignment gaps and headers only: every payload byte is written
    for (size_t i = 0; i < payloads.size(); ++i) {
        size_t chunk = offsets[i];
        std::memset(out + end, 0, chunk + kChunkHeaderSize - end);
        put_u32(out, chunk, kChunkMagic);
        put_u32(out, chunk + kChunkTypeByte, static_cast<uint32_t>(payloads[i].dtype));
        put_u32(out, chunk + kChunkSizeField, sizes[i]);
        put_u32(out, chunk + kChunkDataField, chunk + kChunkHeaderSize);
        put_u32(out, chunk + kChunkPaddingField, payloads[i].padding_bits);
        std::memcpy(out + chunk + kChunkHeaderSize, payloads[i].bytes.data(), sizes[i]);
        end = chunk + kChunkHeaderSize + sizes[i];
    }
}

std::string write(const std::vector<Payload>& payloads) {
    std::string out(file_size(payloads), '\0');
    write_into(payloads, out.data());
    return out;
}

Chunk read_chunk(std::string_view file, uint64_t offset, const std::string& what) {
    const std::string where = what + " at offset " + std::to_string(offset);
    if (file.size() < kFileHeaderSize)
        throw CompileError(what + ": truncated BLOBFILE (" + std::to_string(file.size()) +
                           " bytes, shorter than the 64-byte file header)");
    if (file[kVersionByte] != 0x02) throw CompileError(what + ": not a BLOBFILE (file header byte 4 is not 0x02)");
    bool has_magic = offset >= kFileHeaderSize && offset <= file.size() && file.size() - offset >= 4 &&
                     get_le(file, offset, 4) == kChunkMagic;
    if (!has_magic)
        throw ConstraintError(constraints::BLOB_OFFSET,
                              where + " (file of " + std::to_string(file.size()) +
                                  " bytes): no chunk header (magic 0xDEADBEEF) there; the MIL offset must be "
                                  "the chunk header, 64 for a single-tensor file");
    if (file.size() - offset < kChunkHeaderSize) throw CompileError(where + ": truncated chunk header");
    // Size and payload offset are read as 64-bit: the published files leave the upper bytes zero and
    // Core ML's own weight files store 64-bit fields there.
    Chunk chunk{offset, get_le(file, offset + kChunkDataField, 8), get_le(file, offset + kChunkSizeField, 8)};
    if (chunk.data_offset < offset + kChunkHeaderSize)
        throw CompileError(where + ": inconsistent chunk header (payload offset " + std::to_string(chunk.data_offset) +
                           " overlaps the header)");
    if (chunk.data_offset > file.size() || file.size() - chunk.data_offset < chunk.size)
        throw CompileError(where + ": truncated BLOBFILE (payload of " + std::to_string(chunk.size) + " bytes at " +
                           std::to_string(chunk.data_offset) + " runs past the end of the " +
                           std::to_string(file.size()) + "-byte file)");
    return chunk;
}

}  // namespace orion::mil::blobfile
