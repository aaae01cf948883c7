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

}  // namespace orion::emu
