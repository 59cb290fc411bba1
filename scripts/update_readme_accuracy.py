#!/usr/bin/env python3
"""Rewrites the README's reproduce tables (datasheet and fitted) and claims table from `hbmsim reproduce`.

tests/test_accuracy_guard.cpp fails when the README and a fresh reproduction differ by more than 0.5%; after a
change that moves the predictions on purpose, run this, read the diff, and update the prose around the tables
(the errors it quotes) in the same commit.

    /usr/bin/python3 scripts/update_readme_accuracy.py [build/cli/hbmsim]
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build" / "cli" / "hbmsim")
README = ROOT / "README.md"


def reproduce(*args):
    text = subprocess.run([CLI, "reproduce", *args], capture_output=True, text=True, check=True).stdout
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    end = next(i for i in range(start + 2, len(lines)) if not lines[i].strip())
    claims = json.loads(subprocess.run([CLI, "reproduce", *args, "--json"], capture_output=True, text=True,
                                       check=True).stdout)["claims"]
    return "\n".join(lines[start:end]) + "\n", claims


def replace_block(text, marker, table):
    at = text.index(marker)
    open_ = text.index("```\n", at) + 4
    close = text.index("```", open_)
    return text[:open_] + table + text[close:]


def claims_table(datasheet, fitted):
    def cell(claim, value):
        return f"{value:+.1f}%" if "(%)" in claim["claim"] else ("yes" if value >= 0.5 else "no")

    rows = ["| claim | reported | datasheet | holds | fitted | holds |", "|---|---|---|---|---|---|"]
    for d, f in zip(datasheet, fitted):
        rows.append(f"| {d['claim']} | {cell(d, d['reported'])} | {cell(d, d['predicted'])} | "
                    f"{'yes' if d['holds'] else 'NO'} | {cell(f, f['predicted'])} | {'yes' if f['holds'] else 'NO'} |")
    return "\n".join(rows) + "\n"


def main():
    text = README.read_text()
    datasheet, claims_d = reproduce()
    fitted, claims_f = reproduce("--calibration", "gb200-fitted")
    text = replace_block(text, "With datasheet figures alone (`hbmsim reproduce`):", datasheet)
    text = replace_block(text, "`hbmsim reproduce --calibration gb200-fitted`:", fitted)
    header = "| claim | reported | datasheet | holds | fitted | holds |"
    start = text.index(header)
    end = start
    while end < len(text) and text[end] == "|":
        end = text.index("\n", end) + 1
    text = text[:start] + claims_table(claims_d, claims_f) + text[end:]
    README.write_text(text)


if __name__ == "__main__":
    main()
