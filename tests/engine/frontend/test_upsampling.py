"""ConvTranspose and Resize (engine/frontend/ops/conv.py `convert_conv_transpose`, ops/resize.py): the
residue-class decomposition against a direct scatter, random cases against onnxruntime on the reference
executor, and a small U-Net-shaped graph on the C backend under every policy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import max_rel_error  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.errors import UnsupportedOpError  # noqa: E402
from engine.frontend.importer import import_onnx, lower  # noqa: E402
from engine.frontend.ops.conv import transposed_phases  # noqa: E402
from engine.frontend.ops.resize import affine_index, filter_taps, source_coords  # noqa: E402
from engine.ir import index as I  # noqa: E402
from engine.ir.graph import StageKind  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.runtime.reference import run_reference  # noqa: E402


def _model(nodes, inputs: dict, consts: dict, out: str = "y", opset: int = 19):
    g = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape) for n, v in inputs.items()],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    return onnx.shape_inference.infer_shapes(m)


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("seed", range(40))
def test_residue_classes_cover_every_scatter_exactly_once(seed):
    """Each (input i, tap k) of a transposed conv adds into output stride*i + dilation*k - pad_begin; the
    phases must reach every in-range one exactly once, from the right input, and nothing else."""
    rng = np.random.default_rng(seed)
    stride, dil, kernel = (int(v) for v in rng.integers(1, 5, 3))
    n_in = int(rng.integers(1, 7))
    pad = int(rng.integers(-2, kernel * dil))
    n_out = stride * (n_in - 1) + (kernel - 1) * dil + 1 - pad + int(rng.integers(-2, 3))
    want = {(o, i, k) for i in range(n_in) for k in range(kernel)
            for o in [stride * i + dil * k - pad] if 0 <= o < n_out}
    got = set()
    for r, ph in enumerate(transposed_phases(stride, dil, kernel, pad)):
        for q in range(-(-max(n_out, 0) // stride)):
            o = stride * q + r
            for j, k in enumerate(ph.taps):
                i = q + ph.offset + j * ph.step
                if 0 <= o < n_out and 0 <= i < n_in:
                    assert (o, i, k) not in got
                    got.add((o, i, k))
    assert got == want


CONVT = {
    # name: (x shape, out channels per group, kernel, attributes)
    "unet_k2s2": ((1, 8, 5, 6), 4, (2, 2), dict(strides=[2, 2])),
    "gan_k4s2p1": ((2, 6, 4, 5), 3, (4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "k3s2p1_output_padding": ((1, 4, 5, 4), 5, (3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1],
                                                          output_padding=[1, 1])),
    "stride1_is_a_flipped_conv": ((1, 3, 6, 5), 4, (3, 2), dict(pads=[1, 0, 1, 1])),
    "groups_dilation_stride3": ((1, 6, 4, 5), 2, (3, 2), dict(strides=[3, 2], dilations=[2, 1], group=3)),
    "kernel_under_stride": ((1, 2, 4, 4), 3, (1, 2), dict(strides=[3, 3])),
    "output_shape_same_lower": ((1, 3, 4, 4), 2, (3, 3), dict(strides=[2, 2], output_shape=[9, 8],
                                                              auto_pad="SAME_LOWER")),
    "1d": ((2, 3, 7), 4, (5,), dict(strides=[3], pads=[2, 1])),
    "3d": ((1, 2, 3, 4, 3), 2, (2, 3, 2), dict(strides=[2, 1, 2], pads=[0, 1, 1, 0, 1, 0])),
}


@pytest.mark.parametrize("case", sorted(CONVT))
def test_conv_transpose_matches_onnxruntime(case):
    xs, og, kernel, attrs = CONVT[case]
    rng = np.random.default_rng(len(case))
    group = attrs.get("group", 1)
    x = rng.standard_normal(xs).astype(np.float32)
    consts = {"w": rng.standard_normal((xs[1], og, *kernel)).astype(np.float32),
              "b": rng.standard_normal(og * group).astype(np.float32)}
    m = _model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)], {"x": x}, consts)
    pg = lower(import_onnx(m))
    np.testing.assert_allclose(run_reference(pg, {"x": x})["y"], _ort(m, {"x": x}), rtol=1e-4, atol=1e-5)
    convs = [s for s in pg.stages if s.kind == StageKind.CONTRACTION]
    # One plain conv per residue class a tap reaches (at most the product of the strides), no zero inserted:
    # their multiply-adds add up to the transposed conv's own.
    strides = attrs.get("strides", [1] * len(kernel))
    assert 1 <= len(convs) <= int(np.prod(strides))
    macs = sum(int(np.prod(s.shape)) * int(np.prod(s.reduce)) for s in convs)
    assert macs <= int(np.prod(pg.stage(pg.outputs[0]).shape)) * xs[1] // group * int(np.prod(kernel))


RESIZE = {
    # name: (x shape, attributes, scales or None, sizes or None)
    "nearest_x2_half_pixel": ((1, 2, 5, 4), dict(mode="nearest"), [1, 1, 2, 2], None),
    "nearest_sizes_floor_asymmetric": ((1, 3, 6, 7), dict(mode="nearest", nearest_mode="floor",
                                                          coordinate_transformation_mode="asymmetric"),
                                       None, [1, 3, 9, 4]),
    "bilinear_align_corners_x2": ((1, 2, 7, 6), dict(mode="linear", coordinate_transformation_mode="align_corners"),
                                  [1, 1, 2, 2], None),
    "bilinear_pytorch_half_pixel_down": ((2, 2, 9, 8), dict(mode="linear",
                                                            coordinate_transformation_mode="pytorch_half_pixel"),
                                         None, [2, 2, 4, 3]),
    "bicubic_fractional": ((1, 1, 6, 5), dict(mode="cubic", cubic_coeff_a=-0.5), [1, 1, 1.7, 2.3], None),
    "linear_antialias_down": ((1, 2, 12, 10), dict(mode="linear", antialias=1), [1, 1, 0.4, 0.6], None),
}


@pytest.mark.parametrize("case", sorted(RESIZE))
def test_resize_matches_onnxruntime(case):
    xs, attrs, scales, sizes = RESIZE[case]
    x = np.random.default_rng(len(case)).standard_normal(xs).astype(np.float32)
    consts = {"roi": np.zeros(0, np.float32), "scales": np.asarray(scales or [], np.float32)}
    ins = ["x", "roi", "scales"]
    if sizes is not None:
        consts["sizes"] = np.asarray(sizes, np.int64)
        ins.append("sizes")
    m = _model([helper.make_node("Resize", ins, ["y"], **attrs)], {"x": x}, consts)
    pg = lower(import_onnx(m))
    np.testing.assert_allclose(run_reference(pg, {"x": x})["y"], _ort(m, {"x": x}), rtol=1e-4, atol=1e-5)
    # One gather-and-weigh stage per axis with several taps (innermost first), the one-tap axes in the first.
    multi = sum(1 for a, (n, m) in enumerate(zip(xs, pg.stage(pg.outputs[0]).shape)) if n != m) \
        if attrs["mode"] != "nearest" else 1
    assert [s.kind for s in pg.stages] == [StageKind.LAYOUT] * max(1, multi)


def test_integer_factor_positions_are_affine_and_others_are_tables():
    """2x nearest (half_pixel) reads input o // 2; align_corners 32 -> 64 bilinear reads clamp((o + 1) // 2 - 1)
    below — affine, no index table — while positions 0, 4, 5 of 7 have no such form (a table)."""
    o = I.out_vars(1)[0]
    table = np.ceil(source_coords("half_pixel", 5, 10, 2.0) - 0.5).clip(0, 4).astype(np.int64)
    assert str(affine_index(table, 5, o)) == str(I.floordiv(o, 2))
    idx, _ = filter_taps(source_coords("align_corners", 32, 64, 2.0), 32, None, False)
    assert affine_index(idx[:, 0], 32, o) is not None and affine_index(idx[:, 1], 32, o) is not None
    odd = np.array([0, 4, 5], np.int64)  # (7o + c) // 3 would need c in 0..2 and in 5..7
    assert affine_index(odd, 7, o) is None


def test_resize_refuses_what_it_does_not_do_in_one_line():
    x = np.ones((1, 1, 4, 4), np.float32)
    m = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic",
                                 coordinate_transformation_mode="tf_half_pixel_for_nn")],
               {"x": x}, {"scales": np.asarray([1, 1, 2, 2], np.float32)}, opset=11)
    with pytest.raises(UnsupportedOpError, match="coordinate_transformation_mode=tf_half_pixel_for_nn") as err:
        lower(import_onnx(m))
    assert "\n" not in str(err.value)


def _unet_like(path: Path) -> Path:
    """conv -> relu -> maxpool -> ConvTranspose (k2 s2) up and bilinear Resize up, each concatenated with the
    skip, then a conv: the U-Net decoder's pattern at a size the test suite can plan under every policy."""
    rng = np.random.default_rng(11)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    consts = {"w1": w(8, 3, 3, 3), "wt": w(8, 8, 2, 2), "bt": w(8), "w2": w(4, 24, 3, 3),
              "roi": np.zeros(0, np.float32), "sc": np.asarray([1, 1, 2, 2], np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("ConvTranspose", ["p1", "wt", "bt"], ["u1"], strides=[2, 2]),
             helper.make_node("Resize", ["p1", "roi", "sc"], ["u2"], mode="linear",
                              coordinate_transformation_mode="align_corners"),
             helper.make_node("Concat", ["r1", "u1", "u2"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["y"], pads=[1, 1, 1, 1])]
    x = np.zeros((1, 3, 12, 10), np.float32)
    onnx.save(_model(nodes, {"x": x}, consts), path)
    return path


@pytest.mark.parametrize("policy", ["unfused", "stitch", "welder"])
def test_unet_decoder_runs_on_the_c_backend_under_every_policy(tmp_path, policy):
    path = _unet_like(tmp_path / "unet.onnx")
    x = np.random.default_rng(5).standard_normal((1, 3, 12, 10)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run_model(load_graph(path), {"x": x}, backend="cpu", policy=policy).outputs["y"]
    assert max_rel_error(got, want) < 1e-4


@pytest.mark.parametrize("policy", ["unfused", "welder"])
def test_unet_decoder_cuda_compiles_and_runs_under_the_simt_emulator(tmp_path, policy):
    """The CUDA printed for the residue-class convs, their interleave and the affine-indexed Resize, compiled with
    NVRTC and run by the SIMT emulator: the outputs, and no race or out-of-bounds finding."""
    path = _unet_like(tmp_path / "unet.onnx")
    x = np.random.default_rng(5).standard_normal((1, 3, 12, 10)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    result = run_model(load_graph(path), {"x": x}, backend="cuda-sim", policy=policy)
    assert max_rel_error(result.outputs["y"], want) < 1e-4
    assert not result.sim.findings, result.sim.findings
