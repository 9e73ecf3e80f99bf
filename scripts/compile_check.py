#!/usr/bin/env python3
"""Runs the compiler's checks, without generating code, on the files of a build's database.

    scripts/compile_check.py [--jobs N] BUILD_DIR PREFIX...

Runs each command of BUILD_DIR/compile_commands.json whose source file is under one of the
PREFIXes (relative to the source tree, e.g. `watchdog/`) again with `-fsyntax-only` and no output
file: its diagnostics, and its errors (-Werror=...), without code generation or linking. A file
compiled for several targets is checked with each target's command. Prints the diagnostics of each
file that has some; exits 1 if a command failed, 2 if no file matched.

With --unbuilt, a command whose object file the build has made and that is newer than everything
it was made from (its source and headers, from the compiler's dependency file beside it, and the
target's flags.make) is skipped: that compile ran these very checks, and passed.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import subprocess
import sys


def syntax_only(command):
    """The compile command as a list, without its output file, with -fsyntax-only."""
    args = shlex.split(command)
    out = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        elif arg.startswith("-o") and len(arg) > 2:
            pass
        else:
            out.append(arg)
    return out[:1] + ["-fsyntax-only"] + out[1:]


def object_file(entry):
    """The path of the object file that the entry's command writes, or None."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    for i, arg in enumerate(args):
        if arg == "-o" and i + 1 < len(args):
            return os.path.join(entry["directory"], args[i + 1])
        if arg.startswith("-o") and len(arg) > 2:
            return os.path.join(entry["directory"], arg[2:])
    return None


def made_from(entry, obj):
    """What the object was made from: its dependency file's list and the target's flags.make, or
    None when there is no dependency file."""
    try:
        with open(obj + ".d", encoding="utf-8") as f:
            text = f.read().replace("\\\n", " ")
    except OSError:
        return None
    _, _, deps = text.partition(": ")
    paths = [os.path.join(entry["directory"], d) for d in re.split(r"(?<!\\)\s+", deps) if d]
    target_dir = obj[:obj.find(".dir/") + 4] if ".dir/" in obj else None
    if target_dir:
        paths.append(os.path.join(target_dir, "flags.make"))
    return paths


def up_to_date(entry):
    """Whether the build made the entry's object from what is there now."""
    obj = object_file(entry)
    if obj is None or not os.path.exists(obj):
        return False
    deps = made_from(entry, obj)
    if not deps:
        return False
    made = os.path.getmtime(obj)
    try:
        return all(os.path.getmtime(d) <= made for d in deps)
    except OSError:  # a file it was made from is gone
        return False


def check(entry):
    """Runs one entry; returns (file, exit status, diagnostics)."""
    args = entry["arguments"] if "arguments" in entry else None
    command = syntax_only(shlex.join(args) if args else entry["command"])
    done = subprocess.run(command, cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], done.returncode, done.stdout + done.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--unbuilt", action="store_true",
                        help="skip the commands whose object file the build has made up to date")
    parser.add_argument("build_dir")
    parser.add_argument("prefixes", nargs="+")
    options = parser.parse_args()

    with open(os.path.join(options.build_dir, "compile_commands.json"), encoding="utf-8") as f:
        entries = json.load(f)
    source_dir = os.path.dirname(os.path.abspath(__file__)) + "/../"
    source_dir = os.path.normpath(source_dir) + "/"
    chosen = [
        e for e in entries
        if any(os.path.normpath(e["file"]).startswith(source_dir + p) for p in options.prefixes)
    ]
    if not chosen:
        print(f"no file under {' '.join(options.prefixes)} in {options.build_dir}", file=sys.stderr)
        return 2
    built = [e for e in chosen if options.unbuilt and up_to_date(e)]
    chosen = [e for e in chosen if e not in built]
    if built:
        print(f"{len(built)} compile commands skipped: the build has made their object files")
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=options.jobs) as pool:
        for file, status, diagnostics in pool.map(check, chosen):
            if diagnostics:
                print(diagnostics, end="")
            if status != 0:
                print(f"{file}: failed (exit status {status})", file=sys.stderr)
                failed += 1
    print(f"checked {len(chosen)} compile commands, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
