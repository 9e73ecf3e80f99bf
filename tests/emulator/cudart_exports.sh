#!/usr/bin/env bash
# The emulated libcudart exports exactly what a program linked against NVIDIA's can look up:
# the same soname, every symbol under NVIDIA's version node, none that NVIDIA's lacks.
#
#   cudart_exports.sh <emulated libcudart.so.13> <NVIDIA's libcudart.so.13>
set -euo pipefail
ours=$1
real=$2
if [[ ! -e $real ]]; then
  echo "skipped: $real not found"
  exit 0
fi

soname() { readelf -d "$1" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p'; }
# "name@version" for every defined function or object in the dynamic symbol table.
exports() { readelf --dyn-syms -W "$1" | awk '$7 != "UND" && ($4 == "FUNC" || $4 == "OBJECT") && $5 != "LOCAL" {print $8}' | sort -u; }

status=0
if [[ $(soname "$ours") != "$(soname "$real")" ]]; then
  echo "soname $(soname "$ours") differs from NVIDIA's $(soname "$real")"
  status=1
fi
unknown=$(comm -23 <(exports "$ours") <(exports "$real"))
if [[ -n $unknown ]]; then
  echo "exported, but not by NVIDIA's libcudart (or not under the same version):"
  echo "$unknown"
  status=1
fi
count=$(exports "$ours" | wc -l)
if ((count < 80)); then
  echo "only $count symbols exported"
  status=1
fi
echo "$count symbols, all NVIDIA's, soname $(soname "$ours")"
exit "$status"
