"""Declared dependencies are required: a missing one fails the tests that need it instead of skipping them."""
import os
import subprocess
import sys

from conftest import SOURCE_DIR


def test_dask_tests_fail_not_skip_without_distributed(tmp_path):
    # A `distributed` package that cannot be imported, first on the path of a pytest run of test_dask.py.
    shadow = tmp_path / "shadow" / "distributed"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("No module named \'distributed\' (hidden by the test)")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), env.get("PYTHONPATH", "")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                        str(SOURCE_DIR / "tests" / "python" / "test_dask.py")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    out = p.stdout + p.stderr
    assert p.returncode != 0, f"test_dask.py passed without distributed:\n{out}"
    summary = out.strip().splitlines()[-1]
    assert "skipped" not in summary and "error" in summary, summary  # a collection error: the run fails
    assert "dask.distributed cannot be imported" in out and "declared dependency" in out, out
    assert "python3-distributed" in out, out
