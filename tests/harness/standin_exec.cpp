#include "standin_exec.h"

#include <exception>
#include <memory>

#include "emulator/emulator.h"

namespace standin {

struct Program {
    std::unique_ptr<orion::runtime::LoadedProgram> program;
};

Program* build(std::string_view mil, const std::vector<std::pair<std::string, std::string>>& weights, std::string* error) {
    try {
        orion::runtime::WeightFiles files;
        for (const auto& [key, bytes] : weights) files[key] = bytes;
        auto p = std::make_unique<Program>();
        orion::runtime::CompileOptions options;
        options.profile = orion::runtime::Profile::permissive;
        p->program = orion::emu::build(mil, files, options);
        p->program->set_min_surface_bytes(0);
        return p.release();
    } catch (const std::exception& e) {
        *error = e.what();
        return nullptr;
    }
}

void destroy(Program* program) { delete program; }
size_t input_count(const Program* p) { return p->program->inputs().size(); }
size_t output_count(const Program* p) { return p->program->outputs().size(); }

std::string evaluate(Program* p, const std::vector<std::pair<uint8_t*, size_t>>& inputs,
                     const std::vector<std::pair<uint8_t*, size_t>>& outputs) {
    try {
        std::vector<std::unique_ptr<orion::runtime::Surface>> views;
        orion::runtime::Bindings in, out;
        for (size_t i = 0; i < inputs.size(); ++i) {
            views.push_back(orion::runtime::Surface::view(inputs[i].first, inputs[i].second));
            in.emplace_back(p->program->inputs()[i].name, views.back().get());
        }
        for (size_t i = 0; i < outputs.size(); ++i) {
            views.push_back(orion::runtime::Surface::view(outputs[i].first, outputs[i].second));
            out.emplace_back(p->program->outputs()[i].name, views.back().get());
        }
        p->program->evaluate(in, out);
        return "";
    } catch (const std::exception& e) {
        return e.what();
    }
}

}  // namespace standin
