// orion._core: compile / evaluate / unload, surfaces, the compile budget and the constraint ids.
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "bindings/buffers.h"
#include "constraints.h"
#include "emulator/emulator.h"
#include "emulator/profile.h"
#include "errors.h"
#include "frontend/types.h"
#include "hardware_limits.h"
#include "mil/op_table.h"
#include "mil/text.h"
#include "runtime/ane_plan.h"
#include "runtime/backend.h"
#include "runtime/budget.h"
#include "runtime/program.h"
#ifdef ORION_HAVE_ANE_CLIENT
#include "ane_client.h"
#endif

namespace py = pybind11;

namespace orion::bindings {

namespace {

py::list specs(const std::vector<runtime::TensorSpec>& list) {
    py::list out;
    for (const auto& s : list) out.append(py::make_tuple(s.name, s.type.shape, mil::dtype_name(s.type.dtype)));
    return out;
}

runtime::Bindings bindings(const std::vector<std::pair<std::string, runtime::Surface*>>& given) {
    return runtime::Bindings(given.begin(), given.end());
}

// A copy between two numpy views of one shape and dtype (a stage's shared tensor and its place in a packed
// surface, ANE-37: orion.runtime.stage), made without the GIL: the views are held for the copy's lifetime.
class ViewCopy {
public:
    ViewCopy(py::array source, py::array target) : source_(std::move(source)), target_(std::move(target)) {
        if (!source_.dtype().is(target_.dtype()) || source_.ndim() != target_.ndim() ||
            !std::equal(source_.shape(), source_.shape() + source_.ndim(), target_.shape()))
            throw std::invalid_argument("a surface copy needs two views of one shape and dtype");
        if (!target_.writeable()) throw std::invalid_argument("a surface copy's target is read-only");
        for (py::ssize_t d = 0; d < source_.ndim(); ++d) {
            if (source_.shape(d) == 1) continue;  // (its strides do not matter)
            shape_.push_back(source_.shape(d));
            from_strides_.push_back(source_.strides(d));
            to_strides_.push_back(target_.strides(d));
        }
        from_ = static_cast<const char*>(source_.data());
        to_ = static_cast<char*>(target_.mutable_data());
        itemsize_ = source_.itemsize();
    }
    void run() const { copy(0, from_, to_); }

private:
    void copy(size_t d, const char* from, char* to) const {
        if (d == shape_.size()) {
            std::memcpy(to, from, static_cast<size_t>(itemsize_));
        } else if (d + 1 == shape_.size() && from_strides_[d] == itemsize_ && to_strides_[d] == itemsize_) {
            std::memcpy(to, from, static_cast<size_t>(shape_[d] * itemsize_));  // a contiguous row
        } else {
            for (py::ssize_t i = 0; i < shape_[d]; ++i) copy(d + 1, from + i * from_strides_[d], to + i * to_strides_[d]);
        }
    }
    py::array source_, target_;
    std::vector<py::ssize_t> shape_, from_strides_, to_strides_;
    const char* from_ = nullptr;
    char* to_ = nullptr;
    py::ssize_t itemsize_ = 0;
};

// A program bound to its surfaces once (orion.runtime.program.BoundProgram): each call copies the shared
// views in, evaluates and copies views out, all without the GIL; evaluate_in_turn runs a list of them
// with no Python between programs (a decode step's layers and head).
class BoundEvaluation {
public:
    BoundEvaluation(py::object program, py::list inputs, py::list outputs, const py::list& copy_in,
                    const py::list& copy_out)
        : program_(std::move(program)), inputs_(std::move(inputs)), outputs_(std::move(outputs)) {
        native_ = program_.cast<runtime::LoadedProgram*>();
        in_ = bindings(inputs_.cast<std::vector<std::pair<std::string, runtime::Surface*>>>());
        out_ = bindings(outputs_.cast<std::vector<std::pair<std::string, runtime::Surface*>>>());
        for (const auto& pair : copy_in) before_.emplace_back(pair[py::int_(0)], pair[py::int_(1)]);
        for (const auto& pair : copy_out) after_.emplace_back(pair[py::int_(0)], pair[py::int_(1)]);
    }
    // Without the GIL.
    void run(const runtime::LiveLanes& live) {
        for (const auto& c : before_) c.run();
        native_->evaluate(in_, out_, live);
        for (const auto& c : after_) c.run();
    }

private:
    py::object program_;        // holds native_
    py::list inputs_, outputs_;  // hold the surfaces in in_ and out_
    runtime::LoadedProgram* native_ = nullptr;
    runtime::Bindings in_, out_;
    std::vector<ViewCopy> before_, after_;
};

using PyWeights = std::map<std::string, py::object>;

py::dict op_row(const mil::OpSpec& spec) {
    py::dict d;
    d["name"] = spec.name;
    d["required"] = spec.required;
    d["optional"] = spec.optional;
    d["status"] = mil::op_status_name(spec.status);
    d["constraint"] = spec.constraint ? spec.constraint->id : "";
    d["type_rule"] = frontend::has_type_rule(spec.name);
    return d;
}

// `surface_counts`: (inputs, outputs) a probe report proved (ANE-37); 0 keeps the conservative count.
runtime::CompileOptions compile_options(const std::string& profile, const std::vector<std::string>& relaxed_ops,
                                        std::pair<size_t, size_t> surface_counts) {
    runtime::CompileOptions options;
    options.profile = runtime::profile_from_name(profile);
    if (surface_counts.first) options.max_inputs = surface_counts.first;
    if (surface_counts.second) options.max_outputs = surface_counts.second;
    for (const auto& name : relaxed_ops) {
        const mil::OpSpec* spec = mil::find_op_spec(name);
        if (!spec || spec->status != mil::OpStatus::disputed) {
            std::string disputed;
            for (const auto& s : mil::op_table())
                if (s.status == mil::OpStatus::disputed) disputed += (disputed.empty() ? "" : ", ") + std::string(s.name);
            throw CompileError("relaxed_ops names '" + name + "', which is not a disputed op; only these can be relaxed: " +
                               disputed);
        }
        options.relaxed_ops.insert(name);
    }
    return options;
}

py::dict selection_dict(const runtime::Selection& s) {
    py::dict d;
    d["name"] = s.name;
    d["reason"] = s.reason;
    d["warning"] = s.warning;
    return d;
}

// Portable pieces of the ane backend, exposed for tests (tests/test_ane_plan.py).
void bind_ane_plan(py::module_& m) {
    namespace plan = runtime::ane_plan;
    m.doc() = "Decisions of the ane backend, in portable code (tested on every platform).";
    m.attr("QOS") = plan::kQoS;
    m.attr("LOAD_RETRY_DELAY_MS") = plan::kLoadRetryDelay.count();
    m.def("plan_model", [](const py::object& mil, const PyWeights& weights) {
        const HeldBytes text(mil, "the MIL text");
        const auto p = plan::plan_model(text.bytes(), HeldWeights(weights).files());
        py::list files, dict;
        for (const auto& f : p.files) files.append(py::make_tuple(f.relpath, py::bytes(f.bytes.data(), f.bytes.size())));
        for (const auto& w : p.weights) dict.append(py::make_tuple(w.key, w.offset, py::bytes(w.data.data(), w.data.size())));
        return py::make_tuple(p.dirs, files, dict);
    });
    m.def("model_dir_path", &plan::model_dir_path);
    m.def("check_patch", [](const PyWeights& w, bool unverified) { plan::check_patch(HeldWeights(w).files(), unverified); },
          py::arg("weights"), py::arg("unverified") = false);
    m.def("compile_step", [](bool has_donor, bool exists) {
        switch (plan::compile_step(has_donor, exists)) {
            case plan::CompileStep::patch: return "patch";
            case plan::CompileStep::reuse: return "reuse";
            case plan::CompileStep::compile: break;
        }
        return "compile";
    });
    m.def("objc_exception_text", [](const std::optional<std::string>& name, const std::optional<std::string>& reason) {
        return plan::objc_exception_text(name ? name->c_str() : nullptr, reason ? reason->c_str() : nullptr);
    });
    m.def("write_model_dir", [](const std::string& dir, const py::object& mil, const PyWeights& w) {
        const HeldBytes text(mil, "the MIL text");
        plan::write_model_dir(dir, plan::plan_model(text.bytes(), HeldWeights(w).files()));
    });
    m.def("patch_data", [](const PyWeights& w) {
        const std::string d = plan::patch_data(HeldWeights(w).files());
        return py::bytes(d);
    });
    m.def("write_patch_files", [](const std::string& donor, const std::string& dir, const PyWeights& w) {
        plan::write_patch_files(donor, dir, HeldWeights(w).files());
    });
    m.def("lease_model_dir", [](const std::string& dir) {
        bool fresh = false;
        auto lease = plan::lease_model_dir(dir, &fresh);
        return py::make_tuple(py::capsule(new std::shared_ptr<plan::DirLease>(lease), [](void* p) {
                                  delete static_cast<std::shared_ptr<plan::DirLease>*>(p);
                              }),
                              fresh);
    }, "A lease on dir (a capsule: the directory is removed when the last lease is garbage-collected) and whether it is new.");
    m.def("load_with_retry", [](const py::function& attempt, int delay_ms) {
        const auto outcome = plan::load_with_retry(
            [&] {
                const auto r = attempt().cast<std::pair<bool, std::string>>();
                return plan::Attempt{r.first, r.second};
            },
            std::chrono::milliseconds(delay_ms));
        return py::make_tuple(outcome.ok, outcome.attempts, outcome.error);
    }, py::arg("attempt"), py::arg("delay_ms") = plan::kLoadRetryDelay.count());
    m.def("surface_properties", [](size_t bytes) {
        const auto p = plan::surface_properties(bytes);
        py::dict d;
        d["Width"] = p.width; d["Height"] = p.height; d["BytesPerElement"] = p.bytes_per_element;
        d["BytesPerRow"] = p.bytes_per_row; d["AllocSize"] = p.alloc_size; d["PixelFormat"] = p.pixel_format;
        return d;
    });
    m.def("select_backend", [](const std::string& requested, const std::vector<std::tuple<std::string, bool, std::string>>& statuses,
                               const std::string& platform) {
        std::vector<runtime::BackendStatus> s;
        for (const auto& [name, ok, detail] : statuses) s.push_back({name, ok, detail});
        return selection_dict(runtime::select_backend(requested, s, platform));
    });
}

}  // namespace

// The emulator's profiler (orion.runtime.profile wraps it).
void bind_profile(py::module_& m) {
    namespace prof = emu::profile;
    py::module_ p = m.def_submodule("profile", "The emulator's per-program, per-op-kind profiler (ORION_PROFILE=1).");
    p.def("enabled", &prof::enabled, "Whether evaluates are being profiled.");
    p.def("set_enabled", &prof::set_enabled, py::arg("on"), "Starts or stops profiling evaluates.");
    p.def("reset", &prof::reset, "Forgets every recorded row.");
    p.def("snapshot", [] {
        py::list rows;
        for (const auto& r : prof::snapshot()) {
            py::dict d;
            d["program"] = r.program;
            d["op"] = r.op;
            d["calls"] = r.calls;
            d["seconds"] = r.seconds;
            d["bytes"] = r.bytes;
            d["flops"] = r.flops;
            rows.append(d);
        }
        return rows;
    }, "Every (program, op kind) row: calls, seconds, bytes, flops, summed over evaluates.");
}

void bind_runtime(py::module_& m) {
    bind_profile(m);
    py::class_<runtime::Surface>(m, "Surface", py::buffer_protocol(),
                                 "A flat, 64-byte aligned byte buffer bound to a program input or output "
                                 "(host memory, or an IOSurface under the ane backend).")
        .def(py::init([](size_t nbytes, const std::string& backend) {
                 const std::string name = backend.empty() ? runtime::current_selection().name : backend;
                 return std::make_unique<runtime::Surface>(nbytes, runtime::surface_allocator(name));
             }),
             py::arg("nbytes"), py::arg("backend") = "",
             "nbytes zero-filled bytes from the allocator of `backend` ('' = the selected one).")
        .def_property_readonly("nbytes", &runtime::Surface::size)
        .def_property_readonly("kind", [](const runtime::Surface& s) { return std::string(s.allocator().name); })
        .def("lock", &runtime::Surface::lock, py::arg("read_only") = false,
             "Begins CPU access (IOSurfaceLock); never hold it across an evaluate.")
        .def("unlock", &runtime::Surface::unlock)
        .def_property_readonly("locked", &runtime::Surface::locked)
        .def_buffer([](runtime::Surface& s) {
            return py::buffer_info(s.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                                   {static_cast<py::ssize_t>(s.size())}, {1});
        });

    py::class_<BoundEvaluation>(m, "BoundEvaluation", "A program bound to its surfaces (LoadedProgram.bind).")
        .def(
            "__call__",
            [](BoundEvaluation& b, const runtime::LiveLanes& live) {
                py::gil_scoped_release release;
                b.run(live);
            },
            py::arg("live_lanes") = runtime::LiveLanes{}, "Copies in, evaluates once, copies out.");
    m.def(
        "evaluate_in_turn",
        [](const std::vector<std::pair<BoundEvaluation*, runtime::LiveLanes>>& calls) {
            py::gil_scoped_release release;
            for (const auto& [call, live] : calls) call->run(live);
        },
        py::arg("calls"), "Runs [(BoundEvaluation, live_lanes)] one after another in one call (no Python between).");
    py::class_<runtime::LoadedProgram>(m, "LoadedProgram", "A compiled, loaded program.")
        .def_property_readonly("inputs", [](const runtime::LoadedProgram& p) { return specs(p.inputs()); },
                               "[(name, shape, dtype)] in binding (alphabetical) order")
        .def_property_readonly("outputs", [](const runtime::LoadedProgram& p) { return specs(p.outputs()); })
        .def_property_readonly(
            "input_parts",
            [](const runtime::LoadedProgram& p) {
                std::vector<std::tuple<std::string, std::string, int64_t, std::vector<int64_t>>> parts;
                for (const auto& part : p.input_parts())
                    parts.emplace_back(part.name, p.inputs()[part.input].name, part.offset, part.type.shape);
                return parts;
            },
            "[(name, input, element offset, shape)]: the tensors the program cuts from its input surfaces; a "
            "live-lanes hint may name them")
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
        .def(
            "bind",
            [](py::object self, py::list inputs, py::list outputs, const py::list& copy_in, const py::list& copy_out) {
                return BoundEvaluation(std::move(self), std::move(inputs), std::move(outputs), copy_in, copy_out);
            },
            py::arg("inputs"), py::arg("outputs"), py::arg("copy_in") = py::list(), py::arg("copy_out") = py::list(),
            "A callable evaluating on these surfaces (as evaluate's lists); copy_in / copy_out: [(source, target)] "
            "numpy views of one shape and dtype copied before / after each evaluate.")
        .def("unload", &runtime::LoadedProgram::unload)
        .def_property_readonly("backend", [](const runtime::LoadedProgram& p) { return std::string(p.backend()); })
        .def_property_readonly("min_surface_bytes", &runtime::LoadedProgram::min_surface_bytes)
        .def(
            "with_weights",
            [](runtime::LoadedProgram& p, const PyWeights& weights, bool unverified_patch) {
                const HeldWeights held(weights);  // held until the GIL-released work is done
                if (std::string(p.backend()) == "ane") {
                    for (const auto& [key, bytes] : held.files()) runtime::weight_file_relpath(key);  // ANE-34 first
                    runtime::ane_plan::check_patch(held.files(), unverified_patch);
                }
                py::gil_scoped_release release;
                return p.with_weights(held.files());
            },
            py::arg("weights"), py::arg("unverified_patch") = false,
            "The same MIL with new weight files, loaded without compiling. On the ane backend a program with "
            "several weight files is refused unless unverified_patch (see ane_plan::check_patch).");

    m.def(
        "compile",
        [](const py::object& mil, const PyWeights& weights, const std::string& profile, const std::string& backend,
           size_t min_surface_bytes, const std::vector<std::string>& relaxed_ops,
           std::pair<size_t, size_t> surface_counts, bool build_info,
           const std::map<std::string, std::string>& weight_keys,
           const std::map<std::string, std::string>& packed_weights) {
            const HeldBytes text(mil, "the MIL text");
            const HeldWeights held(weights);  // held until the GIL-released work is done
            runtime::CompileOptions options = compile_options(profile, relaxed_ops, surface_counts);
            for (const auto& [path, key] : weight_keys) {
                if (!held.files().count(path))
                    throw CompileError("weight_keys names '" + path + "', which is no weight file of this compile; "
                                       "give keys only for paths in weights");
                if (key.empty()) throw CompileError("weight_keys['" + path + "'] is empty; give the file's SHA-256");
            }
            options.weight_keys = weight_keys;
            options.packed_weights = packed_weights;
            const std::string name = backend.empty() ? runtime::current_selection().name : backend;
            const runtime::Backend& b = runtime::find_backend(name);
            std::unique_ptr<runtime::LoadedProgram> program;
            {
                py::gil_scoped_release release;
                // the same bytes reach either backend (docs/hardware.md §4)
                const std::string sent = build_info ? mil::with_build_info(text.bytes()) : std::string(text.bytes());
                program = b.compile(sent, held.files(), options);
            }
            if (min_surface_bytes) program->set_min_surface_bytes(min_surface_bytes);
            const std::string warning = runtime::take_budget_warning();
            if (!warning.empty() && PyErr_WarnEx(PyExc_RuntimeWarning, warning.c_str(), 1) < 0)
                throw py::error_already_set();
            return program;
        },
        py::arg("mil"), py::arg("weights"), py::arg("profile") = "hardware", py::arg("backend") = "",
        py::arg("min_surface_bytes") = 0, py::arg("relaxed_ops") = std::vector<std::string>{},
        py::arg("surface_counts") = std::pair<size_t, size_t>{0, 0}, py::arg("build_info") = true,
        py::arg("weight_keys") = std::map<std::string, std::string>{},
        py::arg("packed_weights") = std::map<std::string, std::string>{},
        "Compiles and loads MIL text with its BLOBFILE weights on `backend` ('' = the selected one). "
        "min_surface_bytes: a smaller surface minimum proved by a probe report (0 = the conservative 49,152). "
        "relaxed_ops: disputed ops (op_table() status 'disputed') a probe report proved on this machine. "
        "surface_counts: (inputs, outputs) a probe report proved (ANE-37; 0 = the conservative 1 and 6). "
        "build_info: add the default buildInfo block when the text has none (False: the text as written, "
        "for the buildInfo probe). weight_keys: per weight file path, a name its bytes alone determine (its "
        "SHA-256): the emulator shares its packed weights by it, unhashed. packed_weights: per keyed weight "
        "('<key>@<offset>/<cout>x<cin>'), a checked file of its packed panels (kernels.keyed_conv_panels' bytes) the "
        "emulator maps instead of packing. Raises RuntimeWarning once when the "
        "compile count nears the budget.");
    m.def("backend_selection", [] { return selection_dict(runtime::current_selection()); },
          "{name, reason, warning}: the backend this process uses and why (reads ORION_BACKEND).");
    m.def("backends", [] {
        py::list out;
        for (const auto& b : runtime::registered_backends()) {
            const auto s = b.probe();
            out.append(py::make_tuple(s.name, s.available, s.detail));
        }
        return out;
    }, "[(name, available, detail)] for every backend in this build.");
    m.def("ane_client_built", [] {
#ifdef ORION_HAVE_ANE_CLIENT
        return true;
#else
        return false;
#endif
    });
    m.def("ane_framework_path", [] {
#ifdef ORION_HAVE_ANE_CLIENT
        return ane::framework_path();
#else
        return std::string();
#endif
    });
    m.def(
        "_emulator_build",
        [](const py::object& mil, const PyWeights& weights, const std::string& profile,
           const std::vector<std::string>& relaxed_ops, size_t min_surface_bytes, std::pair<size_t, size_t> surface_counts) {
            const HeldBytes text(mil, "the MIL text");
            auto program = emu::build(mil::with_build_info(text.bytes()), HeldWeights(weights).files(),
                                      compile_options(profile, relaxed_ops, surface_counts));
            if (min_surface_bytes) program->set_min_surface_bytes(min_surface_bytes);
            return program;
        },
        py::arg("mil"), py::arg("weights"), py::arg("profile") = "hardware",
        py::arg("relaxed_ops") = std::vector<std::string>{}, py::arg("min_surface_bytes") = 0,
        py::arg("surface_counts") = std::pair<size_t, size_t>{0, 0},
        "Tests only: an emulator program built without counting a compile (the harness's bit-for-bit twin).");
    py::module_ plan = m.def_submodule("ane_plan");
    bind_ane_plan(plan);

    m.def("compile_count", &runtime::compile_count, "Compiles done in this process.");
    m.def("compile_budget", &runtime::compile_budget, "The compile budget: ~119 per process, or ORION_COMPILE_BUDGET.");
    m.def("compile_limit", &runtime::compile_limit,
          "Compiles allowed before refusing: the default budget less its margin (115), or ORION_COMPILE_BUDGET.");
    m.def("budget_policy", [](int budget, bool overridden) {
        const runtime::BudgetPolicy p = runtime::budget_policy(budget, overridden);
        return py::make_tuple(p.limit, p.warn_at);
    }, py::arg("budget"), py::arg("overridden"), "(limit, warn_at) for a budget (tests of the margin rule).");
    m.def("min_surface_bytes", [] { return limits::MIN_SURFACE_BYTES; });
    m.def("hardware_limits", [] {
        py::dict out;
#define ORION_EXPORT_LIMIT(name, type, value, doc) out[#name] = py::make_tuple(limits::name, doc);
        ORION_HARDWARE_LIMITS(ORION_EXPORT_LIMIT)
        ORION_INPUT_LIMITS(ORION_EXPORT_LIMIT)
#undef ORION_EXPORT_LIMIT
        return out;
    }, "name -> (value, description) of every limit in csrc/hardware_limits.h (hardware and input limits).");
    m.def("op_table", [] {
        py::list out;
        for (const auto& spec : mil::op_table()) out.append(op_row(spec));
        return out;
    }, "Every MIL op the core knows (csrc/mil/op_table.h): [{name, required, optional, status, constraint, "
          "type_rule}]; type_rule: the front end defines its type rule (csrc/frontend/types_*.cpp).");
    m.def("constraint_ids", [] {
        py::list out;
        for (const auto& c : constraints::all()) out.append(py::make_tuple(c.id, c.title));
        return out;
    });
}

}  // namespace orion::bindings
