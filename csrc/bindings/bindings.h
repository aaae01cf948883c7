// Each file of csrc/bindings/ binds one part of the core into orion._core.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

namespace orion::bindings {

void bind_errors(pybind11::module_& m);   // errors.cpp: C++ exceptions -> orion.errors classes
void bind_mil(pybind11::module_& m);      // mil.cpp: orion._core.mil (program model, text, BLOBFILE)
void bind_kernels(pybind11::module_& m);  // kernels.cpp: orion._core.kernels (benchmarks, kernel tests)
void bind_runtime(pybind11::module_& m);  // runtime.cpp: compile/evaluate, surfaces, budget
void bind_train(pybind11::module_& m);    // train.cpp: orion._core.train (AdamW, gradient norm, fp16 clamp)

// An array's shape as Python writes a tuple, for error messages: "(2, 3)", "(3,)".
inline std::string shape_text(const pybind11::array& a) {
    std::string s = "(";
    for (pybind11::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
    return s + (a.ndim() == 1 ? ",)" : ")");
}

}  // namespace orion::bindings
