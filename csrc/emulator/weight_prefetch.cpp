#include "emulator/weight_prefetch.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

#include "emulator/kernels.h"

namespace orion::emu::kernels {
namespace {

struct Streamed {
    std::weak_ptr<const void> owner;
    const char* data = nullptr;
    size_t bytes = 0;
};

// Chains longer than this are cut (a cycle of weights smaller than kPrefetchAhead in all).
constexpr int kMaxChain = 64;
// Entries of weights since freed are swept when the map grows past this.
constexpr size_t kSweepAt = 4096;

class StreamOrder {
public:
    void streamed(const std::weak_ptr<const void>& weight, const void* data, size_t bytes) {
        std::vector<std::shared_ptr<const void>> owners;
        std::vector<std::pair<const char*, size_t>> ranges;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            const std::shared_ptr<const void> self = weight.lock();
            if (!self) return;
            const void* key = self.get();
            if (last_ && last_ != key) {
                if (next_.size() >= kSweepAt) sweep();
                next_[last_] = {weight, static_cast<const char*>(data), bytes};
            }
            last_ = key;
            size_t ahead = 0;
            for (int step = 0; step < kMaxChain && ahead < kPrefetchAhead; ++step) {
                const auto it = next_.find(key);
                if (it == next_.end()) break;
                std::shared_ptr<const void> next = it->second.owner.lock();
                if (!next || next == self) break;
                ranges.emplace_back(it->second.data, std::min(it->second.bytes, kPrefetchAhead - ahead));
                ahead += ranges.back().second;
                key = next.get();
                owners.push_back(std::move(next));
            }
        }
        prefetch_in_background(std::move(owners), std::move(ranges));
    }

private:
    void sweep() {
        for (auto it = next_.begin(); it != next_.end();) it = it->second.owner.expired() ? next_.erase(it) : std::next(it);
    }

    std::mutex mutex_;
    const void* last_ = nullptr;                       // the weight streamed last (compared, never read)
    std::unordered_map<const void*, Streamed> next_;  // weight -> the one streamed after it last time
};

StreamOrder* g_order = nullptr;  // never destroyed: pool threads may outlive statics

StreamOrder& stream_order() {
    static const bool created = [] {
        g_order = new StreamOrder;
#if defined(__unix__) || defined(__APPLE__)
        // A child forked while another thread held the order's lock starts with a fresh one.
        pthread_atfork(nullptr, nullptr, [] { g_order = new StreamOrder; });
#endif
        return true;
    }();
    (void)created;
    return *g_order;
}

}  // namespace

void weight_streamed(const std::weak_ptr<const void>& weight, const void* data, size_t bytes) {
    stream_order().streamed(weight, data, bytes);
}

}  // namespace orion::emu::kernels
