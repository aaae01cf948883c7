// The SIMD flavours the emulator's kernel files share (internal): the target attributes of their
// AVX2 and AVX-512 functions, the unroll pragma their register tiles need, and the flavour this
// process runs (picked once, from the CPU and ORION_SIMD).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ORION_X86 1
#define ORION_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ORION_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#endif

// Fully unrolls a constant-trip loop so that arrays of vector accumulators live in registers (GCC
// otherwise keeps them on the stack).
#if defined(__clang__)
#define ORION_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define ORION_UNROLL _Pragma("GCC unroll 16")
#else
#define ORION_UNROLL
#endif

namespace orion::emu::kernels {

enum class SimdFlavour { portable, avx2, avx512 };

// The widest flavour this CPU runs, narrowed by ORION_SIMD=avx2 or ORION_SIMD=portable; the same for
// the whole process (kernels::simd_path names it).
SimdFlavour simd_flavour();

}  // namespace orion::emu::kernels
