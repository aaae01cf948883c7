// A table of functions by MIL op name, built once from per-family registration lists: the front
// end's type rules and the emulator's op builders are both registered this way.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace orion::mil {

template <typename Fn>
struct Registration {
    const char* name;
    Fn fn;
};

template <typename Fn>
class NameIndex {
public:
    using Family = std::vector<Registration<Fn>> (*)();
    NameIndex(std::initializer_list<Family> families) {
        for (Family family : families)
            for (const Registration<Fn>& entry : family()) by_name_[entry.name] = entry.fn;
    }
    // The function registered under `name`, or nullptr.
    Fn find(const std::string& name) const {
        const auto it = by_name_.find(name);
        return it == by_name_.end() ? nullptr : it->second;
    }

private:
    std::map<std::string, Fn> by_name_;
};

}  // namespace orion::mil
