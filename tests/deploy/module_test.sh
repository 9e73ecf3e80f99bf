#!/usr/bin/env bash
# module_test.sh KIND CHECK PREFIX BUILD MODULES LIBDIR BINDIR VERSION
# The installed modulefile of KIND (lua or tcl) under the real Lmod, in a clean bash, on a copy of
# the installed tree PREFIX (so the modulefile must find the tree it lies in); MODULES, LIBDIR
# and BINDIR are relative to it. CHECK is one of
#   job      a train_loop job on the emulator with a hung AllReduce is watched, and dumps appear in
#            the directory the module names; with the kill switch it is not;
#   restore  `module unload` restores the environment exactly, whatever was set before loading;
#   plain    programs that do not use NCCL behave exactly as without the module;
#   help     help and whatis text; another NCCL interposer's module replaces this one;
#   outside  a modulefile copied out of its tree uses the prefix it was installed to.
# Exits 77 (skipped) when Lmod is not installed.
set -euo pipefail
kind=$1 check=$2 prefix=$3 build=$4 modules=$5 libdir=$6 bindir=$7 version=$8

lmod_init=""
for candidate in ${LMOD_PKG:+"$LMOD_PKG/init/bash"} /usr/share/lmod/lmod/init/bash; do
  if [[ -f $candidate ]]; then lmod_init=$candidate; break; fi
done
if [[ -z $lmod_init ]]; then
  echo "skipped: Lmod is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/home" "$work/tmp"
if [[ $check == outside ]]; then
  tree=$prefix
  mkdir -p "$work/modulefiles/ncclguard"
  cp "$prefix/$modules/ncclguard/$version" "$prefix/$modules/ncclguard/$version.lua" "$work/modulefiles/ncclguard/"
  modulepath=$work/modulefiles
else
  tree=$work/tree
  cp -a "$prefix" "$tree"
  modulepath=$tree/$modules
fi
modulefile=$modulepath/ncclguard/$version.lua
# Lmod prefers the Lua modulefile; without it, it reads the Tcl one.
if [[ $kind == tcl ]]; then
  rm "$modulefile"
  modulefile=$modulepath/ncclguard/$version
fi

# Helpers for the checks, which run in a bash that has read no profile, with Lmod initialised.
cat >"$work/prelude.sh" <<'EOF'
source "$LMOD_INIT" >/dev/null
module use "$MODULE_DIRECTORY"
status=0
fail() { echo "FAIL: $*"; status=1; }
expect() { [[ $2 == "$3" ]] || fail "$1 is '$2', expected '$3'"; }
load() {
  module load ncclguard || fail "module load ncclguard failed"
  expect "the loaded modulefile" "${_LMFILES_:-}" "$MODULEFILE"
}
EOF

