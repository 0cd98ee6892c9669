"""The bundle's run_bundle.py (engine/bundle/runner.py) runs without tileweave: unpacked into a fresh
virtual environment holding only NumPy, `--backend cpu` builds the C source and matches onnxruntime and
tileweave's own CPU backend; bad input is one line and exit code 2."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from engine.bundle.export import export_bundle
from engine.frontend.importer import load_graph
from engine.runtime.execute import run_model
from engine.schedule.policies import make_plan

SAMPLE = Path(__file__).resolve().parents[3] / "samples" / "layernorm_residual.onnx"


@pytest.fixture(scope="module")
def numpy_only_python(tmp_path_factory) -> Path:
    """python of a new virtual environment with NumPy and nothing else (pip may take it from its cache)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "numpy"], capture_output=True, text=True)
    if pip.returncode != 0:
        pytest.skip(f"pip cannot install numpy here: {pip.stderr.strip().splitlines()[-1:]}")
    return python


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    graph = load_graph(SAMPLE)
    plan = make_plan(graph, "welder", "a100")
    folder = tmp_path_factory.mktemp("bundle")
    with zipfile.ZipFile(io.BytesIO(export_bundle(graph, plan, "a100"))) as z:
        z.extractall(folder)
    rng = np.random.default_rng(21)
    feeds = {t.name: rng.standard_normal(t.shape).astype(t.dtype.np) for t in graph.inputs}
    np.savez(folder / "in.npz", **feeds)
    return graph, plan, folder, feeds


def test_bundle_runs_on_the_cpu_with_only_numpy_and_matches_onnxruntime(numpy_only_python, unpacked):
    import onnxruntime as ort

    graph, plan, folder, feeds = unpacked
    proc = subprocess.run([str(numpy_only_python), "-I", "run_bundle.py", "--inputs", "in.npz", "--outputs",
                           "out.npz", "--backend", "cpu", "--repeat", "2"], cwd=folder, capture_output=True,
                          text=True)  # -I: no PYTHONPATH, no user site: the venv's NumPy alone
    assert proc.returncode == 0, proc.stderr
    assert "measured, wall clock, median of 2" in proc.stdout
    with np.load(folder / "out.npz") as data:
        got = {k: data[k] for k in data.files}
    sess = ort.InferenceSession(str(SAMPLE), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(names, feeds)))
    assert set(got) == set(want)
    for name in want:
        err = np.abs(got[name] - want[name]).max() / np.abs(want[name]).max()
        assert err < 1e-4, f"{name}: relative error {err:.2e}"
    ours = run_model(graph, feeds, backend="cpu", plan=plan).outputs  # same C, same options: same bits
    assert all(np.array_equal(got[k], ours[k]) for k in want)


def test_bad_input_is_one_line_and_exit_code_2(unpacked, tmp_path):
    _, _, folder, feeds = unpacked
    name = next(iter(feeds))
    np.savez(tmp_path / "short.npz", **{name: feeds[name][:1]})
    cases = [(["--inputs", str(tmp_path / "nope.npz")], "cannot read"),
             (["--inputs", str(tmp_path / "short.npz")], f"input '{name}' has shape")]
    for args, expect in cases:
        proc = subprocess.run([sys.executable, "-I", "run_bundle.py", *args, "--outputs", str(tmp_path / "o.npz"),
                               "--backend", "cpu"], cwd=folder, capture_output=True, text=True)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: ") and expect in err[0], err
