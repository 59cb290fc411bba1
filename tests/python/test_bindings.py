"""The Python package against the CLI: same reports, same sweeps, same reproduction, same errors."""
import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

import hbmsim
from hbmsim import _hbmsim
from conftest import cli_json, run_cli

LLAMA_405B = {"system": "gb200-nvl72", "model": "llama3.1-405b", "gpus": 128, "batch": 2, "seq": 8192,
              "weights": "nvfp4", "policy": "qkv_proj_offloaded", "lhs": True}
DSV3 = {"system": "gb200-nvl72", "model": "deepseek-v3-671b", "gpus": 128, "ep": 64, "batch": 8, "seq": 4096,
        "policy": "custom",
        "tensors": {"mla_q": "offload", "mla_kv": "offload", "moe_mlpwi_0": "offload", "moe_mlpwi_1": "offload"},
        "lhs": True, "pipelined_transfers": True}
CONFIGS = {
    "defaults": {},
    "llama405b-qkv-offload": LLAMA_405B,
    "dsv3-offload-lhs-pipe": DSV3,
    "dsv3-split-double-buffered": {**DSV3, "moe_batch_split": 2, "double_buffering": True},
    "llama8b-pipeline-per-stage": {"model": "llama3.1-8b", "gpus": 16, "pp": 4, "vp": 2, "microbatches": 8, "batch": 2,
                                   "stage_policies": "qkv_proj_offloaded,full,full,minimal"},
    "llama8b-what-if": {"model": "llama3.1-8b", "gpus": 8, "batch": 4, "policy": "minimal_offloaded",
                        "host_link_bytes_per_s": 3.3e10, "hbm_bytes": 9.6e10, "memory_limit_slop": 0.9,
                        "weights": "fp8", "system": "h200-hgx"},
}


