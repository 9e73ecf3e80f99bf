#!/usr/bin/env bash
# The static checks of ncclguard's own code (watchdog/, shim/, cli/):
#   0. size: no file over 600 lines, no function over 80 (scripts/function_sizes.py, on every file;
#      clang-tidy's readability-function-size says the same of the files it checks);
#   1. formatting: clang-format with the committed .clang-format changes nothing;
#   2. thread safety: clang's -Wthread-safety as errors on every file of the library and the
#      command, which checks every ABSL_GUARDED_BY member. The clang build (build-clang-thread,
#      scripts/configure-clang.sh; configured here when it is not there) compiles ncclguard's own
#      code with it: what that build has compiled up to date has passed, and the rest (the command,
#      the front end, or everything when it was only configured) is checked with clang
#      -fsyntax-only (scripts/compile_check.py --unbuilt: no code generated, nothing linked);
#   3. clang-tidy (.clang-tidy) on the C++ files changed since $NCCLGUARD_TIDY_BASE (default: the
#      previous commit), or on every file with --all, with that build's compile commands. A finding
#      is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
all=false
[[ "${1:-}" == "--all" ]] && all=true

own_sources() { git ls-files 'watchdog/*.cc' 'watchdog/*.h' 'shim/*.cc' 'shim/*.h' 'cli/*.cc' 'cli/*.h'; }

echo "== file and function size"
too_long=0
while read -r lines file; do
  [[ $file == total ]] && continue
  if ((lines > 600)); then
    echo "$file: $lines lines, more than 600: split it by what its parts do"
    too_long=1
  fi
done < <(own_sources | xargs wc -l)
((too_long == 0))
mapfile -t sources < <(own_sources)
python3 scripts/function_sizes.py --max 80 "${sources[@]}"

echo "== clang-format"
clang-format --dry-run -Werror "${sources[@]}"

echo "== clang's -Wthread-safety"
build=build-clang-thread
[[ -f $build/CMakeCache.txt ]] || scripts/configure-clang.sh >/dev/null
python3 scripts/compile_check.py --unbuilt --jobs "$jobs" "$build" watchdog/ shim/ cli/

echo "== clang-tidy"
tidy=$(command -v clang-tidy-19 || command -v clang-tidy)
if $all; then
  mapfile -t changed < <(own_sources | grep '\.cc$')
else
  base="${NCCLGUARD_TIDY_BASE:-HEAD~1}"
  if git rev-parse -q --verify "$base^{commit}" >/dev/null; then
    mapfile -t changed < <(git diff --name-only --diff-filter=d "$base" -- 'watchdog/*.cc' 'shim/*.cc' 'cli/*.cc')
  else
    echo "no commit $base to compare with (a shallow clone?): clang-tidy skipped; --all checks every file"
    changed=()
  fi
fi
if ((${#changed[@]} == 0)); then
  echo "no C++ source changed"
  exit 0
fi
# Findings are errors only with the clang-tidy the tree is kept clean with; an older one reports.
strict=()
[[ "$(basename "$tidy")" == clang-tidy-19 ]] || strict=(--warnings-as-errors=-*)
echo "checking ${#changed[@]} files with $tidy"
printf '%s\n' "${changed[@]}" | xargs -P "$jobs" -n 1 "$tidy" -p "$build" --quiet "${strict[@]}"
