// Bytes borrowed from Python buffers for the length of a core call. The buffer export is held until
// the HeldBytes is destroyed, so a bytearray cannot be resized (or freed) while the core reads it
// with the GIL released; a non-C-contiguous buffer (e.g. a numpy view with negative strides) is
// copied into contiguous memory first.
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <string>
#include <string_view>

#include "runtime/program.h"

namespace orion::bindings {

class HeldBytes {
public:
    // Throws CompileError naming `what` when `obj` is not a buffer.
    HeldBytes(const pybind11::handle& obj, const std::string& what);
    ~HeldBytes();
    HeldBytes(const HeldBytes&) = delete;
    HeldBytes& operator=(const HeldBytes&) = delete;
    std::string_view bytes() const;

private:
    Py_buffer view_{};
    bool held_ = false;
    std::string copy_;  // the contiguous copy of a strided buffer
};

// The weight dictionary as WeightFiles, every buffer held while `held` lives.
class HeldWeights {
public:
    explicit HeldWeights(const std::map<std::string, pybind11::object>& weights);
    const runtime::WeightFiles& files() const { return files_; }

private:
    std::map<std::string, std::unique_ptr<HeldBytes>> held_;
    runtime::WeightFiles files_;
};

}  // namespace orion::bindings