case $check in
job) cat >"$work/check.sh" <<'EOF'
export SCRATCH=$WORK/scratch  # the module prefers scratch to home for job directories
load
expect NCCLGUARD_DUMP_DIR "$NCCLGUARD_DUMP_DIR" "$SCRATCH/ncclguard"
job() {
  LD_LIBRARY_PATH=$BUILD/emulator/lib NCCLEMU_FAULTS=hang:rank=1,seq=5 NCCLGUARD_TIMEOUT=1 \
    NCCLGUARD_ACTION=exit NCCLGUARD_JOB_ID=$1 "$BUILD/examples/train_loop" --ranks 2 --steps 30 "${@:2}"
}
job module-job --timeout 30 >"$WORK/job.out" 2>"$WORK/job.err"
grep -q "rank 1 failed: exit code 75" "$WORK/job.out" || fail "the hung rank did not exit with code 75"
python3 - "$SCRATCH/ncclguard/module-job" <<'PYTHON' || fail "no stall dump of every rank"
import json, pathlib, sys
dumps = [json.loads(path.read_text()) for path in pathlib.Path(sys.argv[1]).glob("dump-*.json")]
ranks = sorted(dump["rank"] for dump in dumps if dump["reason"] == "stall")
sys.exit(0 if ranks == [0, 1] else f"stall dumps of ranks {ranks} in {sys.argv[1]}")
PYTHON
# The kill switch: the same hang, unwatched until the launcher gives up on it.
NCCLGUARD_DISABLE=1 job disabled-job --timeout 3 >"$WORK/disabled.out" 2>"$WORK/disabled.err"
grep -q "ranks not finished: 0,1" "$WORK/disabled.out" || fail "the hang did not last until the launcher's timeout"
[[ ! -e $SCRATCH/ncclguard/disabled-job ]] || fail "NCCLGUARD_DISABLE=1 left a job directory"
! grep -q ncclguard "$WORK/disabled.err" || fail "NCCLGUARD_DISABLE=1 still logged: $(cat "$WORK/disabled.err")"
if ((status)); then tail -n 20 "$WORK"/*.out "$WORK"/*.err; fi
EOF
;;
restore) cat >"$work/check.sh" <<'EOF'
# Lmod's own records are its business: the table of what is loaded, and the reference counts of
# the entries of every path variable that a module has touched, which it keeps after unloading.
environment() { env | LC_ALL=C sort | grep -Ev '^(_ModuleTable[0-9]+_|__LMOD_REF_COUNT_[A-Z_]+)=' || true; }
library=$TREE/$LIBDIR/libncclguard.so
scenario() {  # preloaded dump_dir [VARIABLE=VALUE...]: what the module should give, what was set
  local preloaded=$1 dump_dir=$2 before after
  shift 2
  (($#)) && export "$@"
  before=$(environment)
  load
  expect LD_PRELOAD "$LD_PRELOAD" "$preloaded"
  expect NCCLGUARD_DUMP_DIR "$NCCLGUARD_DUMP_DIR" "$dump_dir"
  expect "the command" "$(command -v ncclguard)" "$TREE/$BINDIR/ncclguard"
  module unload ncclguard || fail "module unload ncclguard failed"
  after=$(environment)
  [[ $before == "$after" ]] || fail "after unloading, with $*: $(diff <(echo "$before") <(echo "$after"))"
  (($#)) && unset "${@%%=*}"
}
scenario "$library" "$HOME/ncclguard"
scenario "$library:libm.so.6" "$HOME/ncclguard" LD_PRELOAD=libm.so.6
scenario "$library" /shared/jobs NCCLGUARD_DUMP_DIR=/shared/jobs
scenario "$library:libm.so.6 libdl.so.2" /shared/jobs "LD_PRELOAD=libm.so.6 libdl.so.2" \
    NCCLGUARD_DUMP_DIR=/shared/jobs SCRATCH=/scratch
scenario "$library" /scratch/ncclguard SCRATCH=/scratch
EOF
;;
plain) cat >"$work/check.sh" <<'EOF'
programs=("ls -l $TREE" "ls $WORK/absent" "python3 -c 'import sys; print(sum(range(10))); sys.exit(3)'"
          "sh -c 'cat /etc/hostname; kill -TERM \$\$'")
run_all() {  # tag: runs every program, keeping its output, error output and exit status
  for index in "${!programs[@]}"; do
    bash -c "${programs[index]}" >"$WORK/$1.$index.out" 2>"$WORK/$1.$index.err"
    echo $? >"$WORK/$1.$index.status"
  done
}
run_all without
load
run_all with
for index in "${!programs[@]}"; do
  for part in out err status; do
    cmp -s "$WORK/without.$index.$part" "$WORK/with.$index.$part" ||
      fail "${programs[index]}: its $part differs under the module: $(diff "$WORK/without.$index.$part" "$WORK/with.$index.$part")"
  done
done
# They did run with ncclguard loaded, and it created nothing.
grep -q "/libncclguard.so$" /proc/self/maps || fail "libncclguard.so is not in a process started under the module"
[[ ! -e $NCCLGUARD_DUMP_DIR ]] || fail "a program that does not use NCCL created $NCCLGUARD_DUMP_DIR"
[[ -z $(ls -A "$TMPDIR") ]] || fail "a program that does not use NCCL created $(ls -A "$TMPDIR") in \$TMPDIR"
EOF
;;
help) cat >"$work/check.sh" <<'EOF'
help=$(module help ncclguard 2>&1)
for text in NCCLGUARD_DISABLE=1 "NCCLGUARD_DUMP_DIR=$HOME/ncclguard" "ncclguard analyze $HOME/ncclguard/<job id>"; do
  [[ $help == *"$text"* ]] || fail "the help does not say '$text': $help"
done
[[ $help == *"Documentation: $TREE/"*"/README.md"* ]] || fail "the help does not name the installed README: $help"
whatis=$(module whatis ncclguard 2>&1)
[[ $whatis == *"Version: $VERSION"* ]] || fail "whatis does not give the version: $whatis"
# Another module of the same family: Lmod swaps ncclguard out when it is loaded.
mkdir -p "$WORK/other/other_interposer"
echo 'family("nccl_interposer") prepend_path("LD_PRELOAD", "/opt/other/libother.so")' >"$WORK/other/other_interposer/1.0.lua"
module use "$WORK/other"
load
module load other_interposer 2>/dev/null || fail "the other interposer's module did not load"
expect "the loaded modules" "$LOADEDMODULES" other_interposer/1.0
expect LD_PRELOAD "$LD_PRELOAD" /opt/other/libother.so
EOF
;;
outside) cat >"$work/check.sh" <<'EOF'
load
expect LD_PRELOAD "$LD_PRELOAD" "$TREE/$LIBDIR/libncclguard.so"
expect "the command" "$(command -v ncclguard)" "$TREE/$BINDIR/ncclguard"
EOF
;;
*) echo "unknown check $check"; exit 2 ;;
esac

echo 'exit $status' >>"$work/check.sh"
env -i HOME="$work/home" USER="$(id -un)" PATH=/usr/local/bin:/usr/bin:/bin TMPDIR="$work/tmp" \
  LMOD_INIT="$lmod_init" MODULE_DIRECTORY="$modulepath" MODULEFILE="$modulefile" TREE="$tree" BUILD="$build" \
  WORK="$work" LIBDIR="$libdir" BINDIR="$bindir" VERSION="$version" \
  bash --noprofile --norc -c 'source "$WORK/prelude.sh" && source "$WORK/check.sh"'
