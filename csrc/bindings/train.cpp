// orion._core.train: AdamW, the global gradient norm, the fp16-range clamp, the loss-scale undo, the head's fp32
// products and its cross-entropy on numpy float32 arrays, in place. Every array is checked (dtype, shape,
// C-contiguity, writability) before any is touched.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "emulator/kernels.h"
#include "hardware_limits.h"
#include "train/adamw.h"
#include "train/cross_entropy.h"
#include "train/tensor_stats.h"
#include "train/train_error.h"

namespace py = pybind11;

namespace orion::bindings {

namespace {

// Checks that `a` (the `role` of tensor `name`) is a C-contiguous float32 array, writable if asked,
// with the shape of `like` if given.
void check_array(const py::handle& obj, const std::string& name, const char* role, bool writable,
                 const py::array* like = nullptr) {
    const std::string where = std::string(role) + " of '" + name + "'";
    if (!py::isinstance<py::array>(obj))
        throw train::TrainError(where + " is a " + std::string(py::str(py::type::handle_of(obj).attr("__name__"))) +
                                ", not a numpy array; pass a float32 numpy array");
    const auto a = py::reinterpret_borrow<py::array>(obj);
    if (!a.dtype().is(py::dtype::of<float>()))
        throw train::TrainError(where + " has dtype " + std::string(py::str(a.dtype())) +
                                "; it must be float32 (use .astype(np.float32))");
    if (!(a.flags() & py::array::c_style))
        throw train::TrainError(where + " is not C-contiguous; pass np.ascontiguousarray(...) of it");
    if (writable && !a.writeable())
        throw train::TrainError(where + " is read-only; it is updated in place, so pass a writable array");
    if (like && !(a.ndim() == like->ndim() && std::equal(a.shape(), a.shape() + a.ndim(), like->shape())))
        throw train::TrainError(where + " has shape " + shape_text(a) + ", the parameter has " +
                                shape_text(*like) + "; they must match");
}

float* mutable_floats(const py::handle& obj) {
    return static_cast<float*>(py::reinterpret_borrow<py::array>(obj).mutable_data());
}

const float* floats(const py::handle& obj) {
    return static_cast<const float*>(py::reinterpret_borrow<py::array>(obj).data());
}

int64_t adamw_step(const std::vector<std::string>& names, const py::list& params, const py::list& grads,
                   const py::list& exp_avgs, const py::list& exp_avg_sqs, const std::vector<bool>& decay, double lr,
                   double beta1, double beta2, double eps, double weight_decay, int64_t step, double grad_scale,
                   const py::list& halves) {
    const size_t n = names.size();
    if (params.size() != n || grads.size() != n || exp_avgs.size() != n || exp_avg_sqs.size() != n ||
        decay.size() != n || halves.size() != n)
        throw train::TrainError("adamw_step: names, params, grads, exp_avgs, exp_avg_sqs, decay and halves must have "
                                "the same length (" + std::to_string(n) + " names)");
    train::AdamWHyper h{lr, beta1, beta2, eps, weight_decay, step, grad_scale};
    train::check_hyper(h);
    std::vector<train::AdamWTensor> tensors;
    for (size_t i = 0; i < n; ++i) {
        check_array(params[i], names[i], "parameter", true);
        const auto param = py::reinterpret_borrow<py::array>(params[i]);
        check_array(grads[i], names[i], "gradient", false, &param);
        check_array(exp_avgs[i], names[i], "exp_avg (AdamW m)", true, &param);
        check_array(exp_avg_sqs[i], names[i], "exp_avg_sq (AdamW v)", true, &param);
        uint16_t* half = nullptr;
        if (!halves[i].is_none()) {
            const std::string where = "fp16 copy of '" + names[i] + "'";
            if (!py::isinstance<py::array>(halves[i]))
                throw train::TrainError(where + " is not a numpy array; pass a float16 array or None");
            auto a = py::reinterpret_borrow<py::array>(halves[i]);
            if (!a.dtype().equal(py::dtype("float16")) || !(a.flags() & py::array::c_style) || !a.writeable() ||
                a.size() != param.size())
                throw train::TrainError(where + " must be a writable C-contiguous float16 array of the parameter's " +
                                        std::to_string(param.size()) + " values; it has dtype " +
                                        std::string(py::str(a.dtype())) + " and " + std::to_string(a.size()));
            half = static_cast<uint16_t*>(a.mutable_data());
        }
        tensors.push_back({mutable_floats(params[i]), floats(grads[i]), mutable_floats(exp_avgs[i]),
                           mutable_floats(exp_avg_sqs[i]), static_cast<int64_t>(param.size()), decay[i], half});
    }
    py::gil_scoped_release release;
    return train::adamw_step(tensors, h);
}

py::tuple sum_of_squares(const std::vector<std::string>& names, const py::list& arrays) {
    if (arrays.size() != names.size())
        throw train::TrainError("sum_of_squares: " + std::to_string(names.size()) + " names for " +
                                std::to_string(arrays.size()) + " arrays");
    std::vector<train::FloatSpan> spans;
    for (size_t i = 0; i < names.size(); ++i) {
        check_array(arrays[i], names[i], "gradient", false);
        spans.push_back({floats(arrays[i]), static_cast<int64_t>(py::reinterpret_borrow<py::array>(arrays[i]).size())});
    }
    train::SquaresAndNonfinite r;
    {
        py::gil_scoped_release release;
        r = train::sum_of_squares(spans);
    }
    return py::make_tuple(r.sum_of_squares, r.nonfinite);
}

py::tuple clamp_fp16(const std::string& name, const py::handle& array) {
    check_array(array, name, "tensor", true);
    const auto a = py::reinterpret_borrow<py::array>(array);
    train::ClampCounts r;
    {
        py::gil_scoped_release release;
        r = train::clamp_finite(mutable_floats(array), static_cast<int64_t>(a.size()),
                                static_cast<float>(limits::FP16_MAX));
    }
    return py::make_tuple(r.clamped, r.nonfinite);
}

int64_t unscale(const std::string& name, const py::array& src, const py::handle& out, double divisor, bool add) {
    const bool half = src.dtype().equal(py::dtype("float16"));
    if (!half && !src.dtype().is(py::dtype::of<float>()))
        throw train::TrainError("unscale: gradient '" + name + "' has dtype " + std::string(py::str(src.dtype())) +
                                "; it must be float16 or float32");
    if (!(src.flags() & py::array::c_style))
        throw train::TrainError("unscale: gradient '" + name + "' is not C-contiguous; pass np.ascontiguousarray(...)");
    check_array(out, name, "unscaled gradient", true);
    if (py::reinterpret_borrow<py::array>(out).size() != src.size())
        throw train::TrainError("unscale: '" + name + "' has " + std::to_string(src.size()) + " values but out has " +
                                std::to_string(py::reinterpret_borrow<py::array>(out).size()) + "; pass one of each size");
    if (!(divisor > 0) || !std::isfinite(divisor))
        throw train::TrainError("unscale: divisor=" + std::to_string(divisor) + " must be finite and > 0");
    float* dst = mutable_floats(out);
    const void* data = src.data();
    const int64_t size = static_cast<int64_t>(src.size());
    py::gil_scoped_release release;
    return train::unscale(data, half, dst, size, static_cast<float>(divisor), add);
}

// A 2-D float32 operand of matmul: `role` (a or b) with element strides (rows, columns) of op(x).
struct Operand {
    const float* data;
    int64_t rows, cols, row_stride, col_stride;
};

Operand operand(const py::handle& obj, const char* role, bool transpose) {
    const std::string where = std::string("matmul: ") + role;
    if (!py::isinstance<py::array>(obj))
        throw train::TrainError(where + " is not a numpy array; pass a 2-D float32 array");
    const auto a = py::reinterpret_borrow<py::array>(obj);
    if (!a.dtype().is(py::dtype::of<float>()) || a.ndim() != 2)
        throw train::TrainError(where + " is " + std::string(py::str(a.dtype())) + " of shape " + shape_text(a) +
                                "; it must be a 2-D float32 array");
    const py::ssize_t item = static_cast<py::ssize_t>(sizeof(float));
    if (a.strides(0) % item != 0 || a.strides(1) % item != 0)
        throw train::TrainError(where + " has strides that are not whole floats; pass np.ascontiguousarray(...) of it");
    const int r = transpose ? 1 : 0, c = 1 - r;
    return {static_cast<const float*>(a.data()), a.shape(r), a.shape(c), a.strides(r) / item, a.strides(c) / item};
}

// out = op(a) @ op(b) in float32 (fp32 multiply-adds, no rounding) on the emulator's gemm and threads: the CPU
// head's products without numpy's BLAS, whose worker threads spin on after each call and take a core from
// the programs that follow.
void matmul(const py::handle& a_obj, const py::handle& b_obj, const py::handle& out, bool transpose_a,
            bool transpose_b) {
    const Operand a = operand(a_obj, "a", transpose_a), b = operand(b_obj, "b", transpose_b);
    if (a.cols != b.rows)
        throw train::TrainError("matmul: op(a) is [" + std::to_string(a.rows) + ", " + std::to_string(a.cols) +
                                "] and op(b) [" + std::to_string(b.rows) + ", " + std::to_string(b.cols) +
                                "]; the inner sizes must match");
    check_array(out, "matmul", "out", true);
    const auto o = py::reinterpret_borrow<py::array>(out);
    if (o.ndim() != 2 || o.shape(0) != a.rows || o.shape(1) != b.cols)
        throw train::TrainError("matmul: out has shape " + shape_text(o) + ", the product is (" +
                                std::to_string(a.rows) + ", " + std::to_string(b.cols) + "); pass an array of that shape");
    float* c = mutable_floats(out);
    py::gil_scoped_release release;
    emu::kernels::gemm(a.rows, b.cols, a.cols, a.data, a.row_stride, a.col_stride, b.data, b.row_stride, b.col_stride,
                       c, b.cols, false);
}

// The mean cross-entropy of logits [S, V] against targets [S] (int64), logits overwritten with its gradient.
double cross_entropy(const py::handle& logits, const py::array& targets) {
    check_array(logits, "cross_entropy", "logits", true);
    const auto l = py::reinterpret_borrow<py::array>(logits);
    if (l.ndim() != 2)
        throw train::TrainError("cross_entropy: logits have shape " + shape_text(l) + "; pass a 2-D [positions, "
                                "vocabulary] array");
    if (!targets.dtype().is(py::dtype::of<int64_t>()) || targets.ndim() != 1 || targets.shape(0) != l.shape(0) ||
        !(targets.flags() & py::array::c_style))
        throw train::TrainError("cross_entropy: targets are " + std::string(py::str(targets.dtype())) + " of shape " +
                                shape_text(targets) + "; pass a C-contiguous int64 array of the logits' " +
                                std::to_string(l.shape(0)) + " positions");
    float* data = mutable_floats(logits);
    const auto* t = static_cast<const int64_t*>(targets.data());
    py::gil_scoped_release release;
    return train::cross_entropy(data, l.shape(0), l.shape(1), t);
}

}  // namespace

void bind_train(py::module_& root) {
    py::module_ m = root.def_submodule("train", "AdamW, gradient norm and fp16-range clamp (orion.train wraps these).");
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const train::TrainError& e) {
            py::object cls = py::module_::import("orion.train.errors").attr("TrainError");
            PyErr_SetObject(cls.ptr(), cls(e.what()).ptr());
        }
    });
    m.def("adamw_step", &adamw_step, py::arg("names"), py::arg("params"), py::arg("grads"), py::arg("exp_avgs"),
          py::arg("exp_avg_sqs"), py::arg("decay"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
          py::arg("weight_decay"), py::arg("step"), py::arg("grad_scale"), py::arg("halves"),
          "One AdamW update of every tensor, in place (gradients read as grad * grad_scale); where halves[i] is a "
          "float16 array, the updated parameter clamped to +-FP16_MAX (finite values) and rounded to fp16 is written "
          "there in the same pass. Returns the count of values clamped.");
    m.def("sum_of_squares", &sum_of_squares, py::arg("names"), py::arg("arrays"),
          "(sum of squares of the finite values, count of NaN/Inf values) over all arrays, in one pass.");
    m.def("clamp_fp16", &clamp_fp16, py::arg("name"), py::arg("array"),
          "Clamps finite values to +-FP16_MAX in place; returns (clamped, nonfinite). NaN/Inf are left as they are.");
    m.def("unscale", &unscale, py::arg("name"), py::arg("src"), py::arg("out"), py::arg("divisor"),
          py::arg("add") = false,
          "out = src / divisor in float32 (src float16 or float32, out float32 of its size, as np.divide(src, divisor, "
          "dtype=np.float32)); with add=True, out += that quotient. Returns the count of NaN/Inf quotients.");
    m.def("matmul", &matmul, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("transpose_a") = false,
          py::arg("transpose_b") = false,
          "out = op(a) @ op(b) in float32 on the emulator's gemm (op transposes if asked; a and b any 2-D float32 "
          "arrays with whole-float strides, out float32 C-contiguous of the product's shape, written whole).");
    m.def("cross_entropy", &cross_entropy, py::arg("logits"), py::arg("targets"),
          "Mean cross-entropy of logits (float32 [S, V], C-contiguous) against targets (int64 [S]; negative: "
          "ignored), in one parallel pass that overwrites logits with its gradient (softmax / kept rows, minus "
          "1 / kept at each target, 0 on ignored rows). Returns the loss.");
}

}  // namespace orion::bindings