def write_config(tmp_path, config, name="cfg.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("name", list(CONFIGS))
def test_simulate_equals_cli_json(cli, tmp_path, name):
    config = CONFIGS[name]
    expected = cli_json(cli, "simulate", "--config", str(write_config(tmp_path, config)), "--json")
    for got in (hbmsim.simulate(config), _hbmsim.simulate(config)):
        assert set(got) == set(expected)
        for key in expected:  # exact: the same doubles, printed round-trip by the CLI
            assert got[key] == expected[key], key
    # The headline fields, spelled out.
    got = hbmsim.simulate(config)
    for key in ("step_time_s", "tflops_per_device", "hbm_peak_bytes", "host_peak_bytes", "hbm_breakdown_bytes",
                "exposed_s", "busy_s", "fits", "config"):
        assert getattr(got, key) == expected[key]


def test_simulate_keyword_overrides_equal_cli_flags(cli):
    expected = cli_json(cli, "simulate", "--model", "llama3.1-70b", "--gpus", "64", "--batch", "2",
                        "--policy", "save_qkv_proj", "--tensor", "mlpwo=offload", "--lhs", "off", "--json")
    got = hbmsim.simulate(model="llama3.1-70b", gpus=64, batch=2, policy="save_qkv_proj",
                          tensors={"mlpwo": "offload"}, lhs=False)
    assert dict(got) == expected


def test_simulate_from_file_path_equals_cli(cli, tmp_path):
    path = write_config(tmp_path, LLAMA_405B)
    expected = cli_json(cli, "simulate", "--config", str(path), "--json")
    assert dict(hbmsim.simulate(path)) == expected
    assert dict(hbmsim.simulate(str(path), batch=1)) == cli_json(cli, "simulate", "--config", str(path), "--batch",
                                                                 "1", "--json")


def test_trace_equals_cli_trace_file(cli, tmp_path):
    trace_path = tmp_path / "trace.json"
    expected = cli_json(cli, "simulate", "--config", str(write_config(tmp_path, DSV3)), "--json",
                        "--trace", str(trace_path))
    got = hbmsim.simulate(DSV3, trace=True)
    for key in expected:
        assert got[key] == expected[key], key
    assert got.trace == json.loads(trace_path.read_text())
    # Copies sharing the host link at once are drawn in lanes ("d2h #2"); spans() names their queue.
    tracks = {e["args"]["name"] for e in got.trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(" #" in t for t in tracks)
    assert {"d2h", "h2d"} <= set(got.spans().stream) and not any(" #" in s for s in got.spans().stream)
    # The timeline is the trace's memory counter track, in bytes.
    counters = [e for e in got.trace["traceEvents"] if e["ph"] == "C" and e["name"] == "memory GiB"]
    assert len(counters) == len(got.timeline) > 0
    # The per-category counter track adds up to the total at every sample.
    by_cat = [e for e in got.trace["traceEvents"] if e["ph"] == "C" and e["name"] == "HBM by category GiB"]
    assert len(by_cat) == len(got.timeline)
    for e, (_, hbm_bytes, _) in zip(by_cat, got.timeline):
        assert sum(e["args"].values()) == pytest.approx(hbm_bytes / 2**30, rel=1e-9)
    for e, (t_s, hbm_bytes, host_bytes) in zip(counters, got.timeline):
        assert e["ts"] == pytest.approx(t_s * 1e6, rel=1e-12, abs=1e-9)
        assert e["args"]["hbm"] == pytest.approx(hbm_bytes / 2**30, rel=1e-12)
        assert e["args"]["host"] == pytest.approx(host_bytes / 2**30, rel=1e-12, abs=1e-12)
    frame = got.timeline_frame()
    assert list(frame.columns) == ["t_s", "hbm_bytes", "host_bytes"]
    assert frame.hbm_bytes.max() == pytest.approx(got.hbm_peak_bytes, rel=1e-9)
    spans = got.spans()
    assert set(spans.stream) <= {"compute", "fsdp", "ep", "tp", "cp", "dp", "pp", "d2h", "h2d"}
    # Busy time is the union of a queue's spans (concurrent copies overlap), merged here by hand.
    for stream, seconds in got.busy_s.items():
        union, end = 0.0, -1.0
        for start, stop in sorted(zip(spans[spans.stream == stream].start_s, spans[spans.stream == stream].end_s)):
            if start > end:
                union += stop - start
                end = stop
            elif stop > end:
                union += stop - end
                end = stop
        assert union == pytest.approx(seconds, rel=1e-6, abs=1e-12), stream


def test_pipeline_stages_and_timeline_of_the_worst_stage():
    got = hbmsim.simulate(CONFIGS["llama8b-pipeline-per-stage"], trace=True)
    assert [st["stage"] for st in got.stages] == [0, 1, 2, 3]
    worst = max(got.stages, key=lambda st: st["hbm_peak_bytes"])
    assert got.timeline_stage == worst["stage"]
    assert got.timeline_frame().hbm_bytes.max() == pytest.approx(got.hbm_peak_bytes, rel=1e-9)
    spans = got.spans()
    assert set(spans.stage) == {0, 1, 2, 3}
    # Each stage's compute busy time is the union of its compute spans.
    for st in got.stages:
        s = spans[(spans.stage == st["stage"]) & (spans.stream == "compute")]
        assert s.dur_s.sum() == pytest.approx(st["compute_busy_s"], rel=1e-9)
        # and its time by phase those spans' by phase (the weight-gradient pass w counted as backward)
        by_phase = s.assign(phase=s.phase.replace({"f": "forward", "b": "backward", "w": "backward", "r": "recompute",
                                                   "o": "optimizer"})).groupby("phase").dur_s.sum().to_dict()
        assert {k: v for k, v in st["compute_s"].items() if v > 0} == pytest.approx(by_phase, rel=1e-9)
    # The buffers live at each stage's peak add up to that stage's peak, as a DataFrame too.
    peaks = {p["stage"]: sum(b["bytes"] for b in p["buffers"]) for p in got.peak_buffers}
    assert peaks == {st["stage"]: pytest.approx(st["hbm_peak_bytes"], rel=1e-9) for st in got.stages}
    frame = got.peak_frame()
    assert frame.groupby("stage").bytes.sum().to_dict() == pytest.approx(peaks, rel=1e-12)
    assert (frame.alloc_s <= frame.stage.map({st["stage"]: st["hbm_peak_time_s"] for st in got.stages})).all()
    with pytest.raises(ValueError, match="trace=True"):
        hbmsim.simulate(CONFIGS["llama8b-pipeline-per-stage"]).peak_frame()


def test_systems_and_models_equal_cli(cli):
    assert _hbmsim.systems() == cli_json(cli, "systems", "--json")
    assert _hbmsim.models() == cli_json(cli, "models", "--json")
    systems = hbmsim.systems()
    expected = {s["id"]: s for s in cli_json(cli, "systems", "--json")}
    assert list(systems.index) == list(expected)
    for sid, s in expected.items():
        assert systems.loc[sid, "hbm_bytes"] == s["hbm_bytes"]
        assert systems.loc[sid, "host_h2d_bytes_per_s_per_gpu"] == s["host_h2d_bytes_per_s_per_gpu"]
        assert hbmsim.system(sid) == s
    models = hbmsim.models()
    for m in cli_json(cli, "models", "--json"):
        assert models.loc[m["model"], "total_params"] == m["total_params"]
    # The HuggingFace configs are listed by the name a config's "model" takes.
    assert models.loc["hf/gpt-oss-120b.config.json", "sliding_window"] == 128


@pytest.mark.parametrize("config, names", [
    ({"gpus": -3}, ["gpus", "-3"]),
    ({"gpus": 8, "bogus_field": 1}, ["bogus_field"]),
    ({"tensors": {"not_a_tensor": "offload"}}, ["tensors.not_a_tensor"]),
    ({"tensors": {"mla_q": "elsewhere"}}, ["tensors.mla_q", "elsewhere"]),
    ({"tensors": {"mlpwi_0@attention": "remat"}}, ["tensors.mlpwi_0@attention", "unknown layer kind"]),
    # Rules the policy applies name the tensor by its config path too, not by the CLI's flag.
    ({"policy": "full", "tensors": {"mlp_norm": "device"}}, ['tensors.mlp_norm = "device"', "no_recompute or selective"]),
    ({"tensors": {"decoder_layer_input": "remat"}}, ['tensors.decoder_layer_input = "remat"', "remat boundary"]),
    ({"lhs": "maybe"}, ["lhs"]),
    ({"memory_limit_slop": 1.5}, ["memory_limit_slop"]),
    ({"system": "no-such-system"}, ["no-such-system"]),
    ({"policy": "no-such-policy"}, ["no-such-policy"]),
    ({"model": "deepseek-v3-671b", "gpus": 128, "ep": 64, "batch": 3, "moe_batch_split": 2},
     ["moe_batch_split", "batch x tp x cp = 3"]),
    ({"double_buffering": "sometimes"}, ["double_buffering"]),
    # The what-if limits are the planner's (1 PB, 1 PB/s), so Python and sweeps refuse what the CLI refuses.
    ({"hbm_bytes": 2e15}, ["hbm_bytes = 2e+15", "implausibly large, max 1e+15 bytes"]),
    ({"host_link_bytes_per_s": 3e15}, ["host_link_bytes_per_s = 3e+15", "implausibly large, max 1e+15 bytes/s"]),
])
def test_bad_config_raises_value_error_like_cli(cli, tmp_path, config, names):
    with pytest.raises(ValueError) as err:
        hbmsim.simulate(config)
    message = str(err.value)
    for n in names:
        assert n in message
    # Loaded from a file, the message is the CLI's, word for word (exit status 2: bad input), except that the
    # CLI also names the config file for a value checked after loading (an unknown system or policy).
    path = write_config(tmp_path, config)
    p = run_cli(cli, "simulate", "--config", str(path), "--json", check=False)
    assert p.returncode == 2
    with pytest.raises(ValueError) as err:
        hbmsim.simulate(path)
    assert p.stderr.strip() in (f"hbmsim: {err.value}", f"hbmsim: {path}: {err.value}")


def test_non_finite_number_is_named_as_given_not_as_json_null():
    # JSON has no NaN or infinity; the CLI says "--batch = nan (must be finite)", so Python names the value too.
    import numpy as np
    for value, shown in [(float("nan"), "nan"), (float("inf"), "inf"), (np.float64("-inf"), "-inf")]:
        with pytest.raises(ValueError) as err:
            hbmsim.simulate({"model": "llama3.1-8b", "gpus": 8}, batch=value)
        message = str(err.value)
        assert message.startswith("batch = ") and message.endswith(" (must be finite)"), message
        assert shown in message and "null" not in message, message


def test_input_error_is_value_error_not_runtime_error():
    with pytest.raises(ValueError):
        _hbmsim.simulate({"gpus": 0})
    with pytest.raises(TypeError):
        hbmsim.simulate({"gpus": object()})


SWEEP_BASE = {"system": "gb200-nvl72", "model": "llama3.1-405b", "gpus": 128, "seq": 8192, "weights": "nvfp4",
              "lhs": True}
SWEEP_AXES = {"batch": [0, 1, 2, 4], "policy": ["full", "save_qkv_proj", "qkv_proj_offloaded"],
              "host_link_bytes_per_s": [5e10, 1.76e11]}


def test_sweep_equals_cli_sweep(cli, tmp_path):
    path = write_config(tmp_path, SWEEP_BASE)
    out = tmp_path / "rows.jsonl"
    args = ["sweep", "--config", str(path), "--jobs", "2", "--out", str(out)]
    for field, values in SWEEP_AXES.items():
        args += ["--axis", f"{field}={','.join(hbmsim.api._value_text(v) for v in values)}"]
    run_cli(cli, *args)
    expected = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["index"])
    axis_list = [(f, [hbmsim.api._value_text(v) for v in vs]) for f, vs in SWEEP_AXES.items()]
    rows = sorted(_hbmsim.sweep(SWEEP_BASE, axis_list, "", 2), key=lambda r: r["index"])
    assert rows == expected
    assert any("error" in r for r in rows), "batch=0 should be a bad-input row"

    df = hbmsim.sweep(SWEEP_AXES, base=SWEEP_BASE, jobs=2)
    assert list(df["index"]) == [r["index"] for r in expected]
    assert list(df.columns[:4]) == ["index", "batch", "policy", "host_link_bytes_per_s"]
    for (_, row), r in zip(df.iterrows(), expected):
        assert row["batch"] == int(r["batch"]) and row["policy"] == r["policy"]
        assert row["host_link_bytes_per_s"] == float(r["host_link_bytes_per_s"])
        if "error" in r:
            assert row["error"] == r["error"] and "batch" in r["error"]
            assert math.isnan(row["step_time_s"])
        else:
            assert row["error"] == ""
            res = r["result"]
            for key in ("step_time_s", "tflops_per_device", "hbm_peak_bytes", "host_peak_bytes", "mfu"):
                assert row[key] == res[key]
            assert bool(row["fits"]) == res["fits"]
            assert row["exposed_s.h2d"] == res["exposed_s"]["h2d"]
            assert row["hbm_breakdown_bytes.saved_activations"] == res["hbm_breakdown_bytes"]["saved_activations"]


def test_sweep_point_equals_simulate():
    df = hbmsim.sweep({"batch": [1, 2], "tensor.mla_q": ["remat", "offload"]}, base=DSV3, where="batch>=2")
    assert list(df["batch"]) == [2, 2]
    for _, row in df.iterrows():
        single = hbmsim.simulate(DSV3, batch=2, tensors={**DSV3["tensors"], "mla_q": row["tensor.mla_q"]})
        assert row["step_time_s"] == single.step_time_s
        assert row["hbm_peak_bytes"] == single.hbm_peak_bytes


def test_sweep_where_and_expand_equal_cli(cli, tmp_path):
    path = write_config(tmp_path, SWEEP_BASE)
    out = tmp_path / "rows.jsonl"
    run_cli(cli, "sweep", "--config", str(path), "--axis", "batch=1,2,4,8", "--axis", "policy=full,minimal",
            "--where", "batch>=2,policy!=minimal", "--out", str(out))
    expected = sorted(json.loads(line)["index"] for line in out.read_text().splitlines())
    axes = {"batch": [1, 2, 4, 8], "policy": ["full", "minimal"]}
    where = "batch>=2,policy!=minimal"
    assert list(hbmsim.sweep(axes, base=SWEEP_BASE, where=where)["index"]) == expected
    assert list(hbmsim.expand_sweep(axes, base=SWEEP_BASE, where=where)["index"]) == expected


@pytest.mark.parametrize("axes, where, names", [
    ({"no_such_field": [1]}, "", ["no_such_field"]),
    ({"batch": [1, 2]}, "policy==full", ["policy"]),
    ({"batch": []}, "", ["batch"]),
])
def test_bad_sweep_raises_value_error(axes, where, names):
    with pytest.raises(ValueError) as err:
        hbmsim.sweep(axes, base=SWEEP_BASE, where=where)
    for n in names:
        assert n in str(err.value)


def test_reproduce_equals_cli(cli):
    expected = cli_json(cli, "reproduce", "--json")
    rep = hbmsim.reproduce()
    assert rep.raw == expected
    assert list(rep.runs["id"]) == [r["id"] for r in expected["runs"]]
    for (_, row), r in zip(rep.runs.iterrows(), expected["runs"]):
        assert row["predicted_tflops_per_device"] == r["predicted"]["tflops_per_device"]
        assert row["predicted_hbm_gib"] == r["predicted"]["hbm_peak_bytes"] / 2**30
        reported = r["reported"]["tflops_per_device"]
        assert (math.isnan(row["reported_tflops_per_device"]) if reported is None
                else row["reported_tflops_per_device"] == reported)
    assert list(rep.claims["claim"]) == [c["claim"] for c in expected["claims"]]
    assert list(rep.claims["holds"]) == [c["holds"] for c in expected["claims"]]


def test_concurrent_calls_from_threads_match_serial():
    # The GIL is released while C++ runs: threads must still get exactly the serial results.
    configs = [dict(LLAMA_405B, batch=b) for b in (1, 2, 4)] + [dict(DSV3, batch=b) for b in (2, 4, 8)]
    serial = [dict(hbmsim.simulate(c)) for c in configs]
    with ThreadPoolExecutor(max_workers=3) as pool:
        threaded = list(pool.map(lambda c: dict(hbmsim.simulate(c)), configs))
    assert threaded == serial


def test_package_metadata():
    assert hbmsim.__version__ == _hbmsim.__version__
    assert "batch" in hbmsim.fields() and "mla_q" in hbmsim.checkpoint_names()
    assert all(name.startswith("systems/") for name in hbmsim.data_files("systems/"))
    assert len(hbmsim.data_files("systems/")) == len(hbmsim.systems())
    assert isinstance(hbmsim.simulate(), hbmsim.Result)
    assert isinstance(hbmsim.sweep({"batch": [1]}), pd.DataFrame)


def test_numpy_values_are_plain_json_values():
    import numpy as np

    plain = hbmsim.simulate(LLAMA_405B, batch=1, lhs=False, memory_limit_slop=0.9)
    assert dict(hbmsim.simulate(LLAMA_405B, batch=np.int64(1), lhs=np.bool_(False),
                                memory_limit_slop=np.float64(0.9))) == dict(plain)
    df = hbmsim.sweep({"batch": np.array([1, 2]), "lhs": [np.bool_(False)]}, base=dict(LLAMA_405B, memory_limit_slop=0.9))
    assert df.loc[df.batch == 1, "step_time_s"].item() == plain.step_time_s
    with pytest.raises(ValueError, match="batch"):
        hbmsim.simulate(batch=2**70)


def test_field_table_equals_cli(cli):
    # One table feeds the CLI's flags and help, the config keys and this frame.
    table = hbmsim.field_table()
    assert list(table.index) == hbmsim.fields()
    assert _hbmsim.field_table() == cli_json(cli, "fields", "--json")
    assert table.loc["cp", "flag"] == "--cp" and table.loc["lhs", "default"] == "on"
    assert "``cp_exchange``" in hbmsim.api.__doc__


def test_switches_take_the_cli_words():
    # A boolean field accepts on/off as the CLI flag does, and means the same.
    base = dict(system="h200-hgx", model="llama3.1-8b", gpus=8, policy="qkv_proj_offloaded")
    assert hbmsim.simulate(dict(base, lhs="off")).step_time_s == hbmsim.simulate(dict(base, lhs=False)).step_time_s
    assert hbmsim.simulate(dict(base, lhs="on")).step_time_s == hbmsim.simulate(dict(base, lhs=True)).step_time_s
    with pytest.raises(ValueError, match='lhs = "maybe"'):
        hbmsim.simulate(dict(base, lhs="maybe"))


ON_OFF_SPELLINGS = ["on", "off", "true", "false", "yes", "no", "1", "0"]
FLAG_TEXTS = {  # a valid flag text per number / integer field (the default config otherwise)
    "gpus": "16", "batch": "2", "micro_batch": "0", "global_batch": "0", "seq": "2048", "grad_accum": "2", "fsdp": "0",
    "tp": "2", "ep": "1", "dp": "1", "cp": "1", "pp": "1", "vp": "1", "microbatches": "0", "first_stage_layers": "0",
    "last_stage_layers": "0", "moe_batch_split": "1", "memory_limit_slop": "0.9", "host_link_bytes_per_s": "3.3e10",
    "hbm_bytes": "9.6e10", "scale_up_bytes_per_s": "1.8e12", "scale_out_bytes_per_s": "1e11", "offload_layers": "0",
    "recompute_layers": "4", "mtp_layers": "1", "expert_tp": "0", "moe_load_imbalance": "1.4", "max_ops": "3000000",
    "moe_capacity_factor": "1.5", "moe_paged_stash": "0", "moe_dispatcher_sms": "32", "hbm_bandwidth_bytes_per_s": "1.6e13", "bf16_flops_per_s": "5e15",
    "host_memory_bytes": "9.6e11",
}
TEXT_VALUES = {"policy": "save_qkv_proj", "weights": "fp8", "attention_dtype": "fp8", "cp_exchange": "ring",
               "pp_p2p": "blocking", "mesh_order": "megatron", "pp_schedule": "gpipe", "system": "h200-hgx",
               "model": "llama3.1-70b", "layer_policies": "0-3:minimal", "optimizer_offload": "device",
               "moe_dispatcher": "flex", "optimizer_moments_dtype": "bf16"}


# On/off fields that are bad input on the default config get the fields they need (as flags and keywords).
FIELD_CONTEXT = {"ep_overlap": {"model": "deepseek-v3-671b", "gpus": "8", "ep": "8", "policy": "minimal"},
                 "delay_wgrad": {"model": "deepseek-v3-671b", "gpus": "8", "ep": "8", "policy": "minimal", "ep_overlap": "on",
                                 "framework": "megatron"},
                 "moe_load_imbalance": {"model": "deepseek-v3-671b", "gpus": "8", "ep": "8"},
                 "moe_capacity_factor": {"model": "deepseek-v3-671b", "gpus": "8", "ep": "8", "framework": "megatron",
                                         "moe_dispatcher": "flex"},
                 "moe_dispatcher_sms": {"model": "deepseek-v3-671b", "gpus": "8", "ep": "8", "moe_dispatcher": "flex"}}


def _context_flags(table, field):
    return [x for k, v in FIELD_CONTEXT.get(field, {}).items() for x in (table.loc[k, "flag"], v)]


def _cli_or_error(cli, *args):
    p = run_cli(cli, "simulate", *args, "--json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else p.stderr


def _python_or_error(**kw):
    try:
        return dict(hbmsim.simulate(**kw))
    except ValueError as e:
        return e


def test_every_field_keyword_takes_the_cli_flag_spellings(cli):
    # Issue #20: a keyword takes what the same field's flag takes. Every on/off field with every spelling the
    # CLI reads (on/off, true/false, yes/no, 1/0), every number/integer field as text: the same report.
    table = hbmsim.field_table()
    on_off = [f for f in table.index if table.loc[f, "type"] == "on/off"]
    numbers = [f for f in table.index if table.loc[f, "type"] in ("integer", "number")]
    assert "lhs" in on_off and set(numbers) == set(FLAG_TEXTS), "a field was added: give it a flag text here"
    cases = [(f, s) for f in on_off for s in ON_OFF_SPELLINGS] + list(FLAG_TEXTS.items()) + list(TEXT_VALUES.items())
    for field, text in cases:
        expected = _cli_or_error(cli, *_context_flags(table, field), table.loc[field, "flag"], text)
        got = _python_or_error(**FIELD_CONTEXT.get(field, {}), **{field: text})
        assert isinstance(expected, dict), f"{table.loc[field, 'flag']} {text}: {expected}"
        assert got == expected, f"simulate({field}={text!r}) differs from {table.loc[field, 'flag']} {text}: {got}"
    # Python's own values mean the same: bools, and 1/0 as --lhs 1 / --lhs 0; numbers as numbers.
    for field in on_off:
        for value, text in [(True, "on"), (False, "off"), (1, "1"), (0, "0"), (np.int64(1), "1")]:
            assert dict(hbmsim.simulate(**FIELD_CONTEXT.get(field, {}), **{field: value})) == \
                _cli_or_error(cli, *_context_flags(table, field), table.loc[field, "flag"], text), (field, value)
    assert dict(hbmsim.simulate(batch=2, hbm_bytes=9.6e10)) == dict(hbmsim.simulate(batch="2", hbm_bytes="9.6e10"))


@pytest.mark.parametrize("field, text, message", [
    ("lhs", "ON", 'lhs = "ON" (expected on or off)'),
    ("lhs", "True", 'lhs = "True" (expected on or off)'),
    ("double_buffering", "2", 'double_buffering = "2" (expected on or off)'),
    ("gpus", "8.0", 'gpus = "8.0" (expected an integer)'),
    ("hbm_bytes", "lots", 'hbm_bytes = "lots" (expected a number)'),
    ("hbm_bytes", "1e400", "hbm_bytes = 1e400 (out of the range of a double)"),
    ("batch", "0", "batch = 0 (must be > 0)"),
])
def test_keyword_refuses_what_the_cli_flag_refuses(cli, field, text, message):
    flag = hbmsim.field_table().loc[field, "flag"]
    p = run_cli(cli, "simulate", flag, text, "--json", check=False)
    assert p.returncode != 0 and message in p.stderr.replace(flag + " =", field + " =")
    with pytest.raises(ValueError) as e:
        hbmsim.simulate(**{field: text})
    assert message in str(e.value)


def test_warnings_are_issued_as_the_cli_prints_them(cli):
    # DeepSeek-V3 on 256 GPUs without ep: the CLI's stderr line, as an HbmsimWarning, and in the result.
    p = subprocess.run([str(cli), "simulate", "--model", "deepseek-v3-671b", "--gpus", "256", "--seq", "1024"],
                       capture_output=True, text=True, check=True)
    expected = [line.removeprefix("hbmsim: warning: ") for line in p.stderr.splitlines()]
    assert len(expected) == 1 and "ep 1" in expected[0]
    with pytest.warns(hbmsim.HbmsimWarning) as caught:
        got = hbmsim.simulate(model="deepseek-v3-671b", gpus=256, seq=1024)
    assert [str(w.message) for w in caught] == expected == got.warnings
    assert got.run["degrees"]["fsdp"] == 256 and got.config["fsdp"] == 256


def test_no_warning_for_an_ordinary_run(recwarn):
    hbmsim.simulate(model="llama3.1-8b", gpus=8)
    assert not [w for w in recwarn if issubclass(w.category, hbmsim.HbmsimWarning)]
