#!/usr/bin/env bash
# glibc-requirement.sh PREFIX [--check FILE...]
# Prints the newest glibc (GLIBC_x.y) and libstdc++ (GLIBCXX_x.y.z) symbol versions that the
# ncclguard installed in PREFIX needs: the preloaded front end, its core, the command and the private
# libraries beside them. Every process of a node that preloads the library needs at least these; they are set by
# the machine it was built on. With --check, fails unless each FILE names exactly these versions.
set -euo pipefail
prefix=${1:?usage: glibc-requirement.sh PREFIX [--check FILE...]}
shift

shopt -s nullglob
objects=("$prefix"/lib*/libncclguard.so "$prefix"/lib*/libncclguard-core.so "$prefix"/bin/ncclguard
  "$prefix"/lib*/ncclguard/*.so*)
if [[ ! -f ${objects[0]:-} ]]; then
  echo "glibc-requirement.sh: no libncclguard.so in $prefix/lib*" >&2
  exit 2
fi

# The versions the objects require (their version-needs sections), newest of each family.
needed=$(for object in "${objects[@]}"; do
  readelf -V --wide "$object" | sed -n '/^Version needs section/,/^$/s/.*Name: \(GLIBC[A-Z]*_[0-9.]*\).*/\1/p'
done | sort -u)
newest() { grep "^$1_" <<<"$needed" | sed "s/^$1_//" | sort -V | tail -n 1 | sed "s/^/$1_/"; }
glibc=$(newest GLIBC)
glibcxx=$(newest GLIBCXX)
echo "$glibc"
echo "$glibcxx"

[[ ${1:-} == --check ]] || exit 0
shift
status=0
for file in "$@"; do
  for required in "$glibc" "$glibcxx"; do
    family=${required%%_*}
    stated=$(grep -oE "\b${family}_[0-9]+(\.[0-9]+)+" "$file" | sort -u | tr '\n' ' ')
    if [[ $stated != "$required " ]]; then
      echo "$file states ${stated:-no $family version}; the installed tree needs $required" >&2
      status=1
    fi
  done
done
exit $status
