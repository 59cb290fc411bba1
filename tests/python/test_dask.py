"""hbmsim.sweep on a Dask cluster (two worker processes) gives the local sweep, row for row."""
import os

import pandas as pd
import pytest

import hbmsim

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.filterwarnings("ignore:make_current is deprecated:DeprecationWarning")

LLAMA_405B = {"system": "gb200-nvl72", "model": "llama3.1-405b", "gpus": 128, "batch": 2, "seq": 8192,
              "weights": "nvfp4", "policy": "qkv_proj_offloaded", "lhs": True}
DSV3 = {"system": "gb200-nvl72", "model": "deepseek-v3-671b", "gpus": 128, "ep": 64, "batch": 8, "seq": 4096,
        "policy": "custom", "lhs": True, "pipelined_transfers": True}


@pytest.fixture(scope="module")
def client():
    # Workers are separate processes: they import hbmsim through the inherited PYTHONPATH.
    assert "PYTHONPATH" in os.environ, "the workers need PYTHONPATH to import hbmsim"
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                       host="127.0.0.1", silence_logs=40)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.mark.parametrize("case", ["llama-break-even", "dsv3-placements-with-where", "bad-points"])
def test_dask_sweep_equals_local(client, case):
    if case == "llama-break-even":
        axes = {"policy": ["qkv_proj_offloaded", "save_qkv_proj", "full"],
                "host_link_bytes_per_s": [4e9, 1e10, 2.5e10, 6.3e10, 1.6e11, 4e11]}
        base, where, chunks = LLAMA_405B, "", None
    elif case == "dsv3-placements-with-where":
        axes = {"batch": [1, 2, 4, 8, 16], "tensor.mla_q": ["remat", "device", "offload"],
                "tensor.moe_mlpwi_0": ["remat", "device", "offload"]}
        base, where, chunks = DSV3, "batch>=2,tensor.mla_q!=device", 7
    else:  # batch 0 and a bad dtype are bad input: error rows, identical on both sides
        axes = {"batch": [0, 1, 2], "weights": ["bf16", "fp8", "int3"]}
        base, where, chunks = LLAMA_405B, "", 3

    local = hbmsim.sweep(axes, base=base, where=where, jobs=2)
    remote = hbmsim.sweep(axes, base=base, where=where, client=client, chunks=chunks)
    assert len(local) > 0
    pd.testing.assert_frame_equal(local.sort_values("index").reset_index(drop=True),
                                  remote.sort_values("index").reset_index(drop=True), check_exact=True)
    pd.testing.assert_frame_equal(local, remote, check_exact=True)  # already sorted by index
    if case == "bad-points":
        assert (remote["error"] != "").sum() == 5  # batch 0 (3 dtypes) + int3 (batch 1, 2)
        assert (remote["error"] == "").sum() == 4

    # The work ran in the worker processes: they (not just this process) have loaded the extension.
    def pid_and_loaded():  # nested: cloudpickle ships it by value, the workers need not import this file
        import os as os_
        import sys as sys_

        return os_.getpid(), "hbmsim._hbmsim" in sys_.modules

    info = client.run(pid_and_loaded)
    assert len(info) == 2
    assert any(loaded for _, loaded in info.values())
    assert os.getpid() not in {pid for pid, _ in info.values()}


def test_dask_sweep_of_no_points(client):
    df = hbmsim.sweep({"batch": [1, 2]}, base=LLAMA_405B, where="batch>4", client=client)
    assert len(df) == 0 and list(df.columns) == ["index", "batch", "error"]


def test_dask_sweep_bad_axis_fails_before_submitting(client):
    with pytest.raises(ValueError, match="no_such_field"):
        hbmsim.sweep({"no_such_field": [1]}, base=LLAMA_405B, client=client)
