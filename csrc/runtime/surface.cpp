#include "runtime/surface.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <sys/mman.h>

#include "errors.h"

namespace orion::runtime {

namespace {
// Host surfaces of at least this size are anonymous maps: zero pages the kernel supplies on first
// touch, so a surface costs no time to clear and no memory for the tail nothing writes (a padded
// decode input, a KV cache surface's unused positions). Smaller ones come from the heap.
constexpr size_t kMappedSurfaceBytes = size_t{256} << 10;

struct HostBlock {
    void* data;
    size_t bytes;
    bool mapped;
};

void* host_create(size_t bytes, uint8_t** base) {
    const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    HostBlock block{nullptr, rounded, rounded >= kMappedSurfaceBytes};
    if (block.mapped) {
        block.data = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (block.data == MAP_FAILED) throw std::bad_alloc();
    } else {
        block.data = std::aligned_alloc(64, rounded);
        if (!block.data) throw std::bad_alloc();
        std::memset(block.data, 0, rounded);
    }
    *base = static_cast<uint8_t*>(block.data);
    return new HostBlock(block);
}
void host_destroy(void* handle) {
    const auto* block = static_cast<HostBlock*>(handle);
    if (block->mapped)
        munmap(block->data, block->bytes);
    else
        std::free(block->data);
    delete block;
}
void host_lock(void*, bool) {}
void host_unlock(void*, bool) {}

const SurfaceAllocator kHost{"host", host_create, host_destroy, host_lock, host_unlock};

thread_local uint8_t* t_view_base = nullptr;
void* view_create(size_t, uint8_t** base) {
    *base = t_view_base;
    return t_view_base;
}
void view_destroy(void*) {}
const SurfaceAllocator kView{"view", view_create, view_destroy, host_lock, host_unlock};
}  // namespace

const SurfaceAllocator& host_allocator() { return kHost; }

Surface::Surface(size_t bytes, const SurfaceAllocator& allocator) : allocator_(&allocator), size_(bytes) {
    handle_ = allocator_->create(bytes, &data_);
}

std::unique_ptr<Surface> Surface::view(uint8_t* data, size_t bytes) {
    t_view_base = data;
    auto s = std::make_unique<Surface>(bytes, kView);
    t_view_base = nullptr;
    return s;
}

Surface::~Surface() {
    if (lock_state_) allocator_->unlock(handle_, lock_state_ == 2);
    allocator_->destroy(handle_);
}

void Surface::lock(bool read_only) {
    if (lock_state_) throw EvaluateError("surface is already locked: unlock it before locking it again");
    allocator_->lock(handle_, read_only);
    lock_state_ = read_only ? 2 : 1;
}

void Surface::unlock() {
    if (!lock_state_) throw EvaluateError("surface is not locked");
    allocator_->unlock(handle_, lock_state_ == 2);
    lock_state_ = 0;
}

}  // namespace orion::runtime
