"""The samples as the cuda-sim tests run them: the ones the emulator runs in seconds at their own shapes, the
others as their small variants (samples/make_samples.py SMALL), each with onnxruntime's outputs."""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

SAMPLES_DIR = Path(__file__).resolve().parents[4] / "samples"
sys.path.insert(0, str(SAMPLES_DIR))
import make_samples as ms  # noqa: E402

from engine.frontend.importer import load_graph  # noqa: E402

NAMES = [s.name for s in ms.SAMPLES if s.name != "bert12"]  # bert12 is a scheduling benchmark (12 layers)
SMALL = sorted(ms.SMALL)  # run at small shapes: too slow to emulate at their own in the default test run
POLICIES = ("unfused", "elementwise", "stitch", "welder")
_DIR = Path(tempfile.mkdtemp(prefix="tw_simt_samples_"))
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)


@cache
def sample(name: str, small: bool | None = None):
    """(graph, inputs, onnxruntime outputs) of `name`, small (SMALL) by default where it has a variant."""
    small = name in ms.SMALL if small is None else small
    if small:
        model, inputs = ms.build_small(name)
    else:
        model, inputs = ms.build(next(s for s in ms.SAMPLES if s.name == name))
        assert inputs is not None, f"{name} has no inputs at its own shapes"
    path = _DIR / f"{name}{'_small' if small else ''}.onnx"
    path.write_bytes(model.SerializeToString())
    return load_graph(path), inputs, ms.run_reference(model, inputs)


def assert_matches(got: dict, want: dict, tol: float = 1e-4) -> None:
    assert set(got) == set(want)
    for k in want:
        w = np.asarray(want[k], np.float64)
        err = np.abs(np.asarray(got[k], np.float64) - w).max() / max(np.abs(w).max(), 1e-30)
        assert err < tol, f"{k}: relative error {err:.2e}"
