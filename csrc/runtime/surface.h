// Surfaces: the flat byte buffers a program reads its inputs from and writes its outputs to
// (IOSurfaces on the ANE, FACTS section 3). A tensor of the MIL-declared shape is stored packed
// from offset 0; the rest of the surface is padding the hardware ignores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace orion::runtime {

// Surfaces under this size fail at evaluate on the ANE (FACTS section 3, conservative form).
inline constexpr size_t kMinSurfaceBytes = 49152;

class Surface {
public:
    explicit Surface(size_t bytes);  // zero-filled, 64-byte aligned
    uint8_t* data() { return data_.get(); }
    const uint8_t* data() const { return data_.get(); }
    size_t size() const { return size_; }

private:
    struct Free {
        void operator()(uint8_t* p) const;
    };
    std::unique_ptr<uint8_t, Free> data_;
    size_t size_;
};

}  // namespace orion::runtime
