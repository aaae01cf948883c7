// IEEE binary16 <-> binary32, portable and exact: round to nearest even, overflow to inf,
// subnormals and NaN preserved. The vectorised paths live in kernels.cpp.
#pragma once

#include <cstdint>
#include <cstring>

namespace orion::emu {

inline float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;  // +-0
    } else {          // subnormal: normalise
        uint32_t e = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            --e;
        }
        bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

inline uint16_t float_to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t abs = x & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u)  // inf or NaN (keep NaN quiet and non-zero)
        return sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u | ((abs >> 13) & 0x3FFu) : 0u);
    if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds past 65504 -> inf
    if (abs < 0x38800000u) {                          // below the smallest normal: subnormal or 0
        if (abs < 0x33000000u) return sign;           // under half the smallest subnormal -> 0
        const uint32_t shift = 126u - (abs >> 23);    // 14..24
        const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
        uint32_t h = mant >> shift;
        const uint32_t rest = mant & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (h & 1u))) ++h;
        return sign | static_cast<uint16_t>(h);
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
    uint32_t h = ((abs >> 13) - (112u << 10));
    const uint32_t rest = abs & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
    return sign | static_cast<uint16_t>(h);
}

inline float round_to_fp16(float f) { return half_to_float(float_to_half(f)); }

// Whether f is an fp16 value (finite, on fp16's grid: round_to_fp16(f) == f), from its bits.
inline bool is_fp16_value(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint32_t abs = x & 0x7FFFFFFFu;
    if (abs == 0) return true;
    if (abs > 0x477FE000u) return false;  // beyond 65504, inf or NaN
    const int exponent = static_cast<int>(abs >> 23) - 127;
    if (exponent < -24) return false;     // under the smallest subnormal, 2^-24
    const int dropped = 13 + (exponent < -14 ? -14 - exponent : 0);  // fp16 keeps 10 bits, fewer as a subnormal
    return (abs & ((1u << dropped) - 1u)) == 0;
}

}  // namespace orion::emu
