"""Every notebook executes top to bottom in a /usr/bin/python3 kernel and writes non-blank PNG figures."""
import json
import os
import runpy
import time
from pathlib import Path

import nbformat
import numpy as np
import pytest
from jupyter_client.manager import KernelManager
from matplotlib.image import imread
from nbclient import NotebookClient

import hbmsim
from conftest import SOURCE_DIR

NOTEBOOKS = SOURCE_DIR / "notebooks"
EXPECTED = {
    "01_reproduce_gb200.ipynb": ["01_predicted_vs_reported.png", "01_dsv3_hbm_timeline.png",
                                 "01_dsv3_resource_timeline.png", "01_dsv3_resource_timeline_zoom.png"],
    "02_capacity_planning.ipynb": ["02_dsv3_tflops_vs_batch_gb200-nvl72.png", "02_dsv3_tflops_vs_batch_gb300-nvl72.png",
                                   "02_dsv3_tflops_vs_batch_vr-nvl144.png", "02_dsv3_pareto_gb200-nvl72.png",
                                   "02_llama405b_host_link_break_even.png"],
    "03_calibration.ipynb": ["03_residuals_tflops.png", "03_residuals_hbm.png"],
    "04_layout_planning.ipynb": ["04_best_layout_per_system.png"],
}
WITH_PROFILE = ["03_predicted_vs_reported_calibrated.png"]
# Each notebook within a minute and a half on 2 cores beside the other tests: 04's six layout searches take the
# longest (on GB200 and Vera Rubin about 300 layouts each reach a simulation before the bound stops the search).
TIME_LIMIT_S = 90


@pytest.fixture
def fig_dir(tmp_path, monkeypatch):
    d = Path(os.environ.get("HBMSIM_FIG_DIR") or tmp_path / "figures")
    monkeypatch.setenv("HBMSIM_FIG_DIR", str(d))  # the kernel inherits this process's environment
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    assert "PYTHONPATH" in os.environ, "the kernel needs PYTHONPATH to import hbmsim"
    return d


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("kernel")


def execute(name, kernel_dir):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    # The kernel talks over Unix sockets in kernel_dir, not TCP: its TCP ports are picked free and bound a moment
    # later, and once a test running beside this one (the Dask cluster's processes) took one in between
    # (ZMQError: Address already in use, the kernel dead before replying).
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(kernel_dir / "ipc"))
    start = time.monotonic()
    NotebookClient(nb, km=km, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb, time.monotonic() - start


def check_png(path):
    assert path.exists(), f"{path} was not written"
    img = imread(path)
    assert img.ndim == 3 and img.shape[0] >= 200 and img.shape[1] >= 300, img.shape
    assert float(np.std(img[..., :3])) > 0.02, f"{path} looks blank"


def text_outputs(nb):
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") + o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def test_notebooks_are_what_make_notebooks_writes(tmp_path):
    runpy.run_path(str(NOTEBOOKS / "make_notebooks.py"), run_name="make")["main"](tmp_path)
    for name in EXPECTED:
        generated = json.loads((tmp_path / name).read_text())
        committed = json.loads((NOTEBOOKS / name).read_text())
        assert committed == generated, f"{name} differs from make_notebooks.py: rerun it"
        nbformat.validate(nbformat.reads(json.dumps(committed), as_version=4))
        assert all(not c.get("outputs") for c in committed["cells"]), f"{name} is committed with outputs"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_notebook_runs_and_writes_figures(fig_dir, kernel_dir, monkeypatch, name):
    monkeypatch.delenv("HBMSIM_PROFILE", raising=False)
    for png in EXPECTED[name] + WITH_PROFILE:
        (fig_dir / png).unlink(missing_ok=True)
    nb, seconds = execute(name, kernel_dir)
    print(f"{name}: {seconds:.1f} s")
    for png in EXPECTED[name]:
        check_png(fig_dir / png)
    if name == "03_calibration.ipynb" and not hbmsim.data_files("profiles/"):
        assert "none (datasheet figures only)" in text_outputs(nb)
        assert not (fig_dir / WITH_PROFILE[0]).exists()
    assert seconds < TIME_LIMIT_S


def test_calibration_notebook_with_a_profile(fig_dir, kernel_dir, monkeypatch, tmp_path):
    profile = {"format": "hbmsim-profile/1", "name": "test-profile", "source": "tests/python/test_notebooks.py",
               "host_link": {"h2d_bytes_per_s": 1.2e11, "d2h_bytes_per_s": 1.3e11},
               "parameters": {"gemm_scale": 0.8}}
    path = tmp_path / "test-profile.json"
    path.write_text(json.dumps(profile))
    hbmsim.profile(str(path))  # valid
    assert hbmsim.system("gb200-nvl72", str(path))["host_h2d_bytes_per_s_per_gpu"] != \
        hbmsim.system("gb200-nvl72")["host_h2d_bytes_per_s_per_gpu"]
    monkeypatch.setenv("HBMSIM_PROFILE", str(path))
    d = fig_dir / "with_profile"
    monkeypatch.setenv("HBMSIM_FIG_DIR", str(d))
    for png in EXPECTED["03_calibration.ipynb"] + WITH_PROFILE:
        (d / png).unlink(missing_ok=True)
    nb, seconds = execute("03_calibration.ipynb", kernel_dir)
    print(f"03_calibration.ipynb with a profile: {seconds:.1f} s")
    for png in EXPECTED["03_calibration.ipynb"] + WITH_PROFILE:
        check_png(d / png)
    assert "calibrated (test-profile)" in text_outputs(nb)
    assert seconds < TIME_LIMIT_S
