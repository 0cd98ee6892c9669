"""Tests for engine/codegen/mma.py: tiled GEMMs on TF32 tensor cores (mma.sync m16n8k8) where the device has
them and the plan option `tf32` allows; the printed kernel compiles with NVRTC for sm_80 and sm_90 and runs
under cuda-sim (its emulated mma rounds operands to TF32) at its real launch configuration; the cost model
charges its flops at the device's TF32 tensor peak. No GPU here: nothing runs on tensor cores."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime" / "simt"))
from simt_samples import assert_matches, sample  # noqa: E402

from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.mma import MMA_TF32, tensor_core_options, use_tensor_cores, warp_grid  # noqa: E402
from engine.codegen.nvrtc import compile_cuda  # noqa: E402
from engine.codegen.targets import render_c, render_cuda  # noqa: E402
from engine.device import Device, get_device  # noqa: E402
from engine.errors import DeviceError  # noqa: E402
from engine.frontend.importer import load_graph  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402

# TF32 keeps 10 of fp32's 23 mantissa bits: each operand is off by up to 2^-11 relative, so a k-term dot
# product of random-sign terms is off by about 2^-11 * |a||b| / sqrt(k)-ish in relative terms of its largest
# outputs; 5e-3 of the output's largest magnitude holds every sample and zoo model here with room.
TF32_TOL = 5e-3


def tf32(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32: round to nearest, ties away from zero, 10 mantissa bits."""
    u = np.asarray(x, np.float32).view(np.uint32).copy()
    finite = (u & 0x7F800000) != 0x7F800000
    u[finite] = (u[finite] + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return u.view(np.float32)


def _matmul(path: Path, m: int, k: int, n: int, dtype=np.float32) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(13)
    w = rng.standard_normal((k, n)).astype(dtype)
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "B"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", elem, [m, k])],
                              [helper.make_tensor_value_info("y", elem, [m, n])],
                              [onnx.numpy_helper.from_array(w, "B")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path, w


def _mma_gemms(program):
    return [g for k in program.kernels for g in k.gemms if g.mma]


def test_presets_say_which_tensor_precisions_they_have():
    for name in ("a100", "rtx3090", "h100", "h200"):
        d = get_device(name)
        assert "tf32" in d.tensor_precisions and d.peak_tf32_tensor_flops >= d.peak_fp32_flops
        assert d.source_of("peak_tf32_tensor_flops") == "datasheet"
    assert get_device("v100").tensor_precisions == ("fp16",) and get_device("v100").peak_tf32_tensor_flops == 0
    a100 = get_device("a100")
    assert Device.from_json(a100.to_json()) == a100
    with pytest.raises(DeviceError, match="tensor_precisions"):
        Device.from_dict(a100.to_dict() | {"tensor_precisions": ["int4"]})
    with pytest.raises(DeviceError, match="peak_tf32_tensor_flops"):
        Device.from_dict(a100.to_dict() | {"peak_tf32_tensor_flops": 0.0})


def test_tf32_option_puts_gemms_on_tensor_cores_only_where_the_device_has_them():
    graph, _, _ = sample("nerf_mlp")
    g_off, off = plan_model(graph, "welder", "a100")
    assert not _mma_gemms(generate(off, g_off, "a100"))
    g_on, on = plan_model(graph, "welder", "a100", options={"tf32": True})
    assert dict(on.options)["tf32"] is True
    program = generate(on, g_on, "a100")
    gemms = _mma_gemms(program)
    assert gemms and all(g.mma == MMA_TF32 for g in gemms)
    for g in gemms:  # whole warps on whole m16n8 tiles, k steps of 8
        assert g.warps_m * g.warps_n * 32 == g.tx * g.ty and g.bk % 8 == 0
        fm, fn = g.mma_tiles
        assert fm * 16 * g.warps_m == g.ty * g.tm and fn * 8 * g.warps_n == g.tx * g.tn
        assert g.params["mma"] == MMA_TF32 and "mma.sync m16n8k8.tf32" in g.describe()
    # No tensor cores on the device, or the C target: the same plan prints the FMA micro-tile.
    g_v, on_v100 = plan_model(graph, "welder", "v100", options={"tf32": True})
    assert not _mma_gemms(generate(on_v100, g_v, "v100"))
    c_program = generate(on, g_on, "a100", target="c")
    assert not _mma_gemms(c_program) and "tw_mma" not in render_c(c_program)


def test_tf32_plan_models_no_slower_than_the_fp32_plan():
    """The search with cheaper GEMMs found a slower plan for bert_layer (87.5 against 68.6 µs on a100): the
    fp32 plan's groups and tiles, re-costed on tensor cores, are kept where they model faster."""
    graph, _, _ = sample("bert_layer")
    _, off = plan_model(graph, "welder", "a100")
    _, on = plan_model(graph, "welder", "a100", options={"tf32": True})
    assert on.modeled_us <= off.modeled_us + 1e-9
    assert dict(on.options)["tf32"] is True


def test_warp_grid_needs_whole_warps_and_whole_mma_tiles():
    graph, _, _ = sample("nerf_mlp")
    g_on, on = plan_model(graph, "welder", "a100", options={"tf32": True})
    g = _mma_gemms(generate(on, g_on, "a100"))[0]
    assert warp_grid(g, g.tx * g.ty) == (g.warps_m, g.warps_n)
    assert warp_grid(dataclasses.replace(g, bk=4), 1024) is None  # k step not a multiple of 8
    assert warp_grid(dataclasses.replace(g, ty=1, tm=8, tx=32, tn=1), 1024) is None  # 8 rows: not one m16 tile
    assert warp_grid(g, g.tx * g.ty - 32) is None  # the kernel's block lacks a warp


def test_option_off_leaves_every_kernel_as_before():
    graph, _, _ = sample("vit_block")
    g_off, off = plan_model(graph, "welder", "a100")
    program = generate(off, g_off, "a100")
    # use_tensor_cores without the option changes no fp32 GEMM; with it, the same kernels gain mma
    assert all(use_tensor_cores(k, get_device("a100")) == k for k in program.kernels)
    with tensor_core_options({"tf32": True}):
        assert any(use_tensor_cores(k, get_device("a100")) != k for k in program.kernels if k.gemms)
    assert "tw_mma" not in render_cuda(program) and "mma.sync" not in render_cuda(program)


@pytest.mark.parametrize("name", ["vit_block", "bert_layer", "nerf_mlp"])
def test_tensor_core_kernels_compile_for_sm80_and_sm90(name):
    graph, _, _ = sample(name)
    g_on, on = plan_model(graph, "welder", "a100", options={"tf32": True})
    program = generate(on, g_on, "a100")
    source = render_cuda(program)
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in source and "cvt.rna.tf32.f32" in source
    for arch in ("sm_80", "sm_90"):
        binary = compile_cuda(source, name=program.name, arch=arch)
        assert binary.ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") >= len(_mma_gemms(program))
        assert "cvt.rna.tf32.f32" in binary.ptx and binary.cubin[:4] == b"\x7fELF"


def test_emulated_mma_rounds_operands_to_tf32_exactly(tmp_path):
    """A 45x44 @ 44x40 product (edges in m, n and k) on tensor cores under cuda-sim equals the float64
    product of the TF32-rounded operands to fp32 accumulation error, and differs from the unrounded one
    by TF32's error: the emulator applies cvt.rna's rounding, the fragments land where the layout says."""
    path, w = _matmul(tmp_path / "mm.onnx", 45, 44, 40)
    graph = load_graph(path)
    a = np.random.default_rng(3).standard_normal((45, 44)).astype(np.float32)
    g_on, on = plan_model(graph, "welder", "a100", options={"tf32": True})
    result = run_model(g_on, {"a": a}, backend="cuda-sim", plan=on, device="a100")
    assert result.sim.ok, "\n".join(result.sim.summary_lines())
    assert _mma_gemms(result.program)
    y = np.asarray(result.outputs["y"], np.float64)
    rounded = tf32(a).astype(np.float64) @ tf32(w).astype(np.float64)
    exact = a.astype(np.float64) @ w.astype(np.float64)
    scale = np.abs(exact).max()
    assert np.abs(y - rounded).max() / scale < 2e-6
    assert np.abs(y - exact).max() / scale > 5e-5


def test_fp16_products_use_tensor_cores_without_the_option(tmp_path):
    """fp16 operands are exact in TF32 (10 mantissa bits, a wider exponent): an fp16 MatMul runs on tensor
    cores by default, and its result is the fp16 rounding of the exact product, as the FMA path's is."""
    path, w = _matmul(tmp_path / "mm16.onnx", 45, 44, 40, np.float16)
    graph = load_graph(path)
    a = np.random.default_rng(4).standard_normal((45, 44)).astype(np.float16)
    g, plan = plan_model(graph, "welder", "a100")
    assert "tf32" not in dict(plan.options)
    result = run_model(g, {"a": a}, backend="cuda-sim", plan=plan, device="a100")
    assert result.sim.ok and _mma_gemms(result.program)
    want = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float16).astype(np.float64)
    got = np.asarray(result.outputs["y"], np.float64)
    assert np.abs(got - want).max() <= 2 ** -10 * np.abs(want).max()  # at most an fp16 ulp from fp32 sums


@pytest.mark.parametrize("name", ["nerf_mlp", "vit_block", "bert_layer"])
def test_samples_on_tensor_cores_match_onnxruntime_under_cuda_sim(name):
    graph, inputs, want = sample(name)
    g_on, on = plan_model(graph, "welder", "a100", options={"tf32": True})
    result = run_model(g_on, inputs, backend="cuda-sim", plan=on, device="a100")
    assert _mma_gemms(result.program)
    assert result.sim.ok, "\n".join(result.sim.summary_lines())
    assert_matches(result.outputs, want, tol=TF32_TOL)
    # The shared-memory bytes the emulated threads moved (fragment loads included) are the count's.
    mma = {k.name for k in result.program.kernels if any(g.mma for g in k.gemms)}
    for k in result.sim.kernels:
        if k.kernel in mma and k.modeled.get("shared"):
            moved = k.shared_load_bytes + k.shared_store_bytes
            assert abs(moved - k.modeled["shared"]) <= 0.01 * k.modeled["shared"], (k.kernel, moved, k.modeled)


def test_cost_model_charges_mma_flops_at_the_tf32_tensor_peak(tmp_path):
    from engine.schedule.cost import segment_use

    graph = load_graph(_matmul(tmp_path / "mm.onnx", 1024, 1024, 1024)[0])
    g_on, on = plan_model(graph, "unfused", "a100", options={"tf32": True})
    names = {k.name for k in generate(on, g_on, "a100").kernels if any(g.mma for g in k.gemms)}
    group = next(g for g in on.groups if g.name in names and len(g.segments) == 1)
    conns, a100 = {e.key: e.conn for e in on.edges}, get_device("a100")
    with tensor_core_options({"tf32": True}):
        use_on = segment_use(g_on, list(group.stages), conns, group.segments[0], device=a100)
    use_off = segment_use(g_on, list(group.stages), conns, group.segments[0], device=a100)
    assert use_on.flops_tc > 0 and use_off.flops_tc == 0
    # the GEMM's multiply-adds move from the FMA count to the tensor-core count
    assert use_on.flops_fp32 < use_off.flops_fp32
    assert 0.5 < (use_on.flops_tc + use_on.flops_fp32) / use_off.flops_fp32 < 2
    # the modeled compute term with the option: the flops at 156 instead of 19.5 TFLOP/s (a100 datasheet)
    _, off = plan_model(graph, "unfused", "a100")
    assert on.groups[0].cost.terms_us["compute"] < off.groups[0].cost.terms_us["compute"] / 4
    assert on.modeled_us < off.modeled_us


ZOO = Path(__file__).resolve().parents[3] / "samples" / "zoo"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "vit"])
def test_zoo_matmuls_on_tensor_cores_match_onnxruntime_under_cuda_sim(name):
    graph = load_graph(ZOO / f"{name}.onnx")
    data = np.load(ZOO / f"{name}.io.npz")
    inputs = {t.name: data[t.name] for t in graph.inputs}
    g_on, on = plan_model(graph, "welder", "a100", options={"tf32": True})
    result = run_model(g_on, inputs, backend="cuda-sim", plan=on, device="a100")
    assert _mma_gemms(result.program)
    assert result.sim.ok, "\n".join(result.sim.summary_lines())
    assert_matches(result.outputs, {n: data[n] for n in graph.output_names}, tol=TF32_TOL)
