#!/usr/bin/env python3
"""hbmsim beside its analytical peers, in one process, on one configuration (issue 23).

Times Calculon (github.com/calculon-ai/calculon) and llm-analysis (github.com/cli99/llm-analysis) against
hbmsim's full event simulation of the same training step: Llama 3 70B on 128 H100 (80 GB, NVLink 8),
tensor parallelism 8 x data parallelism 16, sequence 8192, global batch 16 (one sequence per replica), full recompute, bf16, the
optimizer sharded over data parallelism. Their sources are not part of hbmsim: clone them and name their
folders. They run on Debian's python3-numpy, python3-psutil and python3-fire.

    PYTHONPATH=build/python /usr/bin/python3 bench/peers.py --calculon ../calculon --llm-analysis ../llm-analysis

Prints milliseconds per configuration (median over --reps batches of --inner runs, after a warm-up) and
the ratios; --json prints one object. A peer whose folder is not given or not found is reported as absent
(exit 0 when at least hbmsim ran).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

# The one configuration, as each tool spells it.
GPUS, TP, DP, SEQ, GLOBAL_BATCH = 128, 8, 16, 8192, 16
LLAMA3_70B = {"hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8, "head_dim": 128, "layers": 80, "vocab": 128256}


def time_ms(run: Callable[[], object], reps: int, inner: int) -> float:
    for _ in range(3):  # warm caches and lazy imports
        run()
    batches = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            run()
        batches.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(batches)


def hbmsim_runs() -> dict[str, Callable[[], object]]:
    import hbmsim
    from hbmsim import _hbmsim  # the compiled core: what a planner's inner loop calls
    doc = {"system": "h100-hgx", "model": "llama3.1-70b", "gpus": GPUS, "tp": TP, "dp": DP, "fsdp": 1,
           "sequence_parallel": True, "seq": SEQ, "batch": GLOBAL_BATCH / GPUS, "global_batch": GLOBAL_BATCH, "policy": "full",
           "sharded_optimizer": True}
    return {"hbmsim": lambda: _hbmsim.simulate(doc, False, "peers"),
            "hbmsim (Python API)": lambda: hbmsim.simulate(doc)}


def calculon_run(folder: str) -> Callable[[], object]:
    sys.path.insert(0, folder)
    import calculon
    from calculon.llm import Llm
    app = Llm.Application({"hidden": LLAMA3_70B["hidden"], "feedforward": LLAMA3_70B["ffn"], "seq_size": SEQ,
                           "attn_heads": LLAMA3_70B["heads"], "attn_size": LLAMA3_70B["head_dim"],
                           "num_blocks": LLAMA3_70B["layers"]})
    exe = Llm.Execution.from_json({
        "num_procs": GPUS, "tensor_par": TP, "pipeline_par": 1, "data_par": DP, "tensor_par_net": 0,
        "pipeline_par_net": 0, "data_par_net": 1, "batch_size": GLOBAL_BATCH, "microbatch_size": GLOBAL_BATCH // DP,
        "datatype": "float16", "fused_activation": True, "attention_type": "multihead",
        "activation_recompute": "full", "pipeline_interleaving": 1, "optimizer_sharding": True,
        "tensor_par_comm_type": "rs_ag", "tensor_par_overlap": "none", "seq_par_ag_redo": False,
        "data_par_overlap": True, "weight_offload": False, "activations_offload": False,
        "optimizer_offload": False, "training": True})
    syst = calculon.System(calculon.io.read_json_file(os.path.join(folder, "systems", "h100_80g_nvl8.json")))
    log = logging.getLogger("calculon")
    log.setLevel(logging.ERROR)

    def run():
        model = Llm(app, log)
        model.compile(syst, exe)
        model.run(syst)
        return model.get_total_time()
    return run


def llm_analysis_run(folder: str, workdir: str) -> Callable[[], object]:
    sys.path.insert(0, folder)
    from llm_analysis import analysis
    logging.getLogger().setLevel(logging.ERROR)
    model = os.path.join(workdir, "llama3_70b.json")
    with open(model, "w") as f:
        json.dump({"name": "llama3_70b", "num_layers": LLAMA3_70B["layers"], "n_head": LLAMA3_70B["heads"],
                   "hidden_dim": LLAMA3_70B["hidden"], "vocab_size": LLAMA3_70B["vocab"], "max_seq_len": SEQ,
                   "num_key_value_heads": LLAMA3_70B["kv_heads"], "ffn_embed_dim": LLAMA3_70B["ffn"],
                   "model_type": "llama", "mlp_gated_linear_units": True}, f)

    def run():
        with contextlib.redirect_stdout(io.StringIO()):
            return analysis.train(model_name=model, gpu_name="h100-sxm-80gb", dtype_name="w16a16e16",
                                  log_level="ERROR", seq_len=SEQ, global_batch_size=GLOBAL_BATCH,
                                  batch_size_per_gpu=GLOBAL_BATCH // DP, tp_size=TP, dp_size=DP,
                                  total_num_gpus=GPUS, activation_recomputation=2, ds_zero=1,
                                  flops_efficiency=0.5, hbm_memory_efficiency=0.9)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calculon", default=os.environ.get("CALCULON_DIR", ""), help="Calculon source folder")
    ap.add_argument("--llm-analysis", default=os.environ.get("LLM_ANALYSIS_DIR", ""), help="llm-analysis source folder")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ms: dict[str, float | None] = {}
    absent: dict[str, str] = {}
    for name, run in hbmsim_runs().items():
        ms[name] = time_ms(run, args.reps, args.inner)
    with tempfile.TemporaryDirectory() as work:
        for name, folder, make in (("calculon", args.calculon, calculon_run),
                                   ("llm-analysis", args.llm_analysis, lambda d: llm_analysis_run(d, work))):
            if not folder or not os.path.isdir(folder):
                absent[name] = f"no source folder ({'--' + name} not given)" if not folder else f"{folder} not found"
                continue
            try:
                ms[name] = time_ms(make(folder), args.reps, args.inner)
            except Exception as e:  # a peer that fails to import or run is reported, not fatal
                absent[name] = f"{type(e).__name__}: {e}"
    ratios = {f"{peer}_over_hbmsim": ms[peer] / ms["hbmsim"] for peer in ("calculon", "llm-analysis") if peer in ms}
    out = {"config": f"Llama 3 70B, {GPUS} H100, tp {TP} x dp {DP}, seq {SEQ}, global batch {GLOBAL_BATCH}, full recompute",
           "ms_per_config": ms, "ratios": ratios, "absent": absent}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(out["config"])
    for name, t in ms.items():
        print(f"  {name:22s} {t:8.3f} ms per configuration")
    for name, r in ratios.items():
        print(f"  {name:22s} {r:8.1f}x")
    for name, why in absent.items():
        print(f"  {name:22s} absent: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
