"""The plan functions answer what `hbmsim plan ... --json` answers, for the same config."""
import re

import hbmsim
import pytest
from conftest import cli_json, run_cli


def test_largest_batch_equals_cli(cli):
    args = ["--model", "deepseek-v3-671b", "--gpus", "128", "--ep", "64", "--seq", "4096",
            "--policy", "qkv_proj_offloaded"]
    expected = cli_json(cli, "plan", "largest-batch", *args, "--json")
    got = hbmsim.plan_largest_batch(model="deepseek-v3-671b", gpus=128, ep=64, seq=4096, policy="qkv_proj_offloaded")
    assert list(got["variant"]) == [v["variant"] for v in expected]
    assert list(got["largest_batch"]) == [v["largest_batch"] for v in expected]
    assert list(got["stopped"]) == [v["stopped"] for v in expected]
    for row, v in zip(got.itertuples(), expected):
        assert row.tflops_per_device == v["report"]["tflops_per_device"]
        assert row.settings == v["settings"]
    # What stopped the offload variant is host memory, in the words of the report.
    offload = got[got["variant"] == "qkv_proj_offloaded"].iloc[0]
    assert "pinned host" in offload["stopped"]


def test_largest_batch_in_megatron_micro_batches_equals_cli(cli):
    # Llama 3.1 70B at tp 8 on 16 H100s: the search answers in micro-batches when the config gives one, and the
    # per-device search steps in eighths (one sequence per tensor-parallel replica) to the same micro-batch.
    args = ["--model", "llama3.1-70b", "--system", "h100-hgx", "--gpus", "16", "--tp", "8", "--seq", "8192",
            "--policy", "full", "--variant", "full=policy:full"]
    expected = cli_json(cli, "plan", "largest-batch", *args, "--micro-batch", "1", "--global-batch", "16", "--json")
    got = hbmsim.plan_largest_batch(model="llama3.1-70b", system="h100-hgx", gpus=16, tp=8, seq=8192, policy="full",
                                    micro_batch=1, global_batch=16, variants=["full=policy:full"])
    assert [v["field"] for v in expected] == ["micro_batch"]
    assert list(got["largest_batch"]) == [v["largest_batch"] for v in expected]
    assert list(got["micro_batch"]) == [v["micro_batch"] for v in expected]
    per_device = hbmsim.plan_largest_batch(model="llama3.1-70b", system="h100-hgx", gpus=16, tp=8, seq=8192,
                                           policy="full", variants=["full=policy:full"])
    assert per_device["largest_batch"][0] == expected[0]["micro_batch"] / 8
    assert per_device["micro_batch"][0] == expected[0]["micro_batch"]


def test_break_even_and_hbm_needed_equal_cli(cli):
    args = ["--model", "llama3.1-8b", "--policy", "qkv_proj_offloaded"]
    assert hbmsim.plan_break_even(model="llama3.1-8b", policy="qkv_proj_offloaded") == \
        cli_json(cli, "plan", "break-even", *args, "--json")
    assert hbmsim.plan_hbm_needed(model="llama3.1-8b", policy="qkv_proj_offloaded", batch=2) == \
        cli_json(cli, "plan", "hbm-needed", *args, "--batch", "2", "--json")


def test_best_policy_equals_cli(cli):
    expected = cli_json(cli, "plan", "best-policy", "--model", "llama3.1-8b", "--names", "query_proj,mlpwo", "--json")
    got = hbmsim.plan_best_policy(model="llama3.1-8b", names=["query_proj", "mlpwo"])
    assert got["method"] == expected["method"] and got["evaluated"] == expected["evaluated"] == 9
    assert got["best"] == expected["best"] and got["pareto"] == expected["pareto"]


def test_plan_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="offloads nothing"):
        hbmsim.plan_break_even(model="llama3.1-8b", policy="full")
    with pytest.raises(ValueError, match="tolerance"):
        hbmsim.plan_break_even(model="llama3.1-8b", policy="qkv_proj_offloaded", tolerance=1.5)


def test_largest_batch_refuses_a_max_batch_the_cli_refuses():
    # The CLI refuses --max-batch outside [1, 2^20]; Python used to answer "max_batch 0 is below the smallest
    # candidate" for every variant instead.
    for bad in (0, -5, 2 ** 20 + 1):
        with pytest.raises(ValueError, match=rf"max_batch = {bad} \(must be in \[1, 1048576\]\)"):
            hbmsim.plan.largest_batch({"model": "llama3.1-8b", "gpus": 8, "seq": 1024}, max_batch=bad)


