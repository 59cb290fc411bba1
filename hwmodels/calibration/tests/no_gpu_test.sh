#!/usr/bin/env bash
# Without a GPU, hbmsim-calibrate-cuda must print exactly one clear line on stderr, nothing on stdout,
# exit with status 3 (not a signal) and create no output file. Skipped where nvidia-smi lists a GPU.
set -u
bin=${1:?usage: no_gpu_test.sh PATH/TO/hbmsim-calibrate-cuda}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "no_gpu_test: skipped: nvidia-smi lists a GPU on this machine, so the no-GPU path cannot be tested"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/outdir"

"$bin" -o "$tmp/outdir/profile.json" --raw "$tmp/outdir/raw.json" >"$tmp/stdout" 2>"$tmp/stderr"
status=$?

fail() {
  echo "no_gpu_test: FAIL: $*"
  echo "--- stdout:"; cat "$tmp/stdout"
  echo "--- stderr:"; cat "$tmp/stderr"
  exit 1
}

[ "$status" -lt 128 ] || fail "killed by a signal (exit status $status)"
[ "$status" -eq 3 ] || fail "exit status $status, expected 3"
[ ! -s "$tmp/stdout" ] || fail "stdout is not empty"
[ "$(wc -l <"$tmp/stderr")" -eq 1 ] || fail "stderr has $(wc -l <"$tmp/stderr") newline-terminated lines, expected 1"
[ "$(tail -c 1 "$tmp/stderr" | od -An -c | tr -d ' ')" = '\n' ] || fail "stderr does not end with a newline"
line=$(head -n 1 "$tmp/stderr")
[ -n "${line//[[:space:]]/}" ] || fail "the stderr line is empty"
case "$line" in
  *"no CUDA device"*) ;;
  *) fail "the stderr line does not say 'no CUDA device'" ;;
esac
[ -z "$(ls -A "$tmp/outdir")" ] || fail "output files were created: $(ls -A "$tmp/outdir")"

# An output path that cannot be written is a bad command line (status 2), found before any measurement: on a
# machine with a GPU the measurements take minutes, and their result would have nowhere to go.
for bad in "-o $tmp/no/such/profile.json" "-o $tmp/outdir/profile.json --raw $tmp/outdir"; do
  # shellcheck disable=SC2086  # the arguments are split on purpose (the paths have no spaces)
  "$bin" $bad >"$tmp/stdout" 2>"$tmp/stderr"
  status=$?
  [ "$status" -eq 2 ] || fail "$bad: exit status $status, expected 2"
  [ "$(wc -l <"$tmp/stderr")" -eq 1 ] || fail "$bad: stderr has $(wc -l <"$tmp/stderr") lines, expected 1"
  grep -q "cannot be written\|is a directory" "$tmp/stderr" || fail "$bad: the line does not say the path cannot be written"
  [ -z "$(ls -A "$tmp/outdir")" ] || fail "$bad: output files were created: $(ls -A "$tmp/outdir")"
done

echo "no_gpu_test: PASS: $line"
