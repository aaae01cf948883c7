// Packed weights held once per process under a key that their stored form alone determines
// (CompressedConst::key with the weight's shape): a weight that every bucket's program bakes is packed
// once, without hashing it, while some program holds it.
#pragma once

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace orion::emu::kernels {

template <typename Packed>
class KeyedWeights {
public:
    // The weight held under `key`, else make()'s (nullptr: the kernels do not take it, nothing is kept), kept
    // under the key with `samples` (a few of the stored form's bytes): a key held with other samples names other
    // bytes and throws std::invalid_argument. An empty key is make()'s. make() runs outside the lock, so programs
    // compiled on several threads pack at once (a weight packed twice in a race is kept once by make()'s sharing).
    template <typename Make>
    std::shared_ptr<const Packed> get(const std::string& key, const std::string& samples, const Make& make) {
        if (key.empty()) return make();
        if (auto alive = held(key, samples)) return alive;
        std::shared_ptr<const Packed> made = make();
        if (!made) return made;
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = held_.begin(); it != held_.end();)
            it = it->second.weight.expired() ? held_.erase(it) : std::next(it);
        held_[key] = {made, samples};
        return made;
    }

private:
    struct Held {
        std::weak_ptr<const Packed> weight;
        std::string samples;
    };
    std::shared_ptr<const Packed> held(const std::string& key, const std::string& samples) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = held_.find(key);
        if (it == held_.end()) return nullptr;
        auto alive = it->second.weight.lock();
        if (alive && it->second.samples != samples)
            throw std::invalid_argument("shared_conv1x1: the weight key '" + key +
                                        "' names bytes that differ from the weight packed under it (a key must be "
                                        "determined by the weight's bytes, e.g. their SHA-256)");
        return alive;
    }
    std::mutex mutex_;
    std::unordered_map<std::string, Held> held_;
};

}  // namespace orion::emu::kernels
