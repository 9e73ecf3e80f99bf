#!/usr/bin/env bash
# Rewrites the table of settings in docs/settings.md from the configuration table
# (watchdog/common/config_table.h).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cmake --build "$build" --target print_settings_table >/dev/null
table=$("$build/tests/shim/print_settings_table")
python3 - "$table" <<'PY'
import sys, re
table = sys.argv[1] + "\n"
text = open("docs/settings.md").read()
begin, end = "<!-- settings-table-begin -->\n", "<!-- settings-table-end -->"
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open("docs/settings.md", "w").write(head + begin + table + end + tail)
PY
