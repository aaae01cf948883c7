// orion._core.mil: the MIL program model, its text form and BLOBFILE weight files.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <cmath>
#include <deque>
#include <set>

#include "bindings/bindings.h"
#include "bindings/buffers.h"
#include "errors.h"
#include "mil/blobfile.h"
#include "mil/program.h"
#include "mil/text.h"

namespace py = pybind11;

namespace orion::bindings {

namespace {

using namespace orion::mil;

DType dtype_named(const std::string& name) {
    auto d = dtype_from_name(name);
    if (!d) throw py::value_error("unknown dtype '" + name + "'");
    return *d;
}

const char* value_kind_name(Value::Kind k) {
    switch (k) {
        case Value::Kind::scalar: return "scalar";
        case Value::Kind::list: return "list";
        case Value::Kind::blob: return "blob";
    }
    return "";
}

const char* argument_kind_name(Argument::Kind k) {
    switch (k) {
        case Argument::Kind::ref: return "ref";
        case Argument::Kind::tuple: return "tuple";
        case Argument::Kind::literal: return "literal";
    }
    return "";
}

// Raises ValueError unless `v` can be a `dtype` literal. Non-finite floats are kept: the model may
// hold them, emit() rejects them by variable name.
void check_number(DType dtype, double v) {
    if (is_valid_number(dtype, v) || (is_float(dtype) && !std::isfinite(v))) return;
    throw py::value_error(py::repr(py::float_(v)).cast<std::string>() + " is not a valid " + dtype_name(dtype) +
                          " literal");
}

Value tensor_value(const Type& type, const char* what) {
    if (!type.is_tensor) throw py::value_error(std::string(what) + " needs a tensor type, not " + type.str());
    Value v;
    v.type = type;
    return v;
}

Function& first_function(Program& p) {
    if (p.functions.empty()) throw py::value_error("the program has no function");
    return p.functions.front();
}

// Raises ValueError unless `name` is a valid identifier not yet defined in the first function.
void check_new_variable(Program& p, const std::string& name) {
    if (!is_identifier(name)) throw py::value_error("'" + name + "' is not a valid MIL identifier");
    const Function& f = first_function(p);
    for (const auto& in : f.inputs)
        if (in.name == name) throw py::value_error("variable '" + name + "' is already defined");
    for (const auto& op : f.body)
        if (op.output == name) throw py::value_error("variable '" + name + "' is already defined");
}

void check_new_op_name(Program& p, const std::string& name) {
    if (name.empty()) throw py::value_error("op names must not be empty");
    for (const auto& op : first_function(p).body)
        if (op.name == name) throw py::value_error("op name '" + name + "' is already used");
}

std::string checked_ref(const std::string& ref) {
    if (!is_identifier(ref)) throw py::value_error("'" + ref + "' is not a valid MIL identifier");
    return ref;
}

Argument make_argument(const std::string& name, const py::handle& v) {
    if (!is_identifier(name)) throw py::value_error("'" + name + "' is not a valid argument name");
    if (py::isinstance<py::str>(v)) return Argument::reference(name, checked_ref(v.cast<std::string>()));
    if (py::isinstance<Value>(v)) return Argument::inline_literal(name, v.cast<Value>());
    std::vector<std::string> refs;
    for (auto r : v.cast<std::vector<std::string>>()) refs.push_back(checked_ref(r));
    return Argument::tuple(name, std::move(refs));
}

// A str as its UTF-8 bytes; any other object as it is (it must be a buffer).
py::object as_buffer(const py::object& text) {
    return py::isinstance<py::str>(text) ? py::object(text.attr("encode")("utf-8")) : text;
}

void bind_types(py::module_& m) {
    py::class_<Type>(m, "Type", "A MIL type: a scalar `fp16` or a tensor `tensor<fp16, [1, 768, 1, 32]>`.")
        .def_static("tensor", [](const std::string& dtype, const std::vector<int64_t>& shape) {
            for (int64_t d : shape)
                if (d < 0) throw py::value_error("negative dimension in shape");
            return Type::tensor(dtype_named(dtype), shape);
        }, py::arg("dtype"), py::arg("shape"))
        .def_static("scalar", [](const std::string& dtype) { return Type::scalar(dtype_named(dtype)); },
                    py::arg("dtype"))
        .def_property_readonly("dtype", [](const Type& t) { return dtype_name(t.dtype); })
        .def_property_readonly("is_tensor", [](const Type& t) { return t.is_tensor; })
        .def_property_readonly("shape", [](const Type& t) { return t.shape; })
        .def_property_readonly("element_count", &Type::element_count)
        .def_property_readonly("byte_size", &Type::byte_size)
        .def("__str__", &Type::str)
        .def("__repr__", [](const Type& t) { return "Type(" + t.str() + ")"; })
        .def(py::self == py::self);

    py::class_<Value>(m, "Value", "A literal: a number, a string, a list of numbers or a BLOBFILE reference.")
        .def_static("number", [](const std::string& dtype, double v) {
            DType d = dtype_named(dtype);
            check_number(d, v);
            return Value::number(d, v);
        }, py::arg("dtype"), py::arg("v"))
        .def_static("string", &Value::string, py::arg("s"))
        .def_static("list", [](const Type& type, std::vector<double> values) {
            Value v = tensor_value(type, "a list value");
            if (static_cast<int64_t>(values.size()) != type.element_count())
                throw py::value_error(std::to_string(values.size()) + " values for " + type.str());
            for (double x : values) check_number(type.dtype, x);
            return Value::list(type, std::move(values));
        }, py::arg("type"), py::arg("values"))
        .def_static("blob", [](const Type& type, const std::string& path, uint64_t offset) {
            tensor_value(type, "a BLOBFILE value");
            return Value::blob(type, path, offset);
        }, py::arg("type"), py::arg("path"), py::arg("offset") = 64)
        .def_property_readonly("kind", [](const Value& v) { return value_kind_name(v.kind); })
        .def_property_readonly("type", [](const Value& v) { return v.type; })
        .def_property_readonly("numbers", [](const Value& v) { return v.numbers; })
        .def_property_readonly("text", [](const Value& v) { return v.text; })
        .def_property_readonly("blob_path", [](const Value& v) { return v.blob_path; })
        .def_property_readonly("blob_offset", [](const Value& v) { return v.blob_offset; })
        .def(py::self == py::self)
        .def("__repr__", [](const Value& v) {
            std::string detail = v.kind == Value::Kind::blob ? py::repr(py::str(v.blob_path)).cast<std::string>() +
                                                                   ", offset=" + std::to_string(v.blob_offset)
                                 : v.type.dtype == DType::string ? py::repr(py::str(v.text)).cast<std::string>()
                                                                 : py::repr(py::cast(v.numbers)).cast<std::string>();
            return std::string("Value.") + value_kind_name(v.kind) + "(" + v.type.str() + ", " + detail + ")";
        });

    py::class_<Argument>(m, "Argument", "An op argument: a reference, a tuple of references or an inline literal.")
        .def_property_readonly("name", [](const Argument& a) { return a.name; })
        .def_property_readonly("kind", [](const Argument& a) { return argument_kind_name(a.kind); })
        .def_property_readonly("refs", [](const Argument& a) { return a.refs; })
        .def_property_readonly("literal", [](const Argument& a) -> std::optional<Value> {
            if (a.kind != Argument::Kind::literal) return std::nullopt;
            return a.literal;
        })
        .def("__repr__", [](const Argument& a) {
            return "Argument(" + a.name + ", " + argument_kind_name(a.kind) + ")";
        });

    py::class_<Operation>(m, "Operation", "One statement `TYPE output = op(args)[name=..., val=...];`.")
        .def_property_readonly("op", [](const Operation& o) { return o.op; })
        .def_property_readonly("output", [](const Operation& o) { return o.output; })
        .def_property_readonly("type", [](const Operation& o) { return o.type; })
        .def_property_readonly("args", [](const Operation& o) { return o.args; })
        .def_property_readonly("name", [](const Operation& o) { return o.name; })
        .def_property_readonly("val", [](const Operation& o) { return o.val; })
        .def_property_readonly("attributes", [](const Operation& o) { return o.attributes; },
                               "A constexpr op's parameters given as attributes: [(name, Value)].")
        .def_property_readonly("line", [](const Operation& o) { return o.loc.line; })
        .def_property_readonly("column", [](const Operation& o) { return o.loc.column; })
        .def(py::self == py::self)
        .def("__repr__", [](const Operation& o) {
            return "Operation(" + o.type.str() + " " + o.output + " = " + o.op + "(...))";
        });
}

void bind_program(py::module_& m) {
    py::class_<Program>(m, "MilProgram", "A MIL program; the builder methods act on its first function.")
        .def(py::init([](const std::string& version) {
            if (!is_version_number(version)) throw py::value_error("version must look like 1.3");
            Program p;
            p.version = version;
            p.functions.emplace_back();
            return p;
        }), py::arg("version") = "1.3")
        .def("add_input", [](Program& p, const std::string& name, const Type& type) {
            check_new_variable(p, name);
            first_function(p).inputs.push_back({name, type});
        }, py::arg("name"), py::arg("type"))
        .def("add_const", [](Program& p, const std::string& output, const Value& value,
                             const std::optional<std::string>& name) {
            check_new_variable(p, output);
            check_new_op_name(p, name.value_or(output));
            Operation op;
            op.op = "const", op.output = output, op.type = value.type, op.name = name.value_or(output), op.val = value;
            first_function(p).body.push_back(std::move(op));
        }, py::arg("output"), py::arg("value"), py::arg("name") = py::none())
        .def("add_op", [](Program& p, const std::string& op_name, const std::string& output, const Type& type,
                          const std::vector<std::pair<std::string, py::object>>& args,
                          const std::optional<std::string>& name,
                          const std::vector<std::pair<std::string, Value>>& attributes) {
            if (!is_identifier(op_name)) throw py::value_error("'" + op_name + "' is not a valid op name");
            check_new_variable(p, output);
            check_new_op_name(p, name.value_or(output));
            Operation op;
            op.op = op_name, op.output = output, op.type = type, op.name = name.value_or(output);
            std::set<std::string> arg_names;
            for (const auto& [arg_name, v] : args) {
                if (!arg_names.insert(arg_name).second) throw py::value_error("argument '" + arg_name + "' given twice");
                op.args.push_back(make_argument(arg_name, v));
            }
            if (!attributes.empty() && !is_constexpr_op(op_name))
                throw py::value_error("only constexpr_* ops take attributes; '" + op_name + "' takes arguments");
            for (const auto& [key, v] : attributes) {
                if (!is_identifier(key) || key == "name" || key == "val" || !arg_names.insert(key).second)
                    throw py::value_error("attribute '" + key + "' is reserved, invalid or given twice");
                op.attributes.emplace_back(key, v);
            }
            first_function(p).body.push_back(std::move(op));
        }, py::arg("op"), py::arg("output"), py::arg("type"), py::arg("args"), py::arg("name") = py::none(),
           py::arg("attributes") = std::vector<std::pair<std::string, Value>>{},
           "attributes: a constexpr_* op's parameters as attributes [(name, Value)] (the form coremltools writes).")
        .def_property("outputs", [](Program& p) { return first_function(p).outputs; },
                      [](Program& p, const std::vector<std::string>& outputs) {
                          for (const auto& o : outputs) checked_ref(o);
                          first_function(p).outputs = outputs;
                      })
        .def_property_readonly("inputs", [](Program& p) {
            std::vector<std::pair<std::string, Type>> inputs;
            for (const auto& in : first_function(p).inputs) inputs.emplace_back(in.name, in.type);
            return inputs;
        })
        .def_property_readonly("operations", [](Program& p) { return first_function(p).body; })
        .def_property_readonly("functions", [](const Program& p) {
            std::vector<std::string> names;
            for (const auto& f : p.functions) names.push_back(f.name);
            return names;
        })
        .def_property_readonly("version", [](const Program& p) { return p.version; })
        .def_property("build_info", [](const Program& p) { return p.build_info; },
                      [](Program& p, BuildInfo info) { p.build_info = std::move(info); })
        .def(py::self == py::self)
        .def("__repr__", [](const Program& p) {
            return "Program(" + p.version + ", " + std::to_string(p.functions.size()) + " function(s))";
        });

    m.def("emit", &emit, py::arg("program"), "The canonical MIL text of `program`.");
    m.def("parse", [](const py::object& text) {
        py::object data = as_buffer(text);
        const HeldBytes view(data, "the MIL text");
        return parse(view.bytes());
    }, py::arg("text"), "Parses MIL text (str or bytes); raises orion.ParseError with line and column.");
    m.def("with_build_info", [](const std::string& text) { return with_build_info(text); }, py::arg("text"),
          "The text with the default buildInfo block when it has none (what orion.compile sends).");
}

void bind_blobfile(py::module_& m) {
    m.def("blobfile_write", [](const py::iterable& payloads) {
        std::deque<HeldBytes> views;
        std::vector<blobfile::Payload> chunks;
        for (auto item : payloads) {
            const auto pair = item.cast<py::tuple>();
            if (pair.size() != 2 && pair.size() != 3)
                throw CompileError("blobfile_write takes (payload, data-type code[, padding bits]) tuples");
            const auto code = pair[1].cast<uint32_t>();
            if (!blobfile::is_data_type_code(code))
                throw CompileError("BLOBFILE data-type code " + std::to_string(code) + " is not fp16 (1), fp32 (2), uint8 (3), "
                                   "int8 (4), int4 (8), uint4 (11) or uint6 (13)");
            const uint32_t padding = pair.size() == 3 ? pair[2].cast<uint32_t>() : 0;
            if (padding > 7) throw CompileError("BLOBFILE padding bits must be below 8, got " + std::to_string(padding));
            chunks.push_back({views.emplace_back(pair[0], "payload " + std::to_string(chunks.size())).bytes(),
                              static_cast<blobfile::DataType>(code), padding});
        }
        // Written straight into the bytes object, without the GIL (the payloads are held): one copy of each
        const uint64_t size = blobfile::file_size(chunks);
        py::object out = py::reinterpret_steal<py::object>(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size)));
        if (!out) throw py::error_already_set();
        char* data = PyBytes_AS_STRING(out.ptr());
        {
            py::gil_scoped_release unlocked;
            blobfile::write_into(chunks, data);
        }
        return out;
    }, py::arg("payloads"), "One BLOBFILE holding every (payload, data-type code[, padding bits]) tuple, in order.");
    m.def("blobfile_chunk_offsets", &blobfile::chunk_offsets, py::arg("sizes"),
          "The MIL offsets (chunk header offsets) blobfile_write gives payloads of these sizes.");
    m.def("blobfile_read_chunk", [](const py::object& data, uint64_t offset, const std::string& what) {
        const HeldBytes view(data, what);
        blobfile::Chunk c = blobfile::read_chunk(view.bytes(), offset, what);
        return py::make_tuple(c.data_offset, c.size);
    }, py::arg("data"), py::arg("offset"), py::arg("what") = "<bytes>",
          "(data_offset, size) of the chunk whose header is at `offset`.");
}

}  // namespace

void bind_mil(py::module_& m) {
    py::module_ mil = m.def_submodule("mil", "The MIL program model, its text form and BLOBFILE weight files.");
    bind_types(mil);
    bind_program(mil);
    bind_blobfile(mil);
    // Make `import orion._core.mil` work, not only attribute access.
    py::module_::import("sys").attr("modules")[mil.attr("__name__")] = mil;
}

}  // namespace orion::bindings
