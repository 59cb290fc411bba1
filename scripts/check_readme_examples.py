#!/usr/bin/python3
"""Reruns the README's CLI examples and reports where their printed output no longer matches.

Every fenced block whose first line starts with "$ hbmsim" is one example: the command (with its "\\"
continuation lines) and the output printed under it. The command is run with the given binary; each printed
line is compared with the same line of today's output, number by number, within a relative tolerance. Lines
that hold wall-clock times ("(67.7 s)", "in 68 s") vary from run to run and are compared as text without their
numbers. A sweep's example shows columns picked from its CSV and is skipped. Prints one report per example and exits 1 if any differs.

    /usr/bin/python3 scripts/check_readme_examples.py [build/cli/hbmsim] [--only LINE,LINE] [--rtol 0.002]
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

NUMBER = re.compile(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?")
WALL_CLOCK = re.compile(r"\(\d[\d.,]* s\)|in \d[\d.,]* s\b")


def examples(readme):
    """(line number, command, expected output lines) for each fenced block that starts with "$ hbmsim"."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```") and i + 1 < len(lines) and lines[i + 1].startswith("$ hbmsim"):
            start, j = i + 2, i + 1  # start: the 1-based line of the command
            command = lines[j][2:]
            while command.endswith("\\"):
                j += 1
                command = command[:-1] + " " + lines[j].strip()
            k = j + 1
            while not lines[k].startswith("```"):
                k += 1
            out.append((start, command, [x for x in lines[j + 1:k] if x.strip()]))
            i = k
        i += 1
    return out


def numbers(line):
    return [float(x.replace(",", "")) for x in NUMBER.findall(line)]


def skeleton(line):
    return NUMBER.sub("#", WALL_CLOCK.sub("", line)).split()


def close(a, b, rtol):
    # Within rtol, or within half the last printed digit (a README prints rounded figures).
    return len(a) == len(b) and all(abs(x - y) <= rtol * max(abs(x), abs(y)) + 0.051 * (x != int(x)) for x, y in zip(a, b))


def compare(expected, got, rtol):
    """The printed lines that today's output lacks or prints with other numbers, as (README, now) pairs. A README
    may leave lines out (the header of a report it shows in part), so each printed line is looked for, in order,
    among the lines of the same text; a line that opens a parenthesis or holds "..." is the README's own remark."""
    got = [x for x in got if x.strip()]
    diffs, at = [], 0
    for want in expected:
        if want.strip().startswith(("(", "...")) or "..." in want:
            continue
        shape = skeleton(want)
        key = want.split()[0]  # a table's row key (a stage, a rank) or a report line's label
        k = next((k for k in range(at, len(got)) if skeleton(got[k]) == shape and got[k].split()[0] == key), None)
        if k is None:
            diffs.append((want, "<no line of that text>"))
            continue
        at = k + 1
        if not WALL_CLOCK.search(want) and not close(numbers(want), numbers(got[k]), rtol):
            diffs.append((want, got[k]))
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary", nargs="?", default="build/cli/hbmsim")
    ap.add_argument("--readme", default="README.md")
    ap.add_argument("--only", default="", help="README line numbers of the examples to run (comma-separated)")
    ap.add_argument("--rtol", type=float, default=0.002)
    args = ap.parse_args()
    root = os.path.dirname(os.path.abspath(args.readme))
    binary = os.path.abspath(args.binary)
    only = {int(x) for x in args.only.split(",") if x}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("data", "notes"):  # relative paths in the examples; files they write land in tmp
            os.symlink(os.path.join(root, name), os.path.join(tmp, name))
        for line, command, expected in examples(args.readme):
            if only and line not in only:
                continue
            argv = shlex.split(command)
            if argv[1] == "sweep":  # its stdout is CSV; the README shows columns picked from it
                print(f"README line {line}: skipped (a table picked from the sweep's CSV): {command[:100]}")
                continue
            argv[0] = binary
            run = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
            got = (run.stderr + run.stdout).split("\n")  # warnings first, as a terminal shows them
            diffs = compare(expected, got, args.rtol) if run.returncode == 0 else [("exit 0", f"exit {run.returncode}: {run.stderr.strip()}")]
            status = "ok" if not diffs else f"{len(diffs)} line(s) differ"
            print(f"README line {line}: {status}: {command[:100]}")
            for want, have in diffs:
                print(f"  README: {want}\n  now:    {have}")
            failed += bool(diffs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
