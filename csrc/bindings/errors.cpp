// Translates the core's C++ exceptions into the Python classes of orion.errors.
#include <pybind11/pybind11.h>

#include "bindings/bindings.h"
#include "errors.h"

namespace py = pybind11;

namespace orion::bindings {

namespace {
void raise(const char* cls_name, const py::object& instance_args) {
    py::object cls = py::module_::import("orion.errors").attr(cls_name);
    py::object exc = cls(*instance_args);
    PyErr_SetObject(cls.ptr(), exc.ptr());
}
}  // namespace

void bind_errors(py::module_& m) {
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const ConstraintError& e) {
            raise("ConstraintError", py::make_tuple(e.what(), e.id));
        } catch (const ParseError& e) {
            raise("ParseError", py::make_tuple(e.what(), e.line, e.column));
        } catch (const CompileError& e) {
            raise("CompileError", py::make_tuple(e.what()));
        } catch (const EvaluateError& e) {
            raise("EvaluateError", py::make_tuple(e.what()));
        } catch (const CompileBudgetExhausted& e) {
            raise("CompileBudgetExhausted", py::make_tuple(e.what()));
        }
    });
}

}  // namespace orion::bindings
