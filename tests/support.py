"""Shared test helpers (sample paths, onnxruntime oracle, tiny models). Imported as `support`:
a uniquely named module, unlike `conftest`, which several test folders define."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
TEST_DATA = ROOT / "tests" / "data"
CATALOG = {e["name"]: e for e in json.loads((SAMPLES / "catalog.json").read_text())}


def sample_path(name: str) -> Path:
    return SAMPLES / CATALOG[name]["file"]


def run_ort(model: str | Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime (CPU) outputs keyed by graph output name: the oracle beside run_reference."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def graph_model(nodes, inputs: dict, consts: dict, outs=("y",), opset: int = 23) -> onnx.ModelProto:
    """A one-graph model of `nodes` (default domain at `opset`, IR 10): graph inputs typed and shaped as the
    arrays in `inputs`, initializers from `consts`, outputs named `outs` (float; or a mapping of name to its
    TensorProto type), shapes inferred."""
    from onnx import numpy_helper

    types = dict(outs) if isinstance(outs, dict) else {o: TensorProto.FLOAT for o in outs}
    g = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                     for n, v in inputs.items()],
        [helper.make_tensor_value_info(o, t, None) for o, t in types.items()],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m)


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime (CPU) outputs of an in-memory model, in graph output order."""
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_runs_like_onnxruntime(path: str | Path, feeds: dict[str, np.ndarray], *, backend: str = "cpu",
                                 policy: str = "welder", tol: float = 1e-5) -> None:
    """Run the model at `path` on `backend` under `policy` and hold every graph output to onnxruntime's (max
    relative error under `tol`); under the SIMT emulator (cuda-sim) also that it found no race or stray access."""
    from engine.api import load_graph
    from engine.runtime.execute import run_model

    model = onnx.load(path)
    want = ort_outputs(model, feeds)
    result = run_model(load_graph(path), feeds, backend=backend, policy=policy)
    for out, w in zip(model.graph.output, want):
        err = max_rel_error(result.outputs[out.name], w)
        assert err < tol, f"{out.name} on {backend} under {policy}: max rel err {err:.2g}"
    if backend == "cuda-sim":
        assert not result.sim.findings, result.sim.findings


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| relative to max |want| (near-zero entries judged on the output's scale)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1e-30) if want.size else 1.0
    return float(np.abs(got - want).max()) / scale if want.size else 0.0


def tiny_model(op: str = "Relu", dims=(2, 3), *, opset: int = 17, elem=TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    """y = op(x) with x of `dims` (strings are symbolic dims)."""
    node = helper.make_node(op, ["x"], ["y"], name=f"{op.lower()}_0", **attrs)
    graph = helper.make_graph(
        [node], "tiny", [helper.make_tensor_value_info("x", elem, list(dims))],
        [helper.make_tensor_value_info("y", elem, list(dims))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def external_data_model(location: str) -> onnx.ModelProto:
    """y = x + w, x [2,3], with initializer w (values 1..6) stored in the external file `location`."""
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.zeros((2, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "24")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    node = helper.make_node("Add", ["x", "w"], ["y"], name="add_0")
    graph = helper.make_graph([node], "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


EXTERNAL_W = (np.arange(6, dtype=np.float32) + 1).reshape(2, 3)


def random_feeds(graph, seed: int) -> dict[str, np.ndarray]:
    """Random inputs for `graph` (normal floats, mostly-true masks, small integer indices), never zeros."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in graph.inputs:
        if t.dtype.is_float:
            feeds[t.name] = rng.standard_normal(t.shape).astype(t.dtype.np)
        elif t.dtype.value == "bool":
            feeds[t.name] = rng.random(t.shape) < 0.7
        else:
            feeds[t.name] = rng.integers(0, 4, t.shape).astype(t.dtype.np)
    return feeds


def plan_random(model: onnx.ModelProto, policy: str, device):
    """(planned graph, plan) of a generated model (tests/fuzz_graphs.py), saved to a temporary file and loaded
    as a user's would be; a model tileweave refuses in one line (e.g. a rank-0 stage) is rejected from the
    hypothesis example (`assume`). For property tests, which cannot take pytest's tmp_path."""
    import tempfile

    from hypothesis import assume

    from engine.errors import TileweaveError
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        path.write_bytes(model.SerializeToString())
        try:
            return plan_model(load_graph(path), policy, device)
        except TileweaveError:
            assume(False)
            raise  # not reached: assume(False) raises
