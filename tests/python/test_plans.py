"""The plan functions answer what `hbmsim plan ... --json` answers, for the same config."""
import hbmsim
import pytest
from conftest import cli_json


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
