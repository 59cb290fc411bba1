#!/usr/bin/env python3
"""Mutation check: applies each mutant of scripts/mutants.json (a plausible one-line bug) to a scratch copy of
the source, rebuilds, runs the C++ suite (hbmsim_tests) and reports whether the suite caught it.

Run it through scripts/mutants.sh; `scripts/mutants.sh --help` lists the options. The working tree it is run
from is never modified (only docs/mutants.md, and only with --write-docs): the tracked and untracked,
not-ignored files are copied into a scratch directory, which keeps one build directory for every mutant, so
each mutant rebuilds only what it changed.
"""
import argparse
import datetime
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIST = REPO / "scripts" / "mutants.json"
DOCS = REPO / "docs" / "mutants.md"
SHOWN_FAILURES = 3  # test case names shown per caught mutant


def fail(msg, code=2):
    print(f"mutants: {msg}", file=sys.stderr)
    sys.exit(code)


def git(*args):
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def load_mutants(only):
    doc = json.loads(LIST.read_text())
    mutants = doc["mutants"]
    problems, seen = [], set()
    for m in mutants:
        for key in ("id", "what", "file", "original", "replacement"):
            if not isinstance(m.get(key), str) or (key != "replacement" and not m[key]):
                problems.append(f"{m.get('id', '?')}: field {key!r} missing or not a string")
        if m["id"] in seen:
            problems.append(f"{m['id']}: duplicate id")
        seen.add(m["id"])
        if m["original"] == m["replacement"]:
            problems.append(f"{m['id']}: replacement equals original")
    if only:
        unknown = [i for i in only if i not in seen]
        if unknown:
            problems.append("--only: unknown id(s) " + ", ".join(unknown))
        mutants = [m for m in mutants if m["id"] in only]
    # The original text must occur exactly once: a refactor that moves, changes or duplicates it is noticed
    # here, before anything is built.
    for m in mutants:
        path = REPO / m["file"]
        if not path.is_file():
            problems.append(f"{m['id']}: no file {m['file']}")
            continue
        n = path.read_text().count(m["original"])
        if n != 1:
            problems.append(f"{m['id']}: the original text occurs {n} times in {m['file']} (must be exactly once)")
    if problems:
        fail("refusing to run, scripts/mutants.json does not match the source:\n  " + "\n  ".join(problems))
    return mutants


def source_files():
    out = git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return [f for f in out.split("\0") if f and (REPO / f).is_file() and not (REPO / f).is_symlink()]


def sync_sources(src):
    """Copies the working tree's files into `src`. A file already there with the same content is left alone
    (its build outputs stay valid); one with other content (say, a mutant left by an interrupted run) is
    rewritten with a fresh modification time, so that ninja rebuilds what depends on it."""
    for rel in source_files():
        a, b = REPO / rel, src / rel
        if b.is_file():
            if b.read_bytes() == a.read_bytes():
                continue
            b.write_bytes(a.read_bytes())
            os.utime(b)
        else:
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a, b)


def build(build_dir, jobs, log):
    cmd = ["cmake", "--build", str(build_dir), "--target", "hbmsim_tests", "hbmsim"]
    if jobs:
        cmd += ["-j", str(jobs)]
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode == 0


def run_suite(build_dir, timeout, xml_path):
    """Runs every test case of hbmsim_tests. Returns (status, failed test case names in run order);
    status is 'passed', 'failed', 'crashed' or 'timeout'."""
    binary = build_dir / "tests" / "hbmsim_tests"
    cmd = [str(binary), "--order", "decl", "-r", "xml", "-o", str(xml_path)]
    try:
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout).returncode
        # Catch2 exits with the number of failed assertions (capped at 255); a signal is a crash.
        status = "passed" if rc == 0 else ("crashed" if rc < 0 else "failed")
    except subprocess.TimeoutExpired:
        status = "timeout"
    text = xml_path.read_text(errors="replace") if xml_path.exists() else ""
    # The XML may be cut short by a crash or the timeout: read it test case by test case.
    starts = [(m.start(), html.unescape(m.group(1))) for m in re.finditer(r'<TestCase name="([^"]*)"', text)]
    failed = []
    for k, (pos, name) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(text)
        body = text[pos:end]
        closed = "</TestCase>" in body
        if (re.search(r'<OverallResult success="false"', body) or "<FatalErrorCondition" in body
                or (not closed and status != "passed")):
            failed.append(name)
    if status == "passed" and failed:
        status = "failed"
    return status, failed


