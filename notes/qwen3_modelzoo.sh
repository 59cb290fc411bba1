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
    "import json,sys; r=json.load(sys.stdin); print('%.2f s, %.1f TFLOP/s, %.1f GiB, fits %s' % (r['step_time_s'], r['tflops_per_device'], r['hbm_peak_bytes'] / 2**30, r['fits']))"
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
# The zoo's long-context table (Qwen3/readme.md): tp 4, ep 8 (ETP 1), pp 8 x vp 4, GBS 256, DeepEP, recompute
# "layernorm moe" (the pre-MLP norm, and the whole MoE layer from it), seq 16384 (cp 1). Measured in TFLOP/s:
# forced balance 295, dropless 237.
MOE="--tensor router_logits=remat --tensor moe_dispatched=remat --tensor moe_mlpwi_0=remat --tensor moe_mlpwi_1=remat
     --tensor moe_mlp_act=remat --tensor moe_returned=remat"
L="--tp 4 --ep 8 --expert-tp 1 --pp 8 --vp 4 --micro-batch 1 --fsdp 1 --dp 4 --embedding-as-layer on --loss-as-layer on
   --moe-dispatcher flex --policy no_recompute --tensor mlp_norm=remat $MOE"
# shellcheck disable=SC2086
echo -n "L, forced balance (measured 295 TFLOP/s): "; B="${B/--global-batch 2048 --seq 4096/--global-batch 256 --seq 16384}" run $L
# shellcheck disable=SC2086
echo -n "L, dropless (measured 237 TFLOP/s), --moe-load-imbalance 1.59: "; B="${B/--global-batch 2048 --seq 4096/--global-batch 256 --seq 16384}" run $L --moe-load-imbalance 1.59
# seq 32768 at cp 2: the expert group of 8 folded over tp 4 x cp 2. Measured: forced 335, dropless 277 TFLOP/s.
# shellcheck disable=SC2086
echo -n "L cp 2, forced balance (measured 335 TFLOP/s): "; B="${B/--global-batch 2048 --seq 4096/--global-batch 256 --seq 32768}" run $L --cp 2
# shellcheck disable=SC2086
echo -n "L cp 2, dropless (measured 277 TFLOP/s), --moe-load-imbalance 1.59: "; B="${B/--global-batch 2048 --seq 4096/--global-batch 256 --seq 32768}" run $L --cp 2 --moe-load-imbalance 1.59
# seq 65536 at cp 4 and 131072 at cp 8: the expert group of 8 inside tp 4 x cp (tp x 2 of the cp ranks).
# Measured: cp 4 forced 368, dropless 320; cp 8 forced 389, dropless 357 TFLOP/s.
for r in "4 2 65536 368 320" "8 1 131072 389 357"; do
  read -r cp dp seq forced dropless <<< "$r"
  # shellcheck disable=SC2086
  echo -n "L cp $cp, forced balance (measured $forced TFLOP/s): "; B="${B/--global-batch 2048 --seq 4096/--global-batch 256 --seq $seq}" run ${L/--dp 4/--dp $dp} --cp "$cp"
  # shellcheck disable=SC2086
  echo -n "L cp $cp, dropless (measured $dropless TFLOP/s), --moe-load-imbalance 1.59: "; B="${B/--global-batch 2048 --seq 4096/--global-batch 256 --seq $seq}" run ${L/--dp 4/--dp $dp} --cp "$cp" --moe-load-imbalance 1.59
done
# Blackwell (the zoo's qwen3/readme.md at 020b813): 4-GPU nodes, HybridEP (flex), forced balance; TFLOP/s.
BW="--model data/hf/qwen3-235b-a22b.config.json --framework megatron --mesh-order megatron --sharded-optimizer on
    --ep-shards-weights off --grad-reduce-dtype bf16 --calibration ${1:-corpus-fitted} --embedding-as-layer on
    --loss-as-layer on --moe-dispatcher flex --fsdp 1 ${EXTRA:-}"
MX="--weights mxfp8 --attention-dtype mxfp8 --fp8-saved-activations on"
# shellcheck disable=SC2086
echo -n "GB200 BF16, tp 1 pp 8 ep 8, GBS 8192 (measured 750 TFLOP/s): "; B="$BW" run --system gb200-nvl72 --gpus 256 \
  --tp 1 --pp 8 --ep 8 --dp 4 --micro-batch 1 --global-batch 8192 --seq 4096 --policy no_recompute
# shellcheck disable=SC2086
echo -n "GB300 MXFP8, tp 1 pp 4 ep 32, micro-batch 2, GBS 8192 (measured 974 TFLOP/s): "; B="$BW $MX" run --system gb300-nvl72 \
  --gpus 256 --tp 1 --pp 4 --ep 32 --dp 2 --micro-batch 2 --global-batch 8192 --seq 4096 --policy no_recompute
# seq 131072 on 128 GB300s, tp 4 x cp 4 x pp 4 x vp 12, ep 32 folded over tp x cp, "moe_act layernorm". Its GBS 1024
# (512 micro-batches, about 4.1 M simulated ops) needs a budget above the default 4 M (--max-ops).
# shellcheck disable=SC2086
echo -n "GB300 MXFP8 128k, GBS 1024 (measured 1150 TFLOP/s): "; B="$BW $MX" run --system gb300-nvl72 --gpus 128 --tp 4 --cp 4 \
  --pp 4 --vp 12 --ep 32 --expert-tp 1 --dp 1 --micro-batch 1 --global-batch 1024 --seq 131072 --max-ops 5000000 \
  --policy no_recompute --tensor mlp_norm=remat --tensor moe_mlp_act=remat
