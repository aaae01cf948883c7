// The emulator's profiler (ORION_PROFILE=1, or profile::set_enabled): per program and per op kind,
// calls, wall time, bytes moved and FLOPs, accumulated over every evaluate. When it is off an
// evaluate pays one relaxed atomic load.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mil/program.h"

namespace orion::emu::profile {

// What one op costs by its types: operand and result bytes at their MIL dtypes, and FLOPs
// (2 per multiply-add for conv/matmul/attention, one per output element for arithmetic, 0 for
// data movement).
struct Cost {
    double bytes = 0;
    double flops = 0;
};
using Operands = std::vector<std::pair<std::string, const mil::Type*>>;  // (argument name, type) of tensor operands
Cost op_cost(const mil::Operation& op, const Operands& operands, const mil::Type& result);

struct Row {
    std::string program;  // the program's label (its inputs, outputs and op count)
    std::string op;       // an op kind, or "(io)" for surface loads and stores
    int64_t calls = 0;
    double seconds = 0;
    double bytes = 0;
    double flops = 0;
};

bool enabled();
void set_enabled(bool on);
// Adds a program's per-kind totals of one evaluate (rows with the same program and op are summed).
void record(const std::vector<Row>& rows);
std::vector<Row> snapshot();
void reset();

}  // namespace orion::emu::profile
