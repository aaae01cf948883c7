// The ane backend: programs compiled and run by Apple's private AppleNeuralEngine framework
// (csrc/ane_client.mm). Built on macOS, and on Linux with ORION_ANE_HARNESS=ON against the
// stand-ins of tests/harness.
#pragma once

#include <string>

#include "runtime/backend.h"

namespace orion::ane {

// Default framework path; the environment variable ORION_ANE_FRAMEWORK overrides it.
inline constexpr const char* kFrameworkPath =
    "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine";

// The "ane" entry of the backend registry. Its probe dlopens the framework once per process.
runtime::Backend backend();

// The framework path in use (ORION_ANE_FRAMEWORK or kFrameworkPath).
std::string framework_path();

}  // namespace orion::ane
