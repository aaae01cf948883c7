// Surfaces: the flat byte buffers a program reads its inputs from and writes its outputs to
// (IOSurfaces on the ANE, docs/hardware.md §3). A tensor of the MIL-declared shape is stored packed
// from offset 0; the rest of the surface is padding the hardware ignores.
//
// Memory comes from the SurfaceAllocator each surface is created with: host memory, or IOSurfaces
// for the ane backend (Backend::surfaces, see ane_client.h). Either kind works with the emulator;
// the ane backend needs its own kind. CPU access goes through lock()/unlock() (docs/hardware.md §3:
// lock, copy, unlock; never hold a lock across an evaluate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "hardware_limits.h"

namespace orion::runtime {

struct SurfaceAllocator {
    const char* name;  // "host", "iosurface"
    // Allocates `bytes` (zero-filled); returns the backend handle (an IOSurfaceRef on Apple) and
    // sets *base to the memory. Throws on failure.
    void* (*create)(size_t bytes, uint8_t** base);
    void (*destroy)(void* handle);
    void (*lock)(void* handle, bool read_only);
    void (*unlock)(void* handle, bool read_only);
};

const SurfaceAllocator& host_allocator();

class Surface {
public:
    Surface(size_t bytes, const SurfaceAllocator& allocator);  // zero-filled
    // A non-owning surface over memory someone else owns (the harness's stand-in framework).
    static std::unique_ptr<Surface> view(uint8_t* data, size_t bytes);
    ~Surface();
    Surface(const Surface&) = delete;
    Surface& operator=(const Surface&) = delete;

    uint8_t* data() { return data_; }
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    void* handle() const { return handle_; }
    const SurfaceAllocator& allocator() const { return *allocator_; }

    // CPU access bracket. Nested locks are refused (one copy at a time); unlock() without lock()
    // throws. An evaluate refuses a locked surface.
    void lock(bool read_only);
    void unlock();
    bool locked() const { return lock_state_ != 0; }

private:
    const SurfaceAllocator* allocator_;
    void* handle_ = nullptr;
    uint8_t* data_ = nullptr;
    size_t size_;
    int lock_state_ = 0;  // 0 unlocked, 1 locked read-write, 2 locked read-only
};

}  // namespace orion::runtime
