// Process-wide pool of fp32 buffers for the emulator's intermediate tensors. A program takes a
// buffer when a value is first written and gives it back after its last reader, so one evaluate
// holds only the values that are live at once, and programs run one after the other share the
// same memory. Buffers are matched by capacity: an idle one of that size, else an idle one of at most twice it
// (resized within its capacity: a fused projection's output [2C, S] serves its halves' consumers in turn
// instead of sitting idle beside them); the pool keeps at most kMaxPooledBytes idle.
#pragma once

#include <cstddef>
#include <vector>

namespace orion::emu::buffer_pool {

constexpr size_t kMaxPooledBytes = size_t{256} << 20;

// A buffer of exactly n floats: a pooled one (stale contents; its capacity up to 2n) or a new zero-filled one
// (freeing the idle ones it replaces, their pages given back to the OS).
std::vector<float> take(size_t n);
// Returns a buffer to the pool at its capacity (or frees it when the pool is full); its contents stay stale.
void give(std::vector<float>&& buffer);
// Frees every idle buffer and gives the heap's free pages back to the OS (the emulator calls it when a program is
// unloaded or destroyed).
void clear();
// Bytes held idle in the pool.
size_t pooled_bytes();

// What the pool's buffers weigh: taken and not given back (live), idle, and the most live + idle
// bytes at any time since the last reset_peak().
struct Usage {
    size_t live = 0, idle = 0, peak = 0;
};
Usage usage();
void reset_peak();

}  // namespace orion::emu::buffer_pool
