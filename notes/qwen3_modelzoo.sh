#!/bin/bash
# The five Qwen3-235B-A22B runs of notes/qwen3_modelzoo.md, as hbmsim commands: ./notes/qwen3_modelzoo.sh [CALIBRATION]
# (default corpus-fitted). HBMSIM names the binary (default build/cli/hbmsim); EXTRA adds flags to every run
# (EXTRA="--lhs off": notes/megatron_lhs.md).
set -euo pipefail
cd "$(dirname "$0")/.."
H=${HBMSIM:-build/cli/hbmsim}
B="--model data/hf/qwen3-235b-a22b.config.json --system h100-hgx --gpus 256 --global-batch 2048 --seq 4096
   --framework megatron --mesh-order megatron --sharded-optimizer on --ep-shards-weights off --grad-reduce-dtype bf16
   --calibration ${1:-corpus-fitted} ${EXTRA:-}"
run() {
  # shellcheck disable=SC2086
  $H simulate $B "$@" --json | /usr/bin/python3 -c \
    "import json,sys; r=json.load(sys.stdin); print('%.2f s, %.1f GiB, fits %s' % (r['step_time_s'], r['hbm_peak_bytes'] / 2**30, r['fits']))"
}
P8="--tp 2 --ep 32 --expert-tp 1 --pp 8 --vp 4 --micro-batch 1 --fsdp 1 --embedding-as-layer on --loss-as-layer on
    --moe-dispatcher flex --policy no_recompute --tensor mlp_norm=remat --tensor moe_mlp_act=remat"
echo -n "1 (measured 19.7 s): "; run $P8
echo -n "2 (measured 17.6 s): "; run $P8 --ep-overlap on
echo -n "3 (measured 17.6 s): "; run --tp 2 --ep 8 --expert-tp 1 --pp 1 --micro-batch 4 --moe-dispatcher flex --policy full
echo -n "4 (measured 24.2 s): "; run --tp 2 --ep 8 --expert-tp 1 --pp 32 --vp 3 --micro-batch 1 --fsdp 1 --embedding-as-layer on \
  --loss-as-layer on --policy no_recompute --tensor mlp_norm=remat --tensor moe_mlp_act=remat
echo -n "5 (measured 29.0 s): "; run --tp 4 --ep 8 --expert-tp 1 --pp 8 --vp 4 --micro-batch 1 --fsdp 1 --dp 4 --embedding-as-layer on \
  --loss-as-layer on --moe-dispatcher flex --policy no_recompute
