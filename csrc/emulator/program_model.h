// The compile-time model of an emulated program: one ValueInfo per MIL variable, and per op (a Step)
// its builder, the value ids it reads and the front end's type-step results. The plan step fills it
// for the whole program before the kernel step allocates (emulator.cpp); the chain finders
// (chains.h) read it to find what one fused kernel computes.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/ops.h"
#include "frontend/frontend.h"
#include "runtime/backend.h"

namespace orion::emu {

class ProgramModel {
public:
    // `cuts`: the values cut from input surfaces (frontend::InputCuts::ranges): no op computes them;
    // the program reads the ones it uses from their place in the surface (EmulatedProgram::plan_loads).
    ProgramModel(const mil::Function& fn, std::vector<frontend::TypedOp> typed, const runtime::WeightFiles& weights,
                 const std::map<std::string, runtime::InputPart>& cuts, const runtime::CompileOptions& options);

    struct Step {
        const mil::Operation* op;
        OpBuilder build;
        std::vector<int> arg_ids;
        std::vector<std::vector<int>> tuple_ids;
        int out;
        frontend::TypedOp typed;  // its output type and what its type rule derived
    };

    // The fp32 memory the kernel step and the frame will hold at most: every tensor that owns its
    // data, every const (its payload may be materialised), and the builders' scratch.
    double planned_bytes(const ValueInfo** largest) const;

    std::string name_of(const ValueInfo* v) const;

    // The value id of argument `name` of `step`, or -1.
    static int arg(const Step& step, const char* name);

    // The step computing each value, by value id.
    std::map<int, const Step*> producers() const;

    std::map<std::string, int> ids_;
    std::vector<ValueInfo> values_;
    std::vector<Step> steps_;

private:
    int define(const std::string& name, const mil::Type& type);

    double scratch_bytes_ = 0;
};

using Step = ProgramModel::Step;

}  // namespace orion::emu
