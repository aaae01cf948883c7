#include "bindings/bindings.h"

PYBIND11_MODULE(_core, m) {
    m.doc() = "Orion's native core: the MIL format, the software ANE and the runtime.";
    orion::bindings::bind_errors(m);
    orion::bindings::bind_mil(m);
    orion::bindings::bind_kernels(m);
    orion::bindings::bind_runtime(m);
    orion::bindings::bind_train(m);
}
