#include "emulator/shared_consts.h"

#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string_view>

namespace orion::emu {

namespace {

struct Held {
    std::mutex mutex;
    std::multimap<size_t, std::weak_ptr<const std::vector<float>>> by_hash;
};

Held& held() {
    static Held* h = new Held;  // never destroyed: programs may outlive static destruction order
    return *h;
}

size_t hash_of(const std::vector<float>& v) {
    return std::hash<std::string_view>{}(
        std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

std::shared_ptr<const std::vector<float>> shared_floats(std::vector<float> values) {
    const size_t key = hash_of(values);
    Held& h = held();
    std::lock_guard<std::mutex> lock(h.mutex);
    auto [first, last] = h.by_hash.equal_range(key);
    for (auto it = first; it != last; ++it)
        if (auto alive = it->second.lock(); alive && same(*alive, values)) return alive;
    for (auto it = h.by_hash.begin(); it != h.by_hash.end();) it = it->second.expired() ? h.by_hash.erase(it) : std::next(it);
    auto made = std::make_shared<const std::vector<float>>(std::move(values));
    h.by_hash.emplace(key, made);
    return made;
}

std::pair<int64_t, int64_t> shared_floats_usage() {
    Held& h = held();
    std::lock_guard<std::mutex> lock(h.mutex);
    return alive_usage(h.by_hash);
}

}  // namespace orion::emu
