// The fp32 values of a const tensor held once per process for each distinct content (hashed, then
// compared), shared by every program that holds it (e.g. the causal mask that each layer program of
// a prefill bucket bakes); freed with the last holder.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace orion::emu {

std::shared_ptr<const std::vector<float>> shared_floats(std::vector<float> values);
// (distinct const tensors alive, their bytes)
std::pair<int64_t, int64_t> shared_floats_usage();

// (entries alive, their bytes) of a map to weak_ptr<const std::vector<float>>: what a process-wide
// registry of shared values holds (shared_floats', const_fold's folded values), read under its lock.
template <typename WeakMap>
std::pair<int64_t, int64_t> alive_usage(const WeakMap& held) {
    int64_t count = 0, bytes = 0;
    for (const auto& entry : held)
        if (auto alive = entry.second.lock()) ++count, bytes += static_cast<int64_t>(alive->size() * sizeof(float));
    return {count, bytes};
}

}  // namespace orion::emu
