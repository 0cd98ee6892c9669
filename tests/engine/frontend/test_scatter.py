"""ScatterElements, Scatter and ScatterND (engine/frontend/ops/scatter.py: gathers of the last matching update, or
the updates combined): random cases against onnxruntime — negative indices, duplicates under every reduction,
indices shorter than the data — on the reference executor, and a KV-cache update on the C backend under every
policy and under the SIMT emulator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import assert_runs_like_onnxruntime, max_rel_error, ort_outputs  # noqa: E402

from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(op: str, dshape, ishape, ushape, consts: dict, opset: int = 18, **attrs) -> onnx.ModelProto:
    names = ["data", "indices", "updates"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64 if n == "indices" else TensorProto.FLOAT, s)
              for n, s in zip(names, (dshape, ishape, ushape)) if n not in consts]
    g = helper.make_graph([helper.make_node(op, names, ["y"], **attrs)], "t", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9))


def _elements_case(rng, dshape, ishape, axis: int, duplicates: bool):
    """Indices into `dshape` along `axis`, negative ones mixed in; without `duplicates`, distinct along the axis
    (ONNX leaves duplicates undefined for reduction="none")."""
    n = dshape[axis]
    if duplicates:
        idx = rng.integers(0, n, ishape)
    else:
        idx = np.argsort(rng.random(ishape[:axis] + (n,) + ishape[axis + 1:]), axis=axis)
        idx = np.take(idx, range(ishape[axis]), axis=axis)
    idx = np.where(rng.random(ishape) < 0.3, idx - n, idx)
    return idx.astype(np.int64)


# dshape, ishape, axis, reduction
ELEMENTS = [((4, 6), (4, 6), 1, "none"), ((5, 3), (2, 3), 0, "none"), ((3, 7, 4), (2, 3, 4), 1, "none"),
            ((4, 5), (3, 5), 1, "add"), ((6, 3), (6, 2), 0, "mul"), ((4, 6), (4, 9), 1, "max"),
            ((2, 5, 3), (2, 4, 3), 1, "min")]


@pytest.mark.parametrize(("dshape", "ishape", "axis", "reduction"), ELEMENTS)
def test_scatter_elements_matches_onnxruntime(dshape, ishape, axis, reduction):
    rng = np.random.default_rng(len(dshape) * 10 + axis)
    feeds = {"data": rng.standard_normal(dshape).astype(np.float32),
             "updates": rng.standard_normal(ishape).astype(np.float32)}
    if reduction == "none" and ishape[axis] > dshape[axis]:
        pytest.skip("needs duplicates")
    idx = _elements_case(rng, dshape, ishape, axis, duplicates=reduction != "none")
    model = _model("ScatterElements", dshape, ishape, ishape, {"indices": idx}, axis=axis, reduction=reduction)
    want = ort_outputs(model, feeds)[0]
    got = run_reference(lower(import_onnx(model)), feeds)["y"]
    assert max_rel_error(got, want) < 1e-6


def test_scatter_at_opset_9_is_scatter_elements():
    rng = np.random.default_rng(2)
    feeds = {"data": rng.standard_normal((3, 4)).astype(np.float32),
             "updates": rng.standard_normal((3, 2)).astype(np.float32)}
    idx = np.asarray([[0, 3], [1, 2], [3, 0]], np.int64)
    got = run_reference(lower(import_onnx(_model("Scatter", (3, 4), (3, 2), (3, 2), {"indices": idx}, opset=9,
                                                 axis=1))), feeds)["y"]
    want = feeds["data"].copy()
    np.put_along_axis(want, idx, feeds["updates"], axis=1)
    np.testing.assert_array_equal(got, want)


# dshape, indices shape (last axis: coordinates per row), reduction
ND = [((4, 5, 3), (2, 1), "none"), ((4, 5, 3), (3, 2), "none"), ((4, 5), (2, 3, 2), "none"), ((6,), (4, 1), "none"),
      ((4, 5, 3), (5, 1), "add"), ((3, 4), (6, 2), "mul"), ((5, 2), (7, 1), "max"), ((5, 2), (7, 1), "min")]


@pytest.mark.parametrize(("dshape", "ishape", "reduction"), ND)
def test_scatter_nd_matches_onnxruntime(dshape, ishape, reduction):
    rng = np.random.default_rng(sum(dshape) + len(ishape))
    k = ishape[-1]
    rows = int(np.prod(ishape[:-1]))
    if reduction == "none":  # distinct rows
        flat = rng.permutation(int(np.prod(dshape[:k])))[:rows]
        coords = np.stack(np.unravel_index(flat, dshape[:k]), axis=-1)
    else:
        coords = np.stack([rng.integers(0, n, rows) for n in dshape[:k]], axis=-1)
    coords = np.where(rng.random(coords.shape) < 0.3, coords - np.asarray(dshape[:k]), coords)
    idx = coords.reshape(ishape).astype(np.int64)
    ushape = tuple(ishape[:-1]) + tuple(dshape[k:])
    feeds = {"data": rng.standard_normal(dshape).astype(np.float32),
             "updates": rng.standard_normal(ushape).astype(np.float32)}
    model = _model("ScatterND", dshape, ishape, ushape, {"indices": idx}, reduction=reduction)
    want = ort_outputs(model, feeds)[0]
    got = run_reference(lower(import_onnx(model)), feeds)["y"]
    assert max_rel_error(got, want) < 1e-6


def _kv_update(path: Path) -> Path:
    """A static KV cache's decode step as exporters write it: the new token's key (a projection of the input)
    scattered into the cache at the position fed in (ScatterND over the sequence axis of a [seq, heads, dim]
    cache), then attention scores of the query against the whole cache."""
    rng = np.random.default_rng(11)
    consts = {"wk": (rng.standard_normal((8, 8)) * 0.5).astype(np.float32),
              "shape": np.asarray([1, 2, 4], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "wk"], ["k"]), helper.make_node("Reshape", ["k", "shape"], ["k3"]),
             helper.make_node("ScatterND", ["cache", "pos", "k3"], ["new"]),
             helper.make_node("Reshape", ["q", "shape"], ["q3"]), helper.make_node("Mul", ["new", "q3"], ["prod"]),
             helper.make_node("ReduceSum", ["prod", "last"], ["y"], keepdims=0)]
    consts["last"] = np.asarray([-1], np.int64)
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 8)),
                                       helper.make_tensor_value_info("q", TensorProto.FLOAT, (1, 8)),
                                       helper.make_tensor_value_info("cache", TensorProto.FLOAT, (6, 2, 4)),
                                       helper.make_tensor_value_info("pos", TensorProto.INT64, (1, 1))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    onnx.save(onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)), path)
    return path


def _kv_feeds() -> dict:
    rng = np.random.default_rng(12)
    return {"x": rng.standard_normal((1, 8)).astype(np.float32), "q": rng.standard_normal((1, 8)).astype(np.float32),
            "cache": rng.standard_normal((6, 2, 4)).astype(np.float32), "pos": np.asarray([[3]], np.int64)}


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_kv_cache_update_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    assert_runs_like_onnxruntime(_kv_update(tmp_path / "kv.onnx"), _kv_feeds(), policy=policy)


def test_kv_cache_update_cuda_runs_under_the_simt_emulator(tmp_path):
    assert_runs_like_onnxruntime(_kv_update(tmp_path / "kv.onnx"), _kv_feeds(), backend="cuda-sim")


@pytest.mark.parametrize(("op", "dshape", "ishape", "ushape", "attrs", "match"), [
    ("ScatterElements", (3, 4), (3, 5), (3, 5), {"axis": 0}, "no larger than the data off the axis"),
    ("ScatterElements", (3, 4), (3, 2), (3, 2), {"axis": 1, "reduction": "sum"}, "reduction='sum'"),
    ("ScatterND", (3, 4), (2, 3), (2,), {}, "updates of the indices' shape"),
])
def test_what_they_do_not_do_is_refused_in_one_line(op, dshape, ishape, ushape, attrs, match):
    model = _model(op, dshape, ishape, ushape, {"indices": np.zeros(ishape, np.int64)}, **attrs)
    with pytest.raises(UnsupportedOpError, match=match) as err:
        lower(import_onnx(model))
    assert "\n" not in str(err.value)
