// Floating-point numbers in MIL text, independent of the process locale and of the C++ library.
//
// Not std::from_chars / std::to_chars for double: libc++ has floating-point from_chars only since
// LLVM 20 (Apple's toolchain only when targeting macOS 26), and Apple marks floating-point to_chars
// available from macOS 13.3 only. strtod and snprintf exist in every C library; both follow
// LC_NUMERIC, so they run here under the "C" locale of the calling thread (uselocale, POSIX 2008),
// which a host application's setlocale cannot change.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace orion::mil {

// The double `text` spells: a decimal (`-1.5e-3`, `65504`) or, with `hex`, the digits of a hex
// float after its `0x` (`1p-3`, `1.8p+1`); no sign, no surrounding space. nullopt when the text is
// not entirely a number or its magnitude overflows a double (underflow rounds to subnormal or zero).
std::optional<double> parse_double(std::string_view text, bool hex);

// The shortest decimal that reads back as exactly `v` (finite), in fixed notation (`0.00001`,
// `1234.5`, `3`) when `fixed`, otherwise scientific (`1e-07`, `-2.5e+20`): the digits
// std::to_chars(v, chars_format::fixed / scientific) gives.
std::string format_shortest(double v, bool fixed);

// The shortest decimal reading back as `v` in %g style (for messages; also inf and nan).
std::string format_general(double v);

}  // namespace orion::mil
