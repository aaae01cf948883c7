// Zero-filled vectors whose whole 2 MiB pages are backed by transparent huge pages where the kernel
// offers them on request (Linux THP "madvise"): one fault and one TLB entry per 2 MiB instead of 512.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace orion::emu {

// n zeros; madvise(MADV_HUGEPAGE) on the whole huge pages inside the allocation before the first touch
// (a hint: its failure is harmless, and without THP the pages are 4 KiB ones as before).
template <typename T>
std::vector<T> huge_page_zeros(size_t n) {
    std::vector<T> v;
    v.reserve(n);  // allocated, not yet touched
#ifdef MADV_HUGEPAGE
    constexpr uintptr_t kHugePage = uintptr_t{1} << 21;
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(v.data()) + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(v.data() + n) & ~(kHugePage - 1);
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
    v.resize(n);
    return v;
}

}  // namespace orion::emu
