#include "emulator/weight_prefetch.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <utility>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#endif

#include "emulator/kernels.h"

namespace orion::emu::kernels {
namespace {

// Chains longer than this are cut (a cycle of weights smaller than kPrefetchAhead in all).
constexpr int kMaxChain = 64;
// Entries of weights since freed are swept when the map grows past this.
constexpr size_t kSweepAt = 4096;

// What followed a weight the last time it was streamed, and the chain of weights ahead of it.
struct Successor {
    std::weak_ptr<const void> owner;
    const char* data = nullptr;
    size_t bytes = 0;
    std::shared_ptr<const PrefetchRanges> ahead;  // the chain from `owner` on, as of `built` (null: not built)
    uint64_t built = 0;
};

class StreamOrder {
public:
    // Records `weight` as the successor of the weight streamed before it, and posts the chain ahead of it. A
    // decode step streams the same weights in the same order token after token, so the chain is built once
    // and posted as it is until a successor changes.
    void streamed(const std::weak_ptr<const void>& weight, const void* data, size_t bytes) {
        std::shared_ptr<const PrefetchRanges> ahead;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            const std::shared_ptr<const void> self = weight.lock();
            if (!self) return;
            const void* key = self.get();
            const char* start = static_cast<const char*>(data);
            if (last_ && last_ != key) {
                if (next_.size() >= kSweepAt) sweep();
                Successor& next = next_[last_];
                if (next.data != start || next.bytes != bytes || next.owner.expired()) {
                    next.owner = weight, next.data = start, next.bytes = bytes;
                    ++version_;  // every chain through the old successor is stale
                }
            }
            last_ = key;
            const auto it = next_.find(key);
            if (it == next_.end()) return;
            Successor& next = it->second;
            if (!next.ahead || next.built != version_) next.ahead = chain_after(key, self), next.built = version_;
            ahead = next.ahead;
        }
        prefetch_in_background(std::move(ahead));
    }

private:
    // The weights streamed after `key` (`self`) last time, up to kPrefetchAhead bytes: stops at a freed one or
    // at `self` again.
    std::shared_ptr<const PrefetchRanges> chain_after(const void* key, const std::shared_ptr<const void>& self) const {
        auto chain = std::make_shared<PrefetchRanges>();
        size_t ahead = 0;
        for (int step = 0; step < kMaxChain && ahead < kPrefetchAhead; ++step) {
            const auto it = next_.find(key);
            if (it == next_.end()) break;
            const std::shared_ptr<const void> next = it->second.owner.lock();
            if (!next || next == self) break;
            chain->owners.push_back(it->second.owner);
            chain->ranges.emplace_back(it->second.data, std::min(it->second.bytes, kPrefetchAhead - ahead));
            ahead += chain->ranges.back().second;
            key = next.get();
        }
        return chain;
    }

    void sweep() {
        for (auto it = next_.begin(); it != next_.end();) it = it->second.owner.expired() ? next_.erase(it) : std::next(it);
    }

    std::mutex mutex_;
    const void* last_ = nullptr;                        // the weight streamed last (compared, never read)
    std::unordered_map<const void*, Successor> next_;  // weight -> the one streamed after it last time
    uint64_t version_ = 1;                              // bumped when a successor changes
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
