"""hbmsim.sweep and hbmsim.plan_layout on a Dask cluster (two worker processes) give the local answers; the
sweep row for row also when a worker process dies in the middle of it."""
import os
import signal
import threading
import time

import pandas as pd
import pytest

import hbmsim

try:
    import distributed
except ImportError as e:  # a declared dependency (python3-distributed): its absence is a failure, not a skip
    pytest.fail(f"dask.distributed cannot be imported ({e}); it is a declared dependency of hbmsim.sweep(client=...) "
                "and these tests must run: install it (Debian/Ubuntu: apt install python3-distributed)",
                pytrace=False)
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


# Pipelined Llama 405B points take ~0.1 s each: 96 of them in 24 chunks keep two workers busy for seconds.
PIPELINED = {"system": "gb200-nvl72", "model": "llama3.1-405b", "gpus": 128, "tp": 4, "pp": 8, "seq": 8192,
             "embedding_as_layer": True, "loss_as_layer": True}
PIPELINED_AXES = {"microbatches": [8, 16, 32, 64], "vp": [1, 2, 4], "seq": [4096, 8192],
                  "policy": ["full", "save_qkv_proj"], "batch": [1, 2]}


def test_dask_sweep_with_a_worker_killed_midway_equals_the_local_sweep():
    """Issue #20: a worker process killed (SIGKILL) while the sweep runs, after it has finished some chunks
    and while it runs another: the rows it held and the chunk it ran are computed again elsewhere; no row is
    lost or duplicated, and the frame equals the local sweep's."""
    local = hbmsim.sweep(PIPELINED_AXES, base=PIPELINED, jobs=4)
    assert len(local) == 96 and (local["error"] == "").sum() > 80
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0",
                                       host="127.0.0.1", silence_logs=50)
    client = distributed.Client(cluster)
    try:
        client.wait_for_workers(2)
        pids = client.run(os.getpid)
        out: dict = {}

        def run():
            try:
                out["df"] = hbmsim.sweep(PIPELINED_AXES, base=PIPELINED, client=client, chunks=24)
            except BaseException as e:  # noqa: BLE001 - reported below
                out["error"] = e

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        victim, deadline = None, time.monotonic() + 120
        while victim is None and time.monotonic() < deadline and thread.is_alive():
            holding = {w for ws in client.who_has().values() for w in ws}  # workers holding finished chunks
            busy = {w for w, keys in client.processing().items() if keys}
            candidates = sorted(holding & busy) or (sorted(busy) if holding else [])
            if candidates:
                victim = candidates[0]
            else:
                time.sleep(0.02)
        assert victim is not None and thread.is_alive() and "df" not in out, \
            "the sweep ended before a worker could be killed in the middle of it: make it longer"
        os.kill(pids[victim], signal.SIGKILL)
        thread.join(timeout=240)
        assert not thread.is_alive(), "the sweep did not finish after the worker was killed"
        assert "error" not in out, f"the sweep failed after the worker was killed: {out.get('error')!r}"
        remote = out["df"]

        assert remote["index"].is_unique and len(remote) == len(local)
        pd.testing.assert_frame_equal(local, remote, check_exact=True)
        client.wait_for_workers(2, timeout=60)  # the nanny restarted the killed worker
        assert pids[victim] not in set(client.run(os.getpid).values())
    finally:
        client.close()
        cluster.close()


class AtLeastOnceClient:
    """A client that delivers as a worker failure can: one chunk's rows twice (it ran again and both results
    arrived), and one chunk not at all the first time; it runs the tasks in this process."""

    def __init__(self):
        self.keys, self.gathers = [], 0

    def scheduler_info(self):
        return {"workers": {"tcp://a": {}, "tcp://b": {}}}

    def submit(self, fn, *args, key=None, **kwargs):
        self.keys.append(key)
        return lambda: fn(*args)

    def gather(self, futures):
        self.gathers += 1
        results = [f() for f in futures]
        if self.gathers == 1 and len(results) >= 3:
            results[1] = results[1] + results[0]  # chunk 0 delivered twice
            results[2] = []  # chunk 2 lost
        return results


def test_dask_sweep_merges_rows_by_point_each_once():
    axes = {"batch": [1, 2, 4], "policy": ["full", "save_qkv_proj", "qkv_proj_offloaded"]}
    local = hbmsim.sweep(axes, base=LLAMA_405B)
    fake = AtLeastOnceClient()
    remote = hbmsim.sweep(axes, base=LLAMA_405B, client=fake, chunks=4)
    pd.testing.assert_frame_equal(local, remote, check_exact=True)
    assert fake.gathers == 2, "the lost chunk's points were run once more"
    # Tasks are keyed by what they compute: the same sweep gives the same keys, another sweep other keys.
    keys = list(fake.keys)
    hbmsim.sweep(axes, base=LLAMA_405B, client=AtLeastOnceClient(), chunks=4)
    again = AtLeastOnceClient()
    hbmsim.sweep(axes, base=LLAMA_405B, client=again, chunks=4)
    assert again.keys == keys and len(set(keys)) == len(keys)
    other = AtLeastOnceClient()
    hbmsim.sweep(axes, base={**LLAMA_405B, "seq": 4096}, client=other, chunks=4)
    assert not set(other.keys) & set(keys)


def test_dask_plan_layout_equals_local(client):
    """plan_layout(client=...): one task per (policy, micro-batch) share, merged into the local search's top
    list (same layouts, same tokens/s); the counts add up to at least the local search's candidates."""
    cfg = dict(model="llama3.1-8b", gpus=8, system="h100-hgx", seq=2048, global_batch=16)
    local = hbmsim.plan_layout(top=5, policies=["full", "save_qkv_proj"], **cfg)
    remote = hbmsim.plan_layout(top=5, policies=["full", "save_qkv_proj"], client=client, **cfg)
    assert len(local) == 5
    key = ["tp", "cp", "pp", "vp", "fsdp", "dp", "micro_batch", "policy", "tokens_per_s_per_device"]
    pd.testing.assert_frame_equal(local[key].reset_index(drop=True), remote[key].reset_index(drop=True))
    # Every share enumerates its candidates: together exactly the local search's.
    assert remote.attrs["candidates"] == local.attrs["candidates"]
    assert remote.attrs["simulated"] >= local.attrs["simulated"]
    # A held degree reaches every task.
    held = hbmsim.plan_layout(top=3, policies=["full", "save_qkv_proj"], client=client, tp=2, **cfg)
    assert len(held) == 3 and set(held["tp"]) == {2}
    with pytest.raises(ValueError, match="no_such_model|model"):
        hbmsim.plan_layout(model="no_such_model", client=client)
