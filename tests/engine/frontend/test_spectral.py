"""DFT and STFT (engine/frontend/ops/spectral.py: contractions with constant cosine and sine tables) against
onnxruntime — forward, inverse, onesided, irfft, dft_length padding and cutting, any axis, windows and hops — and a
log-magnitude spectrogram front end on the C backend under every policy and under the SIMT emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, graph_model, max_rel_error, ort_outputs  # noqa: E402

from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402

# input shape, dft_length (None: the axis'), axis, inverse, onesided
DFTS = [((2, 12, 3, 1), None, 1, 0, 0), ((2, 12, 3, 2), None, 1, 0, 0), ((2, 5, 8, 1), 6, 2, 0, 1),
        ((1, 10, 4, 2), 16, 1, 1, 0), ((3, 9, 2), 7, 1, 0, 0), ((1, 7, 3, 2), None, 1, 1, 1), ((1, 6, 3, 2), 9, 1, 1, 1)]


@pytest.mark.parametrize(("shape", "n", "axis", "inverse", "onesided"), DFTS)
def test_dft_matches_onnxruntime(shape, n, axis, inverse, onesided):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    consts = {"axis": np.asarray(axis, np.int64)}
    ins = ["x", "", "axis"]
    if n is not None:
        consts["n"] = np.asarray(n, np.int64)
        ins[1] = "n"
    model = graph_model([helper.make_node("DFT", ins, ["y"], inverse=inverse, onesided=onesided)], {"x": x}, consts,
                        opset=20)
    got = run_reference(lower(import_onnx(model)), {"x": x})["y"]
    if inverse and onesided and n is not None and n % 2:
        # onnxruntime's irfft of odd length disagrees with numpy's (and the ONNX reference's, which is numpy's)
        want = np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=n, axis=axis)[..., None]
    else:
        want = ort_outputs(model, {"x": x})[0]
    assert max_rel_error(got, want) < 1e-5


@pytest.mark.parametrize("window", [None, "hann"])
def test_stft_matches_onnxruntime(window):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 100, 1)).astype(np.float32)
    consts, ins = {"step": np.asarray(8, np.int64)}, ["x", "step", "", "length"]
    consts["length"] = np.asarray(16, np.int64)
    if window:
        consts["w"] = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32)
        ins[2] = "w"
    model = graph_model([helper.make_node("STFT", ins, ["y"])], {"x": x}, consts, opset=17)
    got = run_reference(lower(import_onnx(model)), {"x": x})["y"]
    assert got.shape == (2, 11, 9, 2)
    assert max_rel_error(got, ort_outputs(model, {"x": x})[0]) < 1e-5


def _spectrogram(path: Path) -> Path:
    """An audio front end as exported with the model: STFT with a Hann window, power, log, a 1x1 conv over the
    frequency bins (a learned filterbank) and a ReLU."""
    rng = np.random.default_rng(4)
    consts = {"step": np.asarray(16, np.int64), "w": np.hanning(32).astype(np.float32),
              "two": np.asarray([2.0], np.float32), "axes": np.asarray([-1], np.int64),
              "eps": np.asarray(1e-6, np.float32), "fb": (rng.random((8, 17, 1, 1)) * 0.2).astype(np.float32),
              "two_axis": np.asarray([2], np.int64), "length": np.asarray(32, np.int64)}
    nodes = [helper.make_node("STFT", ["x", "step", "w", "length"], ["s"]), helper.make_node("Pow", ["s", "two"], ["p"]),
             helper.make_node("ReduceSum", ["p", "axes"], ["power"], keepdims=0),
             helper.make_node("Add", ["power", "eps"], ["pe"]), helper.make_node("Log", ["pe"], ["lp"]),
             helper.make_node("Transpose", ["lp"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Unsqueeze", ["t", "two_axis"], ["img"]),
             helper.make_node("Conv", ["img", "fb"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    onnx.save(graph_model(nodes, {"x": np.zeros((1, 256, 1), np.float32)}, consts, opset=17), path)
    return path


def _spectrogram_feeds() -> dict:
    return {"x": np.random.default_rng(5).standard_normal((1, 256, 1)).astype(np.float32)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_spectrogram_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_spectrogram(tmp_path / "spec.onnx"), _spectrogram_feeds(), policy=policy)


def test_spectrogram_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_spectrogram(tmp_path / "spec.onnx"), _spectrogram_feeds(), backend="cuda-sim")


def test_a_transform_along_the_components_axis_is_refused_in_one_line():
    x = np.zeros((2, 4, 2), np.float32)
    model = graph_model([helper.make_node("DFT", ["x", "", "axis"], ["y"])], {"x": x},
                        {"axis": np.asarray(-1, np.int64)}, {"y": TensorProto.FLOAT}, opset=20)
    with pytest.raises(UnsupportedOpError, match="not its last") as err:
        lower(import_onnx(model))
    assert "\n" not in str(err.value)
