// Prints the table of settings of docs/settings.md from the configuration table:
//   build/tests/shim/print_settings_table  (paste between the settings-table markers)
#include <cstdio>

#include "watchdog/common/config.h"

int main() { std::fputs(ncclguard::OptionsMarkdownTable().c_str(), stdout); }
