#!/usr/bin/env bash
# Rewrites the README's table of settings from the configuration table (watchdog/config_table.h).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake --build "$build" --target print_settings_table >/dev/null
table=$("$build/tests/shim/print_settings_table")
python3 - "$table" <<'PY'
import sys, re
table = sys.argv[1] + "\n"
text = open("README.md").read()
begin, end = "<!-- settings-table-begin -->\n", "<!-- settings-table-end -->"
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open("README.md", "w").write(head + begin + table + end + tail)
PY
