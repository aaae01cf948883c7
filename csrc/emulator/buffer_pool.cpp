#include "emulator/buffer_pool.h"

#include "emulator/huge_pages.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace orion::emu::buffer_pool {

namespace {

// Gives the free pages inside the heap back to the OS. Freed buffers leave holes that glibc's free() keeps resident
// (it trims only the heap's top), and the next, larger values come from fresh memory beside them: GPT-2 124M's
// 1,000-token prefill after shorter ones peaked 18 MiB higher (386 against 368 MiB) without this.
void return_free_pages() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

struct Pool {
    std::mutex mutex;
    std::multimap<size_t, std::vector<float>> idle;  // by capacity (elements)
    size_t bytes = 0;  // idle (capacities)
    size_t live = 0, peak = 0;
    void note() { peak = std::max(peak, live + bytes); }
};

Pool& pool() {
    static Pool* p = new Pool;  // never destroyed: programs may outlive static destruction order
    return *p;
}

}  // namespace

// Buffers from this many elements (1 MiB of fp32: a prompt's activations) are shared across sizes: a request
// reuses a larger idle one, and a new one replaces smaller idle ones. Smaller ones (a decode step's padded I/O,
// tens of KB) keep their exact sizes: a buffer grown back within its capacity is zero-filled there (std::vector
// value-initializes), which in a decode step, its programs alternating between two sizes, came to megabytes per
// token.
constexpr size_t kLargeBuffer = size_t{1} << 18;

std::vector<float> take(size_t n) {
    Pool& p = pool();
    std::vector<std::vector<float>> replaced;  // idle buffers a new one replaces
    const bool large = n >= kLargeBuffer;
    {
        std::lock_guard<std::mutex> lock(p.mutex);
        auto it = p.idle.find(n);
        if (it == p.idle.end() && large) {
            // No idle buffer of this capacity: reuse an idle one of at most twice it, instead of allocating while
            // it sits idle.
            it = p.idle.upper_bound(n);
            if (it != p.idle.end() && it->first / 2 > n) it = p.idle.end();
        }
        if (it != p.idle.end()) {
            std::vector<float> out = std::move(it->second);
            p.idle.erase(it);
            p.bytes -= out.capacity() * sizeof(float);
            p.live += out.capacity() * sizeof(float);
            // Given back at the size it was taken at, not regrown to its capacity: resizing here zero-fills only
            // the elements past that size, when it grows (std::vector value-initializes). Regrowing at every
            // give zero-filled a 1,024-lane prefill's shrunk buffers whether or not a larger value came next.
            out.resize(n);
            return out;
        }
        // A new buffer replaces idle ones too small for this size (the largest first, up to its size) instead
        // of joining them: the pool stays near the most bytes live at once rather than growing by every size
        // a program's values take (GPT-2 124M's 1,024-lane prefill layer: 63 -> 47 MB, its MLP's [3072, S]
        // values arriving when [768, S] and [2304, S] ones are idle; run again, the layers find their sizes idle).
        for (size_t freed = 0; large && freed < n;) {
            auto smaller = p.idle.lower_bound(n);
            if (smaller == p.idle.begin()) break;
            --smaller;
            freed += smaller->first;
            p.bytes -= smaller->first * sizeof(float);
            replaced.push_back(std::move(smaller->second));
            p.idle.erase(smaller);
        }
        p.live += n * sizeof(float);
        p.note();
    }
    if (!replaced.empty()) {
        replaced.clear();  // freed outside the lock, before the new buffer exists: never both resident
        return_free_pages();
    }
    // A large one on huge pages: a 1,024-lane bucket's activations are touched on every 4 KiB row even for a
    // 16-token prompt, and faulting them in 4 KiB pages cost a warm start tens of thousands of faults.
    return large ? huge_page_zeros<float>(n) : std::vector<float>(n, 0.0f);
}

void give(std::vector<float>&& buffer) {
    const size_t n = buffer.capacity();  // its size may be less (take): stale contents either way
    if (n == 0) return;
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.live -= std::min(p.live, n * sizeof(float));
    if (p.bytes + n * sizeof(float) > kMaxPooledBytes) {
        std::vector<float>().swap(buffer);  // freed
        return;
    }
    p.bytes += n * sizeof(float);
    p.idle.emplace(n, std::move(buffer));
    p.note();
}

void clear() {
    Pool& p = pool();
    std::multimap<size_t, std::vector<float>> idle;
    {
        std::lock_guard<std::mutex> lock(p.mutex);
        idle.swap(p.idle);
        p.bytes = 0;
    }
    idle.clear();  // freed outside the lock
    return_free_pages();
}

size_t pooled_bytes() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    return p.bytes;
}

Usage usage() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    return {p.live, p.bytes, p.peak};
}

void reset_peak() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.peak = p.live + p.bytes;
}

}  // namespace orion::emu::buffer_pool
