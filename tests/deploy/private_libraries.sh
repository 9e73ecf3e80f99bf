#!/usr/bin/env bash
# private_libraries.sh PREFIX LIBDIR BINDIR: the installed core and command need nothing beyond
# glibc, libstdc++ and libgcc that is not installed with them, and find it there; the preloaded
# front end needs nothing beyond them at all.
set -euo pipefail
prefix=$1 libdir=$2 bindir=$3
private=$(realpath --no-symlinks "$prefix/$libdir/ncclguard")
# What every node has; the private directory must hold everything else, and none of these.
system='^(ld-linux[-a-z0-9_.]*\.so\.[0-9]+|linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'

status=0
shopt -s nullglob
objects=("$prefix/$libdir/libncclguard.so" "$prefix/$libdir/libncclguard-core.so" "$prefix/$bindir/ncclguard"
  "$private"/*)

# Every dependency of every installed object, whatever this machine has: a system library or a
# private one.
for object in "${objects[@]}"; do
  [[ -L $object ]] && continue
  while read -r needed; do
    [[ $needed =~ $system || -e "$private/$needed" ]] ||
      { echo "$object needs $needed, which is neither a system library nor installed"; status=1; }
  done < <(readelf -d "$object" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
done
while read -r needed; do
  [[ $needed =~ $system ]] || { echo "libncclguard.so needs $needed, not a system library"; status=1; }
done < <(readelf -d "$prefix/$libdir/libncclguard.so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
for object in "$private"/*; do
  [[ $(basename "$object") =~ $system ]] && { echo "a system library was installed: $object"; status=1; }
done

# And ld.so loads those private copies, even though this machine has its own, and even when the
# job's library path names the system's directory first.
system_libdir=/usr/lib/$(gcc -print-multiarch 2>/dev/null || true)
for object in "$prefix/$libdir/libncclguard-core.so" "$prefix/$bindir/ncclguard"; do
  resolved=$(LD_LIBRARY_PATH=$system_libdir ldd "$object")
  while read -r name _ path _; do
    [[ $name =~ $system ]] && continue
    path=$(realpath --no-symlinks "$path")
    [[ $path == "$private"/* ]] ||
      { echo "$object: $name resolves to $path, not to $private"; status=1; }
  done < <(grep '=>' <<<"$resolved")
  if grep -q 'not found' <<<"$resolved"; then echo "$object: $resolved"; status=1; fi
done
exit $status
