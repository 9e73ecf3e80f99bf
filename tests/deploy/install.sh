#!/usr/bin/env bash
# install.sh CMAKE BUILD PREFIX VERSION LIBDIR BINDIR DATADIR DOCDIR: installs the build into a
# fresh PREFIX, checks the layout, and that the installed command runs from there.
set -euo pipefail
cmake=$1 build=$2 prefix=$3 version=$4 libdir=$5 bindir=$6 datadir=$7 docdir=$8

rm -rf "$prefix"
"$cmake" --install "$build" --prefix "$prefix" >/dev/null

status=0
expected=(
  "$libdir/libncclguard.so"
  "$libdir/libncclguard-core.so"
  "$bindir/ncclguard"
  "$datadir/ncclguard/known-bad.json"
  "$docdir/README.md"
  "$libdir/cmake/ncclguard/ncclguardConfig.cmake"
  "$libdir/cmake/ncclguard/ncclguardConfigVersion.cmake"
  "$datadir/modulefiles/ncclguard/$version.lua"
  "$datadir/modulefiles/ncclguard/$version"
)
for doc in "$(dirname "$0")"/../../docs/*.md; do expected+=("$docdir/docs/$(basename "$doc")"); done
for file in "${expected[@]}"; do
  [[ -f "$prefix/$file" ]] || { echo "missing from the installed tree: $file"; status=1; }
done
# The installed command runs in an environment that knows nothing of the build.
if ! env -i PATH=/usr/bin:/bin "$prefix/$bindir/ncclguard" analyze --help >/dev/null; then
  echo "the installed command does not run"; status=1
fi
exit $status
