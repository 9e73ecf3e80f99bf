#!/usr/bin/env python3
"""Runs the compiler's checks, without generating code, on the files of a build's database.

    scripts/compile_check.py [--jobs N] BUILD_DIR PREFIX...

Runs each command of BUILD_DIR/compile_commands.json whose source file is under one of the
PREFIXes (relative to the source tree, e.g. `watchdog/`) again with `-fsyntax-only` and no output
file: its diagnostics, and its errors (-Werror=...), without code generation or linking. A file
compiled for several targets is checked with each target's command. Prints the diagnostics of each
file that has some; exits 1 if a command failed, 2 if no file matched.
"""
import argparse
import concurrent.futures
import json
import os
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


def check(entry):
    """Runs one entry; returns (file, exit status, diagnostics)."""
    args = entry["arguments"] if "arguments" in entry else None
    command = syntax_only(shlex.join(args) if args else entry["command"])
    done = subprocess.run(command, cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], done.returncode, done.stdout + done.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
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
