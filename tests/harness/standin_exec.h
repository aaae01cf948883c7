// The execution half of the stand-in framework, in plain C++ so that it can catch the core's
// exceptions (the Objective-C++ half cannot under the GCC runtime; see csrc/ane_client.mm).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace standin {

struct Program;

// Compiles with the emulator core (permissive profile: the rules are the client's job; no surface
// minimum: the client enforces it). Returns nullptr and sets *error on failure.
Program* build(std::string_view mil, const std::vector<std::pair<std::string, std::string>>& weights, std::string* error);
void destroy(Program* program);
size_t input_count(const Program* program);
size_t output_count(const Program* program);

// Surfaces by index in binding order (index i is the i-th name in alphabetical order). Returns
// the error text, empty on success.
std::string evaluate(Program* program, const std::vector<std::pair<uint8_t*, size_t>>& inputs,
                     const std::vector<std::pair<uint8_t*, size_t>>& outputs);

}  // namespace standin
