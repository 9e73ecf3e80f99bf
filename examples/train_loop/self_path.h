#pragma once

#include <string>

// The running executable's path, from /proc/self/exe (argv[0] may be relative or a bare name).
std::string executable_path();
std::string executable_directory();