def test_layout_equals_cli(cli):
    args = ["--model", "llama3.1-8b", "--gpus", "8", "--system", "h100-hgx", "--seq", "2048", "--global-batch", "16",
            "--top", "4", "--policies", "minimal,full"]
    expected = cli_json(cli, "plan", "layout", *args, "--json")
    got = hbmsim.plan_layout(model="llama3.1-8b", gpus=8, system="h100-hgx", seq=2048, global_batch=16, top=4,
                             policies=["minimal", "full"])
    assert len(got) == len(expected["top"]) == 4
    for row, t in zip(got.itertuples(), expected["top"]):
        assert (row.tp, row.cp, row.pp, row.vp, row.fsdp, row.dp) == tuple(t["degrees"][k] for k in ("tp", "cp", "pp", "vp", "fsdp", "dp"))
        assert row.tokens_per_s_per_device == t["report"]["tokens_per_s_per_device"]
        assert row.limit == t["limit"] and row.settings == t["settings"]
    assert got.attrs["global_batch"] == 16 and got.attrs["simulated"] == expected["simulated"]
    assert list(got["tokens_per_s_per_device"]) == sorted(got["tokens_per_s_per_device"], reverse=True)
    # Nothing fits: no rows, and the reason.
    none = hbmsim.plan_layout(model="llama3.1-405b", gpus=8, system="h100-hgx", seq=4096, policies=["full"])
    assert len(none) == 0 and "nothing fits" in none.attrs["none_fit"]
    with pytest.raises(ValueError, match="micro_batches 0"):
        hbmsim.plan_layout(model="llama3.1-8b", micro_batches=[0])
    # A negative top was a pybind11 overload TypeError (the option was unsigned); the CLI wrapped it to "all".
    with pytest.raises(ValueError, match=r"top = -1 \(must be at least 1\)"):
        hbmsim.plan_layout(model="llama3.1-8b", top=-1)
    # A policy or micro-batch given twice would list its layouts twice: refused before anything runs.
    with pytest.raises(ValueError, match=r"micro_batches 2 \(given twice\)"):
        hbmsim.plan_layout(model="llama3.1-8b", micro_batches=[2, 1, 2])
    with pytest.raises(ValueError, match=r"policies full \(given twice\)"):
        hbmsim.plan_layout(model="llama3.1-8b", policies=["full", "full"])


def test_layout_holds_the_degrees_given_as_keywords(cli):
    """tp=2 holds tp as the CLI's --tp 2 does (a config's tp is searched); policy= and micro_batch= are one-item
    lists; a held degree that divides no layout is refused with its name and value."""
    args = ["--model", "llama3.1-8b", "--gpus", "8", "--system", "h100-hgx", "--seq", "2048", "--top", "3"]
    expected = cli_json(cli, "plan", "layout", *args, "--tp", "2", "--policy", "full", "--micro-batch", "1", "--json")
    got = hbmsim.plan_layout(model="llama3.1-8b", gpus=8, system="h100-hgx", seq=2048, top=3, tp=2, policy="full", micro_batch=1)
    assert len(got) == 3 and set(got["tp"]) == {2} and set(got["policy"]) == {"full"} and set(got["micro_batch"]) == {1}
    assert got.attrs["held"] == expected["held"] == {"tp": 2}
    assert list(got["tokens_per_s_per_device"]) == [t["report"]["tokens_per_s_per_device"] for t in expected["top"]]
    searched = hbmsim.plan_layout({"model": "llama3.1-8b", "gpus": 8, "system": "h100-hgx", "seq": 2048, "tp": 2}, top=3)
    assert searched.attrs["candidates"] > got.attrs["candidates"] and searched.attrs["held"] == {}
    # A list holds the axis to its values, as --tp 2,4 does.
    listed = hbmsim.plan_layout(model="llama3.1-8b", gpus=8, system="h100-hgx", seq=2048, top=3, tp=[2, 4], policy="full",
                                micro_batch=1)
    expected = cli_json(cli, "plan", "layout", *args, "--tp", "2,4", "--policy", "full", "--micro-batch", "1", "--json")
    assert listed.attrs["held"] == expected["held"] == {"tp": [2, 4]} and set(listed["tp"]) <= {2, 4}
    assert list(listed["tokens_per_s_per_device"]) == [t["report"]["tokens_per_s_per_device"] for t in expected["top"]]
    with pytest.raises(ValueError, match=r'tp = "x" \(expected an integer\)'):  # the CLI's own words
        hbmsim.plan_layout(model="llama3.1-8b", gpus=8, tp=[2, "x"])
    with pytest.raises(ValueError, match=r"tp = 3 \(it does not divide the 8 GPUs\)"):
        hbmsim.plan_layout(model="llama3.1-8b", gpus=8, tp=3)
    with pytest.raises(ValueError, match=r"policy = 'full' \(with policies"):
        hbmsim.plan_layout(model="llama3.1-8b", gpus=8, policy="full", policies=["minimal"])


