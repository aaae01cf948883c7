// Packed weights held once per process under a key that their stored bytes alone determine (a weight
// file's SHA-256 and offset, with the shape; CompressedConst::key for a quantized one): a weight that every
// bucket's program bakes is packed once, neither hashed nor compared, while some program holds it.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>

namespace orion::emu::kernels {

// The first, middle and last 16 of `bytes`: what a keyed weight is checked by on each use, a constant cost that
// catches a key naming other bytes.
inline std::string sampled_bytes(std::string_view bytes) {
    std::string samples;
    for (size_t at : {size_t{0}, bytes.size() / 2, bytes.size() - std::min<size_t>(bytes.size(), 16)})
        samples.append(bytes.substr(at, 16));
    return samples;
}

template <typename Packed>
class KeyedWeights {
public:
    // The weight held under `key`, else make()'s (nullptr: the kernels do not take it, nothing is kept), kept
    // under the key with `samples` (sampled_bytes of its stored form): a key held with other samples names other
    // bytes and throws std::invalid_argument. An empty key is make()'s. make() runs outside the lock, so programs
    // compiled on several threads pack at once; a weight packed twice in a race is kept once (the first).
    template <typename Make>
    std::shared_ptr<const Packed> get(const std::string& key, const std::string& samples, const Make& make) {
        if (key.empty()) return make();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (auto alive = held(key, samples)) return alive;
        }
        std::shared_ptr<const Packed> made = make();
        if (!made) return made;
        std::lock_guard<std::mutex> lock(mutex_);
        if (auto alive = held(key, samples)) return alive;  // packed by another thread meanwhile
        for (auto it = held_.begin(); it != held_.end();)
            it = it->second.weight.expired() ? held_.erase(it) : std::next(it);
        held_[key] = {made, samples};
        return made;
    }

    // fn(key, weight) for each weight held and alive, under the lock.
    template <typename Fn>
    void for_each(const Fn& fn) const {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const auto& [key, entry] : held_)
            if (auto alive = entry.weight.lock()) fn(key, alive);
    }

private:
    struct Held {
        std::weak_ptr<const Packed> weight;
        std::string samples;
    };
    // (under the lock)
    std::shared_ptr<const Packed> held(const std::string& key, const std::string& samples) const {
        auto it = held_.find(key);
        if (it == held_.end()) return nullptr;
        auto alive = it->second.weight.lock();
        if (alive && it->second.samples != samples)
            throw std::invalid_argument("shared_conv1x1: the weight key '" + key +
                                        "' names bytes that differ from the weight packed under it (a key must be "
                                        "determined by the weight's bytes, e.g. their SHA-256)");
        return alive;
    }
    mutable std::mutex mutex_;
    std::unordered_map<std::string, Held> held_;
};

}  // namespace orion::emu::kernels
