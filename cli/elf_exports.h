// Whether a file is an ELF shared object that defines a given dynamic symbol, read from the file
// alone: nothing of it is loaded or run.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace ncclguard {

// OK when `path` is a 64-bit ELF shared object whose dynamic symbol table defines `symbol`;
// otherwise an error that says what it is not.
absl::Status CheckExportsSymbol(const std::string& path, const std::string& symbol);

}  // namespace ncclguard
