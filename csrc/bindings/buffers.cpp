#include "bindings/buffers.h"

#include "errors.h"

namespace py = pybind11;

namespace orion::bindings {

HeldBytes::HeldBytes(const py::handle& obj, const std::string& what) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) == 0) {
        held_ = true;
        return;
    }
    PyErr_Clear();
    Py_buffer strided{};
    if (PyObject_GetBuffer(obj.ptr(), &strided, PyBUF_FULL_RO) != 0) {
        PyErr_Clear();
        throw CompileError(what + " must be bytes, bytearray, memoryview or a numpy array, not " +
                           std::string(Py_TYPE(obj.ptr())->tp_name));
    }
    copy_.resize(static_cast<size_t>(strided.len));
    const int rc = PyBuffer_ToContiguous(copy_.data(), &strided, strided.len, 'C');
    PyBuffer_Release(&strided);
    if (rc != 0) {
        PyErr_Clear();
        throw CompileError(what + " could not be copied into contiguous memory: pass np.ascontiguousarray(...)");
    }
}

HeldBytes::~HeldBytes() {
    if (held_) PyBuffer_Release(&view_);
}

std::string_view HeldBytes::bytes() const {
    if (!held_) return copy_;
    return {static_cast<const char*>(view_.buf), static_cast<size_t>(view_.len)};
}

HeldWeights::HeldWeights(const std::map<std::string, py::object>& weights) {
    for (const auto& [key, obj] : weights) {
        auto held = std::make_unique<HeldBytes>(obj, "weight file '" + key + "'");
        files_[key] = held->bytes();
        held_[key] = std::move(held);
    }
}

}  // namespace orion::bindings
