// orion._core: compile / evaluate / unload, surfaces, the compile budget and the constraint ids.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "constraints.h"
#include "emulator/emulator.h"
#include "errors.h"
#include "runtime/budget.h"
#include "runtime/program.h"

namespace py = pybind11;

namespace orion::bindings {

namespace {

std::string_view bytes_view(const py::buffer& b, const char* what) {
    py::buffer_info info = b.request();
    if (info.ndim > 1 && !(info.strides.empty() || info.strides.back() == info.itemsize))
        throw CompileError(std::string(what) + " must be a contiguous buffer");
    return {static_cast<const char*>(info.ptr), static_cast<size_t>(info.size * info.itemsize)};
}

py::list specs(const std::vector<runtime::TensorSpec>& list) {
    py::list out;
    for (const auto& s : list) out.append(py::make_tuple(s.name, s.type.shape, mil::dtype_name(s.type.dtype)));
    return out;
}

runtime::Bindings bindings(const std::vector<std::pair<std::string, runtime::Surface*>>& given) {
    return runtime::Bindings(given.begin(), given.end());
}

}  // namespace

void bind_runtime(py::module_& m) {
    py::class_<runtime::Surface>(m, "Surface", py::buffer_protocol(),
                                 "A flat, 64-byte aligned byte buffer bound to a program input or output.")
        .def(py::init<size_t>(), py::arg("nbytes"))
        .def_property_readonly("nbytes", &runtime::Surface::size)
        .def_buffer([](runtime::Surface& s) {
            return py::buffer_info(s.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                                   {static_cast<py::ssize_t>(s.size())}, {1});
        });

    py::class_<runtime::LoadedProgram>(m, "LoadedProgram", "A compiled, loaded program.")
        .def_property_readonly("inputs", [](const runtime::LoadedProgram& p) { return specs(p.inputs()); },
                               "[(name, shape, dtype)] in binding (alphabetical) order")
        .def_property_readonly("outputs", [](const runtime::LoadedProgram& p) { return specs(p.outputs()); })
        .def_property_readonly("loaded", &runtime::LoadedProgram::loaded)
        .def(
            "evaluate",
            [](runtime::LoadedProgram& p, const std::vector<std::pair<std::string, runtime::Surface*>>& inputs,
               const std::vector<std::pair<std::string, runtime::Surface*>>& outputs, const runtime::LiveLanes& live) {
                const auto in = bindings(inputs), out = bindings(outputs);
                py::gil_scoped_release release;
                p.evaluate(in, out, live);
            },
            py::arg("inputs"), py::arg("outputs"), py::arg("live_lanes") = runtime::LiveLanes{},
            "Runs once; inputs/outputs are [(name, Surface)] in binding order; live_lanes: {input: lanes}.")
        .def("unload", &runtime::LoadedProgram::unload);

    m.def(
        "compile",
        [](const py::buffer& mil, const std::map<std::string, py::buffer>& weights, const std::string& profile) {
            const std::string_view text = bytes_view(mil, "the MIL text");
            runtime::WeightFiles files;
            for (const auto& [key, buf] : weights) files[key] = bytes_view(buf, ("weight file '" + key + "'").c_str());
            const runtime::Profile p = runtime::profile_from_name(profile);
            py::gil_scoped_release release;
            return emu::compile(text, files, p);
        },
        py::arg("mil"), py::arg("weights"), py::arg("profile") = "hardware",
        "Compiles and loads MIL text with its BLOBFILE weights on the emulator backend.");

    m.def("compile_count", &runtime::compile_count, "Compiles done in this process.");
    m.def("compile_budget", &runtime::compile_budget, "Compiles allowed per process (ORION_COMPILE_BUDGET).");
    m.def("min_surface_bytes", [] { return runtime::kMinSurfaceBytes; });
    m.def("constraint_ids", [] {
        py::list out;
        for (const auto& c : constraints::all()) out.append(py::make_tuple(c.id, c.title));
        return out;
    });
}

}  // namespace orion::bindings
