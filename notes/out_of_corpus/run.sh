#!/bin/bash
# Out-of-corpus runs (notes/out_of_corpus/README.md): each config beside its measured TFLOP/s per GPU, simulated with
# a calibration (default corpus-fitted): ./notes/out_of_corpus/run.sh [CALIBRATION]. HBMSIM names the binary.
set -euo pipefail
cd "$(dirname "$0")"
H=${HBMSIM:-../../build/cli/hbmsim}
while read -r name measured; do
  # shellcheck disable=SC2086
  $H simulate --config "$name.json" --calibration "${1:-corpus-fitted}" --json | /usr/bin/python3 -c "
import json, sys
r = json.load(sys.stdin)
p = r['tflops_per_device']
print('%-34s measured %7.1f  hbmsim %7.1f TFLOP/s (%+5.1f%%), %6.0f tok/s, %5.1f GiB, fits %s'
      % ('$name', $measured, p, 100 * (p / $measured - 1), r['tokens_per_s_per_device'], r['hbm_peak_bytes'] / 2**30, r['fits']))"
done <<'ROWS'
mb2608_dsv3_gb300 1635
mb2608_dsv3_gb200 1276
mb2608_qwen3_235b_gb300 1306
mb2608_qwen3_235b_gb200 1077
dsv3_gb200_blog_494 494.46
dsv3_gb200_blog_970 970.01
mb2608_gpt_oss_120b_gb300 1077
mb2608_gpt_oss_120b_gb200 934
mb2608_qwen3_30b_gb200 923
mb2606_gpt_oss_120b_b300 604
mb2606_qwen3_30b_h100 203
mb2606_kimi_k2_gb300 1099
mb2608_qwen3_30b_gb300 1029
mb2606_qwen3_30b_b300 938
ROWS
