"""Checks on the committed sample models in samples/ (see samples/make_samples.py)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
CATALOG = json.loads((SAMPLES / "catalog.json").read_text())
BY_NAME = {e["name"]: e for e in CATALOG}
WITH_IO = [e["name"] for e in CATALOG if e["io"]]
# Samples without stored I/O that are still cheap enough to run with random inputs.
RUN_WITHOUT_IO = [e["name"] for e in CATALOG if not e["io"] and e["category"] != "scale"]
ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(bool)": np.bool_, "tensor(int64)": np.int64}
MAX_TOTAL_BYTES = 30_000_000


def _session(entry: dict) -> ort.InferenceSession:
    return ort.InferenceSession(str(SAMPLES / entry["file"]), providers=["CPUExecutionProvider"])


def _load_script():
    spec = importlib.util.spec_from_file_location("make_samples", SAMPLES / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look the module up while it executes
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # keep samples/ free of __pycache__
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


def test_catalog_structure():
    keys = {"name", "file", "io", "description", "category", "opset"}
    assert CATALOG[0]["name"] == "bert_layer"
    assert [e["name"] for e in CATALOG if e.get("default")] == ["bert_layer"]
    assert len(BY_NAME) == len(CATALOG), "duplicate sample names"
    for e in CATALOG:
        assert keys <= e.keys(), e["name"]
        assert e["category"] in {"whole-model", "memory-intensive", "scale"}
        assert e["file"] == f"{e['name']}.onnx"
        assert e["io"] in (None, f"{e['name']}.io.npz")
        assert isinstance(e["opset"], int) and e["description"]
    assert BY_NAME["bert12"]["category"] == "scale" and BY_NAME["bert12"]["io"] is None
    listed = {e["file"] for e in CATALOG} | {e["io"] for e in CATALOG if e["io"]}
    on_disk = {p.name for p in SAMPLES.iterdir() if p.name.endswith((".onnx", ".npz"))}
    assert on_disk == listed, "samples/ and catalog.json disagree"


@pytest.mark.parametrize("name", list(BY_NAME))
def test_model_is_valid_and_loads(name):
    entry = BY_NAME[name]
    path = SAMPLES / entry["file"]
    assert path.is_file()
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 13, "onnxruntime 1.31 refuses IR versions above 13"
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets.get("", opsets.get("ai.onnx")) == entry["opset"]
    for value in [*model.graph.input, *model.graph.output]:
        assert value.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL)
    _session(entry)


def test_bert12_is_small():
    assert (SAMPLES / "bert12.onnx").stat().st_size < 200_000


@pytest.mark.parametrize("name", WITH_IO)
def test_reference_io_reproduces(name):
    entry = BY_NAME[name]
    sess = _session(entry)
    data = np.load(SAMPLES / entry["io"])
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    assert set(data.files) == set(in_names) | set(out_names)
    feeds = {}
    for meta in sess.get_inputs():
        arr = data[meta.name]
        assert arr.dtype == ORT_TO_NUMPY[meta.type], meta.name
        assert list(arr.shape) == meta.shape, meta.name
        assert np.any(arr != 0), f"input {meta.name} is all zeros"
        feeds[meta.name] = arr
    results = sess.run(out_names, feeds)
    for out_name, got in zip(out_names, results, strict=True):
        want = data[out_name]
        assert got.shape == want.shape and got.dtype == want.dtype
        assert np.isfinite(want).all()
        atol = 1e-5 * float(np.abs(want).max())  # near-zero entries: tolerance relative to the output's scale
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol, err_msg=f"{name}:{out_name}")


@pytest.mark.parametrize("name", RUN_WITHOUT_IO)
def test_runs_without_io(name):
    sess = _session(BY_NAME[name])
    rng = np.random.default_rng(0)
    feeds = {}
    for meta in sess.get_inputs():
        assert meta.type == "tensor(float)"
        feeds[meta.name] = rng.standard_normal(meta.shape).astype(np.float32)
    for out in sess.run(None, feeds):
        assert np.isfinite(out).all()


def test_total_size():
    # samples/zoo/ has its own budget (tests/samples/test_zoo.py).
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file() and SAMPLES / "zoo" not in p.parents)
    assert total < MAX_TOTAL_BYTES, f"samples/ is {total / 1e6:.1f} MB"


def test_committed_models_match_script():
    """The .onnx files are exactly what make_samples.py builds (regenerate after editing it)."""
    script = _load_script()
    assert [s.name for s in script.SAMPLES] == list(BY_NAME)
    for sample in script.SAMPLES:
        model, inputs = script.build(sample)
        committed = (SAMPLES / BY_NAME[sample.name]["file"]).read_bytes()
        assert model.SerializeToString() == committed, f"{sample.name}.onnx is stale: rerun make_samples.py"
        if inputs is not None:
            data = np.load(SAMPLES / BY_NAME[sample.name]["io"])
            for key, arr in inputs.items():
                np.testing.assert_array_equal(data[key], arr, err_msg=f"{sample.name}:{key}")
