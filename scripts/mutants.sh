#!/usr/bin/env bash
# Mutation check (not run in CI: it rebuilds for every mutant). Applies each plausible one-line bug listed in
# scripts/mutants.json to a scratch copy of the source, rebuilds, runs the C++ suite (hbmsim_tests) and prints
# caught/survived per mutant; exits 0 only when every mutant is caught. The working tree is never modified
# (docs/mutants.md is rewritten with --write-docs). Options: --only ID[,ID], --jobs N, --keep, --scratch DIR,
# --timeout S, --write-docs, --list; see --help and docs/mutants.md.
set -euo pipefail
exec python3 "$(dirname "$0")/mutants.py" "$@"
