#include "bindings/bindings.h"

namespace orion::bindings {

void bind_kernels(pybind11::module_& m) {}  // filled in by its owner

}  // namespace orion::bindings
