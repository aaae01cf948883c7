#include "runtime/surface.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace orion::runtime {

void Surface::Free::operator()(uint8_t* p) const { std::free(p); }

Surface::Surface(size_t bytes) : size_(bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    data_.reset(static_cast<uint8_t*>(p));
}

}  // namespace orion::runtime