def test_scale_equals_cli(cli):
    """plan_scale answers what `plan scale --json` answers: a row per count, ascending, with the layout the CLI's
    search ranks first there, and the days the budget takes at its rate (by hand: tokens / (rate x GPUs) / 86,400)."""
    args = ["--model", "llama3.1-8b", "--system", "h100-hgx", "--seq", "2048", "--global-batch", "32",
            "--policies", "full,minimal", "--micro-batches", "1", "--gpus", "16,8", "--tokens", "1e11", "--days", "1000"]
    expected = cli_json(cli, "plan", "scale", *args, "--json")
    got = hbmsim.plan.scale(model="llama3.1-8b", system="h100-hgx", seq=2048, global_batch=32, policies=["full", "minimal"],
                            micro_batches=[1], gpus=[16, 8], tokens=1e11, days=1000)
    assert list(got["gpus"]) == [r["gpus"] for r in expected["rows"]] == [8, 16]
    for row, r in zip(got.itertuples(), expected["rows"]):
        t = r["search"]["top"][0]
        assert (row.tp, row.cp, row.pp, row.fsdp, row.dp, row.policy) == (*(t["degrees"][k] for k in ("tp", "cp", "pp", "fsdp", "dp")), t["policy"])
        assert row.tokens_per_s_per_device == t["report"]["tokens_per_s_per_device"]
        assert row.days == pytest.approx(1e11 / (row.tokens_per_s_per_device * row.gpus) / 86400, rel=1e-12)
        assert row.settings == t["settings"]
    assert got.attrs["fewest_within_days"] == expected["fewest_within_days"] == 8
    assert got.attrs["global_batch"] == 32
    # A held degree goes to each count's search, as the CLI's --tp does; bad counts are refused by name.
    held = hbmsim.plan_scale(model="llama3.1-8b", system="h100-hgx", seq=2048, global_batch=32, policy="full", micro_batch=1,
                             gpus=[8, 16], tp=2)
    assert set(held["tp"]) == {2} and held.attrs["held"] == {"tp": 2}
    with pytest.raises(ValueError, match=r"gpus = 8 \(given twice\)"):
        hbmsim.plan_scale(model="llama3.1-8b", gpus=[8, 8])
    with pytest.raises(ValueError, match=r"days = 3 \(a deadline needs a token budget\)"):
        hbmsim.plan_scale(model="llama3.1-8b", gpus=[8], days=3)


def test_scale_over_systems_equals_cli(cli):
    """plan_scale with a list of systems is a plan per system, as `plan scale --system a,b --json` gives them, each
    the plan of that system alone; `answer` marks the row the CLI's comparison lists (no deadline: the count with
    the most tokens/s in all, by hand from the rows)."""
    args = ["--model", "llama3.1-8b", "--seq", "2048", "--global-batch", "32", "--policies", "full", "--micro-batches", "1",
            "--gpus", "8,16"]
    expected = cli_json(cli, "plan", "scale", *args, "--system", "h100-hgx,h200-hgx", "--json")["systems"]
    got = hbmsim.plan_scale(model="llama3.1-8b", system=["h100-hgx", "h200-hgx"], seq=2048, global_batch=32, policy="full",
                            micro_batch=1, gpus=[8, 16])
    assert list(got["system"]) == ["h100-hgx", "h100-hgx", "h200-hgx", "h200-hgx"]
    for plan in expected:
        mine = got[got["system"] == plan["system"]]
        alone = hbmsim.plan_scale(model="llama3.1-8b", system=plan["system"], seq=2048, global_batch=32, policy="full",
                                  micro_batch=1, gpus=[8, 16])
        assert list(mine["tokens_per_s_per_device"]) == list(alone["tokens_per_s_per_device"]) == \
            [r["search"]["top"][0]["report"]["tokens_per_s_per_device"] for r in plan["rows"]]
        best = max(plan["rows"], key=lambda r: r["tokens_per_s"])["gpus"]
        assert list(mine.loc[mine["answer"], "gpus"]) == [best] == [plan["answer_gpus"]]
    assert got.attrs["fewest_within_days"] == {"h100-hgx": 0, "h200-hgx": 0}
    with pytest.raises(ValueError, match=r"give each system once"):
        hbmsim.plan_scale(model="llama3.1-8b", system=["h100-hgx", "h100-hgx"], gpus=[8])
    with pytest.raises(ValueError, match=r"nosuch"):
        hbmsim.plan_scale(model="llama3.1-8b", system=["h100-hgx", "nosuch"], gpus=[8])


