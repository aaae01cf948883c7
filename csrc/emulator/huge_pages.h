// Zeroed memory whose whole 2 MiB pages are backed by transparent huge pages where the kernel offers them
// on request (Linux THP "madvise"): one fault and one TLB entry per 2 MiB instead of 512.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
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

// n zeros of T in a fresh anonymous map, on huge pages where the kernel offers them, unmapped with the last
// owner. Unlike huge_page_zeros, nothing writes the zeros: the kernel's pages come zeroed on first touch, so
// memory written once right after (packed panels) is touched once, by its writers' threads, not first by a
// single-threaded memset (a Qwen2.5-0.5B cold start zeroed 943 MB of panels that way before packing them).
template <typename T>
std::shared_ptr<T> huge_page_map(size_t n) {
    constexpr size_t kHugePage = size_t{1} << 21;
    const size_t bytes = n * sizeof(T) + kHugePage;  // room to start on a huge page
    void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t base = reinterpret_cast<uintptr_t>(map);
    T* data = reinterpret_cast<T*>((base + kHugePage - 1) & ~(uintptr_t{kHugePage} - 1));
#ifdef MADV_HUGEPAGE
    const size_t whole = (n * sizeof(T)) & ~(kHugePage - 1);  // the whole huge pages: a partial one would be RSS
    if (whole) ::madvise(data, whole, MADV_HUGEPAGE);           // a hint, as above
#endif
    return std::shared_ptr<T>(data, [map, bytes](T*) { ::munmap(map, bytes); });
}

}  // namespace orion::emu
