"""Converters vs onnxruntime: tiny single-node models with random inputs through import_onnx + lower +
run_reference (tests engine/frontend/ops/*)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.errors import UnsupportedOpError
from engine.frontend.importer import import_onnx, lower
from engine.ir.graph import StageKind
from engine.runtime.reference import run_reference

_NP_TO_ONNX = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64}


def _model(op: str, inputs: dict, consts: dict | None = None, n_out: int = 1, opset: int = 17, **attrs):
    """One-node model: `inputs` are graph inputs (name -> array), `consts` initializers."""
    consts = consts or {}
    names = list(inputs) + list(consts)
    order = attrs.pop("_order", names)
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, order, outs, **attrs)
    g = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(n, _NP_TO_ONNX[v.dtype.type], v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        [numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _check(model, inputs: dict, rtol=1e-4, atol=1e-5):
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    pg = lower(import_onnx(model))
    got = run_reference(pg, inputs)
    for o, w in zip(model.graph.output, want):
        np.testing.assert_allclose(got[o.name], w, rtol=rtol, atol=atol, err_msg=o.name)
    return pg


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


CONV_CASES = {
    "plain_bias": dict(x=(2, 3, 7, 6), w=(4, 3, 3, 3), bias=True, attrs={}),
    "stride2_pads": dict(x=(1, 2, 9, 8), w=(3, 2, 3, 3), bias=False, attrs=dict(strides=[2, 2], pads=[1, 0, 2, 1])),
    "dilation2": dict(x=(1, 2, 9, 9), w=(2, 2, 3, 3), bias=True, attrs=dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    "depthwise": dict(x=(2, 4, 6, 6), w=(4, 1, 3, 3), bias=True, attrs=dict(group=4, pads=[1, 1, 1, 1])),
    "grouped": dict(x=(1, 6, 5, 5), w=(4, 3, 2, 2), bias=False, attrs=dict(group=2)),
    "same_upper_s2": dict(x=(1, 2, 7, 8), w=(3, 2, 4, 3), bias=True, attrs=dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_lower": dict(x=(1, 2, 6, 5), w=(2, 2, 2, 3), bias=False, attrs=dict(auto_pad="SAME_LOWER")),
    "valid_1d": dict(x=(2, 3, 11), w=(5, 3, 4), bias=True, attrs=dict(auto_pad="VALID", strides=[3])),
    "3d": dict(x=(1, 2, 4, 5, 4), w=(3, 2, 2, 3, 2), bias=True, attrs=dict(pads=[1, 0, 1, 0, 1, 0])),
}


@pytest.mark.parametrize("case", CONV_CASES, ids=list(CONV_CASES))
def test_conv_matches_onnxruntime(case, rng):
    c = CONV_CASES[case]
    x = _rand(rng, *c["x"])
    consts = {"w": _rand(rng, *c["w"])}
    if c["bias"]:
        consts["b"] = _rand(rng, c["w"][0])
    pg = _check(_model("Conv", {"x": x}, consts, **c["attrs"]), {"x": x})
    kinds = [s.kind for s in pg.stages]
    assert kinds.count(StageKind.CONTRACTION) == 1  # the conv is one contraction stage
    assert (StageKind.ELEMENTWISE in kinds) == c["bias"]  # bias is its own epilogue stage


POOL_CASES = {
    "max_ceil": ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "max_pads_dil": ("MaxPool", dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2])),
    "max_same_upper": ("MaxPool", dict(kernel_shape=[3, 2], strides=[2, 1], auto_pad="SAME_UPPER")),
    "avg_exclude_pad": ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])),
    "avg_include_pad": ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 2, 1, 0], count_include_pad=1)),
    "avg_ceil_exclude": ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    "avg_ceil_include": ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                              ceil_mode=1, count_include_pad=1)),
    "avg_dilated": ("AveragePool", dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1])),
    # transformers' EfficientNet pooler: one ceil-mode window far wider than the map (global average).
    "avg_window_wider_include": ("AveragePool", dict(kernel_shape=[40, 40], strides=[40, 40], ceil_mode=1,
                                                      count_include_pad=1)),
    "avg_window_wider_exclude": ("AveragePool", dict(kernel_shape=[9, 12], strides=[10, 12], pads=[1, 0, 1, 2],
                                                      ceil_mode=1)),
    "max_window_wider": ("MaxPool", dict(kernel_shape=[30, 9], strides=[31, 9], ceil_mode=1)),
}


@pytest.mark.parametrize("case", POOL_CASES, ids=list(POOL_CASES))
def test_pool_matches_onnxruntime(case, rng):
    op, attrs = POOL_CASES[case]
    x = _rand(rng, 2, 3, 7, 8)
    _check(_model(op, {"x": x}, opset=19, **attrs), {"x": x})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op, rng):
    x = _rand(rng, 2, 3, 5, 4)
    _check(_model(op, {"x": x}), {"x": x})


def test_gemm_transposes_alpha_beta_broadcast(rng):
    a, b = _rand(rng, 5, 4), _rand(rng, 6, 5)
    c = _rand(rng, 6)
    _check(_model("Gemm", {"a": a, "b": b}, {"c": c}, transA=1, transB=1, alpha=0.7, beta=1.3),
           {"a": a, "b": b})


def test_batchnorm_folds_to_one_stage(rng):
    x = _rand(rng, 2, 3, 4, 5)
    consts = {"s": _rand(rng, 3), "bb": _rand(rng, 3), "m": _rand(rng, 3), "v": rng.random(3).astype(np.float32) + 0.5}
    pg = _check(_model("BatchNormalization", {"x": x}, consts, epsilon=1e-3), {"x": x})
    assert len(pg.stages) == 1 and pg.stages[0].kind == StageKind.ELEMENTWISE


def test_instance_and_group_norm(rng):
    x = _rand(rng, 2, 6, 4, 3)
    _check(_model("InstanceNormalization", {"x": x}, {"s": _rand(rng, 6), "b": _rand(rng, 6)}), {"x": x})
    g18 = _model("GroupNormalization", {"x": x}, {"s": _rand(rng, 3), "b": _rand(rng, 3)}, opset=18, num_groups=3)
    g21 = _model("GroupNormalization", {"x": x}, {"s": _rand(rng, 6), "b": _rand(rng, 6)}, opset=21, num_groups=3)
    _check(g18, {"x": x}, atol=1e-4)
    _check(g21, {"x": x}, atol=1e-4)


SLICE_CASES = {
    "negative_steps": ([5, -1], [-9, 0], [1, 2], [-2, -1]),
    "clamped": ([-100, 1], [100, 1 << 62], [0, 2], [1, 1]),
    "reverse_all": ([-1], [-(1 << 62)], [0], [-1]),
    "stride3": ([1], [8], [1], [3]),
}


@pytest.mark.parametrize("case", SLICE_CASES, ids=list(SLICE_CASES))
def test_slice(case, rng):
    starts, ends, axes, steps = (np.array(v, dtype=np.int64) for v in SLICE_CASES[case])
    x = _rand(rng, 6, 8, 5)
    m = _model("Slice", {"x": x}, {"st": starts, "en": ends, "ax": axes, "sp": steps})
    _check(m, {"x": x})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes(mode, rng):
    x = _rand(rng, 3, 4, 5)
    pads = np.array([0, 2, 1, 1, 3, 2], dtype=np.int64)
    consts = {"p": pads}
    if mode == "constant":
        consts["v"] = np.array(1.5, dtype=np.float32)
    _check(_model("Pad", {"x": x}, consts, opset=19, mode=mode), {"x": x})


def test_pad_negative_crops(rng):
    x = _rand(rng, 4, 6)
    _check(_model("Pad", {"x": x}, {"p": np.array([-1, 2, 1, -3], dtype=np.int64)}), {"x": x})


def test_split_expand_tile_gather_elements_trilu(rng):
    x = _rand(rng, 4, 7)
    _check(_model("Split", {"x": x}, {"s": np.array([2, 5], dtype=np.int64)}, n_out=2, axis=1), {"x": x})
    _check(_model("Split", {"x": x}, n_out=3, opset=18, axis=1, num_outputs=3), {"x": x})
    e = _rand(rng, 3, 1)
    _check(_model("Expand", {"e": e}, {"s": np.array([2, 3, 4], dtype=np.int64)}), {"e": e})
    _check(_model("Tile", {"x": x}, {"r": np.array([2, 3], dtype=np.int64)}), {"x": x})
    idx = rng.integers(-7, 7, size=(4, 3)).astype(np.int64)
    _check(_model("GatherElements", {"x": x, "i": idx}, axis=1), {"x": x, "i": idx})
    _check(_model("Trilu", {"x": x}, {"k": np.array(-1, dtype=np.int64)}, upper=0), {"x": x})


GATHER_ND_CASES = {
    # (data shape, indices shape, batch_dims): whole rows, single elements, batched, a torch mask gather
    "rows": ((4, 5, 3), (2, 1), 0),
    "elements": ((4, 5, 3), (3, 2, 3), 0),
    "batched": ((2, 5, 3), (2, 4, 1), 1),
    "mask_like": ((1, 16), (1, 1, 1, 16, 2), 0),
}


@pytest.mark.parametrize("case", GATHER_ND_CASES, ids=list(GATHER_ND_CASES))
def test_gather_nd(case, rng):
    dshape, ishape, b = GATHER_ND_CASES[case]
    x = _rand(rng, *dshape)
    bounds = np.array(dshape[b:b + ishape[-1]])
    idx = (rng.integers(0, 1 << 20, size=ishape) % bounds).astype(np.int64)
    idx[..., 0] -= bounds[0] * (idx[..., 0] % 2)  # every other index negative (counted from the end)
    pg = _check(_model("GatherND", {"x": x}, {"i": idx}, batch_dims=b, opset=13), {"x": x})
    assert [s.op for s in pg.stages] == ["gather_nd"]
    _check(_model("GatherND", {"x": x, "i": idx}, batch_dims=b, opset=13), {"x": x, "i": idx})


def test_range_and_constant_of_shape_fold():
    m = _model("Range", {}, {"a": np.array(2.5, np.float32), "b": np.array(-4, np.float32),
                             "c": np.array(-1.5, np.float32)})
    g = import_onnx(m)
    np.testing.assert_allclose(g.constants["y0"], np.arange(2.5, -4, -1.5, dtype=np.float32))


EINSUM_CASES = {
    "batch_matmul": ("bij,bjk->bik", [(3, 2, 4), (3, 4, 5)]),
    "transposed": ("ji,kj->ik", [(4, 2), (5, 4)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "reduce": ("ijk->j", [(2, 3, 4)]),
    "implicit": ("ij,jk", [(2, 3), (3, 4)]),
    "trace": ("ii->", [(4, 4)]),
    "ellipsis": ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]),
}


@pytest.mark.parametrize("case", EINSUM_CASES, ids=list(EINSUM_CASES))
def test_einsum(case, rng):
    eq, shapes = EINSUM_CASES[case]
    inputs = {f"x{k}": _rand(rng, *s) for k, s in enumerate(shapes)}
    pg = _check(_model("Einsum", inputs, equation=eq), inputs)
    assert len(pg.stages) == 1


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm(direction, rng):
    seq, batch, isz, hid = 4, 2, 3, 5
    nd = 2 if direction == "bidirectional" else 1
    x = _rand(rng, seq, batch, isz)
    consts = {"w": _rand(rng, nd, 4 * hid, isz) * 0.5, "r": _rand(rng, nd, 4 * hid, hid) * 0.5,
              "b": _rand(rng, nd, 8 * hid) * 0.5}
    h0, c0 = _rand(rng, nd, batch, hid), _rand(rng, nd, batch, hid)
    inputs = {"x": x, "h0": h0, "c0": c0}
    m = _model("LSTM", inputs, consts, n_out=3, hidden_size=hid, direction=direction,
               _order=["x", "w", "r", "b", "", "h0", "c0"])
    pg = _check(m, inputs)
    ops = [s.op for s in pg.stages]
    assert ops.count("lstm.input") == nd and ops.count("lstm.recurrent") == nd * seq


def test_activation_extras(rng):
    x = _rand(rng, 3, 4) * 3
    for op, attrs in [("Selu", {}), ("Celu", {"alpha": 0.7}), ("ThresholdedRelu", {"alpha": 0.3}),
                      ("Softsign", {}), ("Mish", {}), ("Sign", {}), ("Shrink", {"lambd": 0.4, "bias": 0.2})]:
        _check(_model(op, {"x": x}, opset=18, **attrs), {"x": x})
    slope = _rand(rng, 4)
    _check(_model("PRelu", {"x": x}, {"s": slope}), {"x": x})


def test_flatten_negative_axis(rng):
    x = _rand(rng, 2, 3, 4)
    _check(_model("Flatten", {"x": x}, axis=-1), {"x": x})


def test_unsupported_attribute_is_one_line_error(rng):
    x = _rand(rng, 1, 2, 5, 5)
    m = _model("LpNormalization", {"x": x}, p=3)  # (MaxPool's Indices output, the example before, is supported)
    with pytest.raises(UnsupportedOpError, match="p=3") as err:
        lower(import_onnx(m))
    assert "\n" not in str(err.value)
