// Decode streams every layer's weights once per token, and the small ops between two convs leave
// DRAM idle. The convs' order repeats token after token, so each memory-bound conv learns which
// weight followed it last time and has an idle pool thread read the next weights of that chain
// into the caches while the ops in between run. A hint: no value depends on it.
#pragma once

#include <cstddef>
#include <memory>

namespace orion::emu::kernels {

// Bytes of the learned chain read ahead after a weight: what the last-level cache keeps while the
// convs in between stream theirs.
constexpr size_t kPrefetchAhead = size_t{8} << 20;

// `weight` (owning `bytes` bytes at `data`) was just streamed by a memory-bound kernel: remember it
// as the successor of the previous one, and prefetch what followed it last time. A weight not held
// by a shared_ptr (empty `weight`) is skipped.
void weight_streamed(const std::weak_ptr<const void>& weight, const void* data, size_t bytes);

}  // namespace orion::emu::kernels