def configure(src, build_dir):
    if (build_dir / "CMakeCache.txt").exists():
        return
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cmd = ["cmake", "-S", str(src), "-B", str(build_dir), *gen, "-DCMAKE_BUILD_TYPE=Release",
           "-DHBMSIM_PYTHON=OFF", "-DHBMSIM_BENCHMARKS=OFF"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail("cmake configure failed:\n" + r.stdout + r.stderr)


def table(rows):
    head = ["id", "result", "first failing test cases", "s", "what it models"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        tests = "; ".join(r["failed"][:SHOWN_FAILURES])
        if len(r["failed"]) > SHOWN_FAILURES:
            tests += f"; (+{len(r['failed']) - SHOWN_FAILURES} more)"
        lines.append(f"| {r['id']} | {r['result']} | {tests.replace('|', '/') or '-'} | {r['seconds']:.0f} | {r['what']} |")
    return "\n".join(lines)


def write_docs(rows, commit, total_s, all_selected):
    today = datetime.date.today().isoformat()
    caught = sum(r["result"].startswith("caught") for r in rows)
    scope = "every mutant" if all_selected else "the mutants selected with --only"
    text = f"""# Mutation check

`scripts/mutants.sh` applies plausible one-line bugs (the list is data: `scripts/mutants.json`, each with the
exact original text, which must occur exactly once in its file) to a scratch copy of the source, rebuilds,
runs the C++ suite (`hbmsim_tests`, every test case) and records whether the suite caught the bug (a failing
test, a crash or a timeout). It exits 0 only when every mutant is caught. It is not part of CI: each run
builds the project once into its scratch directory, then rebuilds what each mutant touches.

    scripts/mutants.sh                       # every mutant
    scripts/mutants.sh --only ID[,ID]        # some of them
    scripts/mutants.sh --jobs N              # ninja parallelism
    scripts/mutants.sh --keep                # keep the scratch directory (printed) for a later --scratch DIR
    scripts/mutants.sh --scratch DIR         # reuse a scratch directory and its build
    scripts/mutants.sh --write-docs          # rewrite this file with the result

A mutant that survives needs a test that catches it: `tests/test_mutant_guards.cpp` holds the tests added for
the mutants nothing else caught (and for some only the README accuracy tables caught), each asserting real
behaviour against a value computed by hand. The "first failing test cases" are the first three in the suite's
order; the scratch directory's `logs/ID.xml` (kept with --keep) lists them all.

## Last result

Run on {today}, commit `{commit}`, {scope}: {caught} of {len(rows)} caught, {total_s / 60:.1f} minutes in all
(one scratch build, then per mutant: rebuild and the whole suite).

{table(rows)}
"""
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(text)
    print(f"mutants: wrote {DOCS.relative_to(REPO)}")


def main():
    ap = argparse.ArgumentParser(prog="scripts/mutants.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated mutant ids to run (default: all)")
    ap.add_argument("--jobs", type=int, default=0, help="ninja parallelism (default: ninja's)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--scratch", help="scratch directory to use (and reuse, with its build); implies --keep")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per suite run before it counts as caught (600)")
    ap.add_argument("--write-docs", action="store_true", help="write the result table to docs/mutants.md")
    ap.add_argument("--list", action="store_true", help="list the mutants and check they apply; build nothing")
    args = ap.parse_args()

    only = [s for s in (args.only or "").split(",") if s]
    mutants = load_mutants(only)
    if args.list:
        for m in mutants:
            print(f"{m['id']:28} {m['file']:28} {m['what']}")
        return 0
    commit = git("rev-parse", "--short=12", "HEAD").strip()
    if git("status", "--porcelain", "--untracked-files=no").strip():
        commit += " (with uncommitted changes)"

    t0 = time.time()
    keep = args.keep or bool(args.scratch)
    if args.scratch:
        scratch = Path(args.scratch).resolve()
        scratch.mkdir(parents=True, exist_ok=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="hbmsim-mutants."))
    src, build_dir, logs = scratch / "src", scratch / "build", scratch / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"mutants: scratch {scratch}, {len(mutants)} mutant(s), source at {commit}", flush=True)
    rows = []
    try:
        sync_sources(src)
        configure(src, build_dir)
        print("mutants: building and running the unmutated suite ...", flush=True)
        if not build(build_dir, args.jobs, logs / "baseline.build.log"):
            fail(f"the unmutated source does not build: see {logs / 'baseline.build.log'}")
        tb = time.time()
        status, failed = run_suite(build_dir, args.timeout, logs / "baseline.xml")
        if status != "passed":
            fail(f"the unmutated suite does not pass ({status}: {', '.join(failed[:5])}); fix that first")
        print(f"mutants: unmutated suite passes in {time.time() - tb:.0f} s", flush=True)

        for m in mutants:
            path = src / m["file"]
            original = path.read_text()
            start = time.time()
            path.write_text(original.replace(m["original"], m["replacement"], 1))
            try:
                if not build(build_dir, args.jobs, logs / f"{m['id']}.build.log"):
                    result, failed = "INVALID (does not build)", []
                else:
                    status, failed = run_suite(build_dir, args.timeout, logs / f"{m['id']}.xml")
                    result = "SURVIVED" if status == "passed" else ("caught" if status == "failed" else f"caught ({status})")
            finally:
                path.write_text(original)  # a fresh mtime: the next build recompiles it
            row = {"id": m["id"], "what": m["what"], "result": result, "failed": failed, "seconds": time.time() - start}
            rows.append(row)
            shown = ", ".join(failed[:SHOWN_FAILURES]) + (" ..." if len(failed) > SHOWN_FAILURES else "")
            print(f"  {m['id']:28} {result:10} {row['seconds']:5.0f} s  {shown}", flush=True)
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
        elif rows:
            print(f"mutants: kept {scratch} (reuse with --scratch {scratch})")

    total = time.time() - t0
    print()
    print(table(rows))
    caught = sum(r["result"].startswith("caught") for r in rows)
    print(f"\nmutants: {caught} of {len(rows)} caught in {total / 60:.1f} minutes (commit {commit})")
    if args.write_docs:
        write_docs(rows, commit, total, not only)
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
