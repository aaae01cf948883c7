// The training core's error: bad optimizer input (a tensor's shape, dtype or layout, a hyper-
// parameter). The bindings map it onto orion.train.errors.TrainError.
#pragma once

#include <stdexcept>

namespace orion::train {

struct TrainError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace orion::train
