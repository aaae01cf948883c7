#include "emulator/buffer_pool.h"

#include <map>
#include <mutex>
#include <utility>

namespace orion::emu::buffer_pool {

namespace {

struct Pool {
    std::mutex mutex;
    std::multimap<size_t, std::vector<float>> idle;  // by element count
    size_t bytes = 0;
};

Pool& pool() {
    static Pool* p = new Pool;  // never destroyed: programs may outlive static destruction order
    return *p;
}

}  // namespace

std::vector<float> take(size_t n) {
    Pool& p = pool();
    {
        std::lock_guard<std::mutex> lock(p.mutex);
        auto it = p.idle.find(n);
        if (it != p.idle.end()) {
            std::vector<float> out = std::move(it->second);
            p.idle.erase(it);
            p.bytes -= n * sizeof(float);
            return out;
        }
    }
    return std::vector<float>(n, 0.0f);
}

void give(std::vector<float>&& buffer) {
    const size_t n = buffer.size();
    if (n == 0) return;
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    if (p.bytes + n * sizeof(float) > kMaxPooledBytes) {
        std::vector<float>().swap(buffer);  // freed
        return;
    }
    p.bytes += n * sizeof(float);
    p.idle.emplace(n, std::move(buffer));
}

void clear() {
    Pool& p = pool();
    std::multimap<size_t, std::vector<float>> idle;
    {
        std::lock_guard<std::mutex> lock(p.mutex);
        idle.swap(p.idle);
        p.bytes = 0;
    }
}  // freed here, outside the lock

size_t pooled_bytes() {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    return p.bytes;
}

}  // namespace orion::emu::buffer_pool