def test_layout_default_policies_follow_the_framework(cli):
    """Without policies the search tries MaxText's presets, or under framework megatron Megatron's recompute
    choices; the CLI and Python agree (the Dask path splits the same list into tasks)."""
    from hbmsim import _hbmsim
    assert _hbmsim.layout_defaults({"framework": "megatron"})["policies"] == ["no_recompute", "selective", "full"]
    assert "minimal_offloaded" in _hbmsim.layout_defaults({})["policies"]
    args = ["--model", "llama3.1-8b", "--gpus", "8", "--system", "h100-hgx", "--seq", "2048", "--global-batch", "16",
            "--framework", "megatron", "--top", "6"]
    expected = cli_json(cli, "plan", "layout", *args, "--json")
    got = hbmsim.plan_layout(model="llama3.1-8b", gpus=8, system="h100-hgx", seq=2048, global_batch=16, framework="megatron", top=6)
    assert set(got["policy"]) <= {"no_recompute", "selective", "full"}
    assert list(got["policy"]) == [t["policy"] for t in expected["top"]]


def test_offload_layers_equals_cli(cli):
    args = ["--model", "llama3.1-70b", "--gpus", "64", "--batch", "2", "--seq", "8192", "--weights", "fp8",
            "--policy", "minimal_with_context"]
    expected = cli_json(cli, "plan", "offload-layers", *args, "--json")
    got = hbmsim.plan_offload_layers(model="llama3.1-70b", gpus=64, batch=2, seq=8192, weights="fp8",
                                     policy="minimal_with_context")
    assert got == expected and got["offload_layers"] > 0
    rec = hbmsim.plan_recompute_layers(model="llama3.1-70b", gpus=64, batch=2, seq=8192, weights="fp8",
                                       policy="no_recompute")
    assert rec == cli_json(cli, "plan", "recompute-layers", "--model", "llama3.1-70b", "--gpus", "64", "--batch", "2",
                           "--seq", "8192", "--weights", "fp8", "--policy", "no_recompute", "--json")
    assert rec["recompute_layers"] > 0


def test_best_policy_over_batches_equals_cli(cli):
    expected = cli_json(cli, "plan", "best-policy", "--model", "llama3.1-8b", "--gpus", "8", "--system", "h100-hgx",
                        "--names", "query_proj,mlpwo", "--batches", "1,2", "--json")
    got = hbmsim.plan_best_policy(model="llama3.1-8b", gpus=8, system="h100-hgx", names=["query_proj", "mlpwo"],
                                  batches=[1, 2])
    assert [r["batch"] for r in got] == [1, 2]
    assert [r["best"] for r in got] == [r["best"] for r in expected]
    with pytest.raises(ValueError, match="batches 0"):
        hbmsim.plan_best_policy(model="llama3.1-8b", batches=[0])
    # A batch or a name twice would run the same search twice, or place one tensor twice.
    with pytest.raises(ValueError, match=r"batches 1 \(given twice\)"):
        hbmsim.plan_best_policy(model="llama3.1-8b", batches=[1, 2, 1], names=["query_proj"])
    with pytest.raises(ValueError, match=r"--names mlpwo \(given twice\)"):
        hbmsim.plan_best_policy(model="llama3.1-8b", names=["mlpwo", "query_proj", "mlpwo"])


def test_plan_namespace_names_the_cli_subcommands(cli):
    """hbmsim.plan has one function per `hbmsim plan` subcommand, under its name (dashes as underscores), and
    each is the plan_ function the other tests check against the CLI."""
    listed = re.search(r"Subcommands:\n(.*?)\n\n", run_cli(cli, "plan", "--help").stdout, re.S).group(1)
    subcommands = {line.split()[0].replace("-", "_") for line in listed.splitlines()}
    assert set(hbmsim.plan.__all__) == subcommands
    for name in subcommands:
        assert getattr(hbmsim.plan, name) is getattr(hbmsim, "plan_" + name)
