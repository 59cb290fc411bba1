#!/bin/bash
# Muon's cost per step (notes/out_of_corpus/README.md, "Muon against AdamW"): each config run with Adam (fp32
# moments, distributed optimizer) and with Muon (blockwise), beside the seconds NVIDIA measured Muon to add (blog
# Table 1, Megatron-Bridge 26.02). ./notes/out_of_corpus/muon_cost.sh [CALIBRATION]; HBMSIM names the binary.
set -euo pipefail
cd "$(dirname "$0")"
H=${HBMSIM:-../../build/cli/hbmsim}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while read -r name measured_s; do
  for optimizer in adam muon; do
    /usr/bin/python3 -c "
import json
d = json.load(open('$name.json'))
d.update(optimizer='$optimizer', optimizer_moments_dtype='fp32', sharded_optimizer=True,
         muon_tp_mode='blockwise' if '$optimizer' == 'muon' else 'duplicated')
json.dump(d, open('$tmp/$optimizer.json', 'w'))"
    $H simulate --config "$tmp/$optimizer.json" --calibration "${1:-corpus-fitted}" --json > "$tmp/$optimizer.out"
  done
  /usr/bin/python3 -c "
import json
a, m = (json.load(open('$tmp/%s.out' % o)) for o in ('adam', 'muon'))
cost = m['step_time_s'] - a['step_time_s']
ns = (m['executed_flops_per_device'] - a['executed_flops_per_device']) / 1e12
print('%-24s Adam %.3f s  Muon %.3f s  cost %.3f s (measured %.3f s, %+.0f%%), iterations %.1f TFLOP per GPU'
      % ('$name', a['step_time_s'], m['step_time_s'], cost, $measured_s, 100 * (cost / $measured_s - 1), ns))"
done <<'ROWS'
mb2606_kimi_k2_gb300 0.273
mb2608_qwen3_30b_gb300 0.334
ROWS
