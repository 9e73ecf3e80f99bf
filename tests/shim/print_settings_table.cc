// Prints the README's table of settings from the configuration table:
//   build/tests/shim/print_settings_table  (paste between the settings-table markers)
#include <cstdio>

#include "watchdog/common/config.h"

int main() { std::fputs(ncclguard::OptionsMarkdownTable().c_str(), stdout); }
