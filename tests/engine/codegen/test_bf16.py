"""bfloat16 end to end: bf16 tensors through codegen on the C target (16-bit storage, exact widening and
round-to-nearest-even helpers), CUDA (__nv_bfloat16, cuda_bf16.h) and cuda-sim (its conversions bit-exact),
and bf16 x bf16 contractions on mma.sync m16n8k16 .bf16 where the device has bf16 tensor cores (sm_80 on;
not a V100). The oracle is NumPy float32 math on the bf16 values, rounded to bf16 where the graph stores,
within a stated tolerance, and onnxruntime on an fp32 copy of the graph as a second check (its CPU provider
has few bf16 kernels). No GPU here: nothing runs on tensor cores; cuda-sim runs the printed kernels at
their real launch configuration."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "engine" / "runtime" / "simt"))
sys.path.insert(0, str(ROOT / "samples" / "zoo"))
from bf16 import bf16_inputs, to_bf16  # noqa: E402
from simt_samples import ms  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_mma_f16 import check_sample_mma_compiles, mma16_kernel  # noqa: E402

from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.mma import MMA_BF16, MMA_F16, bf16_mma  # noqa: E402
from engine.codegen.nvrtc import compile_cuda  # noqa: E402
from engine.codegen.opencl import render_opencl  # noqa: E402
from engine.codegen.targets import CUDA_MMA_BF16, render_c, render_cuda  # noqa: E402
from engine.device import get_device  # noqa: E402
from engine.frontend.importer import load_graph  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.runtime.simt.driver import run_cuda_source  # noqa: E402
from engine.schedule.cost import segment_use  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402

PTX_BF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
BF, F = TensorProto.BFLOAT16, TensorProto.FLOAT
bf16 = ml_dtypes.bfloat16


def _save(tmp_path: Path, name: str, nodes, inputs, outputs, inits=()) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _fp32_copy(path: Path) -> Path:
    """The same graph in float32 (bf16 values widened exactly): what onnxruntime's CPU provider runs."""
    model = onnx.load(path)
    g = model.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == BF:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == BF:
            v.type.tensor_type.elem_type = F
    for node in g.node:
        for a in node.attribute:
            if a.name == "to" and a.i == BF:
                a.i = F
    del g.value_info[:]
    out = path.with_suffix(".fp32.onnx")
    onnx.save(model, out)
    return out


def _rand(rng, *shape) -> np.ndarray:
    """Random bf16 values, never zero (a zero hides an unwritten or misplaced element)."""
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < 1e-2, 0.5, x).astype(bf16)


def gemm_graph(tmp_path: Path, m: int, k: int, n: int, rng):
    """ONNX Gemm, B transposed (as exporters write Linear), with a bias row: Y = A @ W^T + c."""
    w, c = _rand(rng, n, k), _rand(rng, n)
    path = _save(tmp_path, "gemm", [helper.make_node("Gemm", ["a", "W", "c"], ["y"], transB=1)],
                 [helper.make_tensor_value_info("a", BF, [m, k])], [helper.make_tensor_value_info("y", BF, [m, n])],
                 [numpy_helper.from_array(w, "W"), numpy_helper.from_array(c, "c")])
    a = _rand(rng, m, k)
    return path, {"a": a}, (a, w.T, c)


def batched_graph(tmp_path: Path, m: int, k: int, n: int, rng):
    """MatMul of two batched inputs: Y[b] = A[b] @ B[b]."""
    path = _save(tmp_path, "bmm", [helper.make_node("MatMul", ["a", "b"], ["y"])],
                 [helper.make_tensor_value_info("a", BF, [3, m, k]), helper.make_tensor_value_info("b", BF, [3, k, n])],
                 [helper.make_tensor_value_info("y", BF, [3, m, n])])
    a, b = _rand(rng, 3, m, k), _rand(rng, 3, k, n)
    return path, {"a": a, "b": b}, (a, b, None)


GRAPHS = {"gemm": gemm_graph, "batched": batched_graph}
# (m, k, n): whole m16n8k16 tiles, then edges in every dimension (m, k not multiples of 16, n not of 8).
SIZES = [(64, 64, 64), (45, 44, 40), (37, 50, 29)]


def check_bf16_product(y: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> float:
    """Assert `y` (bf16) is A @ B (+ c) in float32 math on the bf16 values, within one bf16 ulp of that result
    (the output's rounding, either way of a tie) plus k * 2^-23 * (|A| @ |B| + |c|) (fp32 accumulation in another
    order than NumPy's). Returns the largest error relative to the output's largest magnitude."""
    assert y.dtype == bf16
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    c32 = 0 if c is None else c.astype(np.float32)
    want = a32 @ b32 + c32
    scale = np.abs(a32) @ np.abs(b32) + np.abs(c32)
    ulp = np.spacing(np.abs(want).astype(bf16)).astype(np.float32)
    tol = ulp + a.shape[-1] * 2.0 ** -23 * scale
    err = np.abs(y.astype(np.float32) - want)
    assert (err <= tol).all(), f"{int((err > tol).sum())} elements off; worst {float((err - tol).max())} past"
    return float(err.max() / np.abs(want).max())


def _bf16_gemms(program):
    return [g for k in program.kernels for g in k.gemms if g.mma == MMA_BF16]


@pytest.mark.parametrize("kind", sorted(GRAPHS))
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_bf16_contractions_on_tensor_cores_match_numpy_under_cuda_sim_and_on_c(tmp_path, kind, size):
    path, inputs, (a, b, c) = GRAPHS[kind](tmp_path, *size, np.random.default_rng(sum(size)))
    graph = load_graph(path)
    g, plan = plan_model(graph, "welder", "a100")
    result = run_model(g, inputs, backend="cuda-sim", plan=plan, device="a100")
    assert result.sim.ok, "\n".join(result.sim.summary_lines())
    gemms = _bf16_gemms(result.program)
    assert gemms and all(x.warps_m * x.warps_n * 32 == x.tx * x.ty and x.bk % 16 == 0 for x in gemms)
    y_sim = np.asarray(result.outputs["y"])
    check_bf16_product(y_sim, a, b, c)
    # The emulated threads' shared-memory bytes (bf16 staging, fragment loads) are the count's.
    mma = {k.name for k in result.program.kernels if any(x.mma == MMA_BF16 for x in k.gemms)}
    for k in result.sim.kernels:
        if k.kernel in mma and k.modeled.get("shared"):
            moved = k.shared_load_bytes + k.shared_store_bytes
            assert abs(moved - k.modeled["shared"]) <= 0.01 * k.modeled["shared"], (k.kernel, moved, k.modeled)
    # The C target: the FMA micro-tile on bf16 bits from the same graph.
    cpu = run_model(load_graph(path), inputs, backend="cpu", policy="welder", device="a100")
    y_cpu = np.asarray(cpu.outputs["y"])
    check_bf16_product(y_cpu, a, b, c)
    assert not any(x.mma for k in cpu.program.kernels for x in k.gemms)
    # Second check: onnxruntime on the fp32 copy, within the bf16 output's rounding and accumulation order.
    want = ort.InferenceSession(str(_fp32_copy(path))).run(None, {n: v.astype(np.float32) for n, v in inputs.items()})[0]
    for y in (y_sim, y_cpu):
        err = np.abs(y.astype(np.float32) - want)
        assert (err <= np.spacing(np.abs(want).astype(bf16)).astype(np.float32) + 1e-4 * np.abs(want).max()).all()


def _norm_graph(tmp_path: Path, rows: int, cols: int, rng):
    """Elementwise and reductions on bf16: softmax(x * s + b) and a LayerNorm-like (x - mean) * gamma, every
    intermediate stored as bf16 in the graph."""
    s, bias, gamma = _rand(rng, cols), _rand(rng, cols), _rand(rng, cols)
    nodes = [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Add", ["t", "bias"], ["u"]),
             helper.make_node("Softmax", ["u"], ["p"], axis=-1),
             helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "mu"], ["d"]), helper.make_node("Mul", ["d", "gamma"], ["q"]),
             helper.make_node("Tanh", ["q"], ["r"])]
    path = _save(tmp_path, "norm", nodes, [helper.make_tensor_value_info("x", BF, [rows, cols])],
                 [helper.make_tensor_value_info("p", BF, [rows, cols]), helper.make_tensor_value_info("r", BF, [rows, cols])],
                 [numpy_helper.from_array(v, n) for n, v in (("s", s), ("bias", bias), ("gamma", gamma))])
    x = _rand(rng, rows, cols)

    def r(v):  # stored as bf16
        return v.astype(bf16).astype(np.float32)

    x32, s32, b32, g32 = (v.astype(np.float32) for v in (x, s, bias, gamma))
    u = r(r(x32 * s32) + b32)
    e = np.exp(u - u.max(-1, keepdims=True))
    d = r(x32 - r(x32.mean(-1, keepdims=True)))
    p, q = e / e.sum(-1, keepdims=True), np.tanh(r(d * g32))
    # Tolerances: each skipped or extra rounding moves a value by at most 2^-8 of its magnitude; softmax turns
    # an error in u into that error times p (relative, twice: own term and the sum), tanh's slope is <= 1.
    ulp = 2.0 ** -8
    tol_p = p * ulp * (2 + 2 * (np.abs(u).max() + np.abs(x32 * s32).max()))
    tol_r = ulp * (2 + 3 * np.abs(d * g32) + np.abs(x32).max() * np.abs(g32))
    return path, {"x": x}, {"p": (p, tol_p), "r": (q, tol_r)}


@pytest.mark.parametrize("backend", ["cpu", "cuda-sim"])
@pytest.mark.parametrize("shape", [(16, 64), (7, 45)], ids=lambda s: "x".join(map(str, s)))
def test_bf16_elementwise_and_reductions_match_numpy(tmp_path, backend, shape):
    """Fused kernels may skip the graph's intermediate bf16 roundings (math stays fp32 in registers, as on the
    fp16 path): the tolerance (_norm_graph) bounds what those roundings can move, 2^-8 relative each."""
    path, inputs, want = _norm_graph(tmp_path, *shape, np.random.default_rng(shape[1]))
    graph = load_graph(path)
    g, plan = plan_model(graph, "welder", "a100")
    result = run_model(g, inputs, backend=backend, plan=plan, device="a100")
    if backend == "cuda-sim":
        assert result.sim.ok, "\n".join(result.sim.summary_lines())
    ref = ort.InferenceSession(str(_fp32_copy(path))).run(None, {"x": inputs["x"].astype(np.float32)})
    for (name, (w, tol)), o in zip(want.items(), ref):
        y = np.asarray(result.outputs[name])
        assert y.dtype == bf16 and np.isfinite(y.astype(np.float32)).all()
        assert (np.abs(y.astype(np.float32) - w) <= tol).all(), name
        assert (np.abs(y.astype(np.float32) - o) <= 2 * tol).all(), name  # onnxruntime on the fp32 copy


# Floats whose bf16 rounding is delicate: exact ties (to even, both ways), just past a tie, the largest
# finite bf16 and the overflow past it, subnormals, signed zeros, inf; NaN separately.
_EDGES = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0xBF808000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x00008000,
                   0x00018000, 0x00007FFF, 0x80000001, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000], np.uint32)


def _cast_graph(tmp_path: Path, n: int) -> Path:
    """y = Cast(x, bfloat16); z = Cast(y, float32) * 1 (bf16 widened back)."""
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=BF), helper.make_node("Cast", ["y"], ["w"], to=F),
             helper.make_node("Neg", ["w"], ["z"])]
    return _save(tmp_path, "cast", nodes, [helper.make_tensor_value_info("x", F, [n])],
                 [helper.make_tensor_value_info("y", BF, [n]), helper.make_tensor_value_info("z", F, [n])])


@pytest.mark.parametrize("backend", ["cpu", "cuda-sim"])
def test_bf16_conversions_round_to_nearest_even_bit_exactly(tmp_path, backend):
    rng = np.random.default_rng(11)
    bits = np.concatenate([_EDGES, rng.integers(0, 2 ** 32, 4096 - len(_EDGES) - 2, dtype=np.uint32),
                           np.array([0x7FC00000, 0xFFC00001], np.uint32)])
    x = bits.view(np.float32)
    result = run_model(load_graph(_cast_graph(tmp_path, len(x))), {"x": x}, backend=backend, policy="unfused",
                       device="a100")
    y, z = np.asarray(result.outputs["y"]), np.asarray(result.outputs["z"])
    with np.errstate(invalid="ignore"):
        want = x.astype(bf16)  # ml_dtypes: round to nearest even
    nan = np.isnan(x)
    assert nan.sum() >= 2 and np.isnan(y[nan].astype(np.float32)).all()
    assert y[~nan].view(np.uint16).tolist() == want[~nan].view(np.uint16).tolist()
    assert (-z[~nan]).view(np.uint32).tolist() == want[~nan].astype(np.float32).view(np.uint32).tolist()
    if backend == "cuda-sim":  # cvt.rn.bf16.f32 gives the canonical NaN, as cuda_bf16.hpp's host path does
        assert set(y[nan].view(np.uint16).tolist()) == {0x7FFF}


def test_bf16_tensor_cores_only_where_the_device_has_them(tmp_path):
    path, _, _ = gemm_graph(tmp_path, 64, 64, 64, np.random.default_rng(1))
    graph = load_graph(path)
    for name in ("a100", "h100", "h200", "rtx3090"):
        assert bf16_mma(get_device(name))
        g, plan = plan_model(graph, "welder", name)
        program = generate(plan, g, name)
        gemms = [x for k in program.kernels for x in k.gemms]
        assert gemms and all(x.mma == MMA_BF16 for x in gemms), name
        assert all(x.params["mma"] == MMA_BF16 and "mma.sync m16n8k16.bf16" in x.describe() for x in gemms)
        source = render_cuda(program)
        assert "tw_mma_m16n8k16_bf16" in source and "tw_mma_m16n8k16_f16" not in source
        assert "#include <cuda_bf16.h>" in source and "__nv_bfloat16* st_ba" in source
    v100 = get_device("v100")  # Volta: fp16 tensor cores only, no bf16
    assert "bf16" not in v100.tensor_precisions and not bf16_mma(v100)
    g, plan = plan_model(graph, "welder", "v100")
    program = generate(plan, g, "v100")
    assert program.kernels[0].gemms and not any(x.mma for k in program.kernels for x in k.gemms)
    assert "mma" not in render_cuda(program) and "__bfloat162float" in render_cuda(program)
    # A device with fp16 but not bf16 tensor cores keeps bf16 products off the fp16 path.
    a100 = get_device("a100")
    no_bf16 = dataclasses.replace(a100, tensor_precisions=("fp16",))
    g, plan = plan_model(graph, "welder", no_bf16)
    assert not any(x.mma in (MMA_BF16, MMA_F16) for k in generate(plan, g, no_bf16).kernels for x in k.gemms)
    # C and OpenCL print bf16 as 16-bit integers through the rounding helpers, no mma.
    g, plan = plan_model(graph, "welder", "a100")
    c_source = render_c(generate(plan, g, "a100", target="c"))
    assert "tw_f32_bf16" in c_source and "unsigned short* restrict g_y" in c_source and "tw_mma" not in c_source
    cl = render_opencl(generate(plan, g, "a100"))
    assert "ushort* restrict g_y" in cl and "tw_bf16_f32(" in cl and "__nv_bfloat16" not in cl


@pytest.mark.parametrize("name", ["nerf_mlp", pytest.param("bert_layer", marks=pytest.mark.slow)])
def test_bf16_samples_print_tensor_core_kernels_that_compile_for_sm80_and_sm90(tmp_path, name):
    check_sample_mma_compiles(tmp_path, name, to_bf16, MMA_BF16, PTX_BF16)


@pytest.mark.slow
def test_bf16_sample_runs_under_cuda_sim_and_on_c_near_the_fp32_model(tmp_path):
    """nerf_mlp in bf16 (samples/zoo/bf16.py) against onnxruntime on the fp32 model fed the same bf16 inputs:
    bf16 weights and activations round at 2^-8 relative, so within a few percent of the output's scale."""
    model, inputs = ms.build(next(s for s in ms.SAMPLES if s.name == "nerf_mlp"))
    path = tmp_path / "nerf.bf16.onnx"
    onnx.save(to_bf16(model), path)
    feeds = bf16_inputs(inputs)
    want = ort.InferenceSession(model.SerializeToString()).run(
        None, {k: v.astype(np.float32) if v.dtype == bf16 else v for k, v in feeds.items()})
    for backend in ("cuda-sim", "cpu"):
        g, plan = plan_model(load_graph(path), "welder", "a100")
        result = run_model(g, feeds, backend=backend, plan=plan, device="a100")
        if backend == "cuda-sim":
            assert result.sim.ok and _bf16_gemms(result.program)
        for w, out in zip(want, model.graph.output):
            y = np.asarray(result.outputs[out.name]).astype(np.float32)
            assert np.abs(y - w).max() <= 0.05 * np.abs(w).max(), (backend, out.name)


def test_emulated_m16n8k16_bf16_follows_the_ptx_fragment_layout():
    """One warp, one hand-written mma: A (16x16) and B (16x8) packed into .bf16x2 registers by the PTX ISA's
    table for m16n8k16 (9.7.14.5.8: the same positions as .f16), D = C + A @ B read back by the accumulator
    layout. cuda-sim's result is the fp32 sum of exact products; the same source builds for sm_80."""
    rng = np.random.default_rng(5)
    a, b = _rand(rng, 16, 16), _rand(rng, 16, 8)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    kernel = mma16_kernel("__nv_bfloat16", "tw_pack_bf162", "tw_mma_m16n8k16_bf16")
    (_, _, _, d), report = run_cuda_source(kernel, "mma16", [(a, "in"), (b, "in"), (c, "in"),
                                                            (np.empty((16, 8), np.float32), "out")], grid=1, block=32)
    assert report.ok, report.summary_lines()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = c.astype(np.float64) + a64 @ b64
    assert np.abs(d - want).max() <= 17 * 2.0 ** -24 * (np.abs(c) + np.abs(a64) @ np.abs(b64)).max()
    assert np.abs(d - (c + a64.T @ b64)).max() > 1e-2  # the layout matters
    source = "#include <cuda_bf16.h>\n" + CUDA_MMA_BF16 + kernel
    assert compile_cuda(source, name="mma16bf", arch="sm_80").ptx.count(PTX_BF16) == 1


def test_cost_model_charges_bf16_mma_at_the_16_bit_tensor_peak(tmp_path):
    """A100 and H100 datasheets give the same dense BF16 and FP16 (fp32-accumulate) tensor peaks (312 and 989
    TFLOP/s), so bf16 mma flops go at Device.peak_fp16_tensor_flops, and only where the printer runs them."""
    path, _, _ = batched_graph(tmp_path, 256, 256, 256, np.random.default_rng(3))
    graph = load_graph(path)
    for name, tc in (("a100", True), ("v100", False)):
        g, plan = plan_model(graph, "unfused", name)
        group = plan.groups[0]
        conns = {e.key: e.conn for e in plan.edges}
        use = segment_use(g, list(group.stages), conns, group.segments[0], device=get_device(name))
        assert (use.flops_tc > 0 and use.flops_tc_f16 == use.flops_tc) if tc else use.flops_tc == 0, name


def test_bf16_runs_on_opencl(tmp_path):
    """OpenCL prints bf16 as ushort bits through the same helpers as C, and a Gemm.mma's bf16 staging on its
    FMA micro-tile (no mma.sync in OpenCL C): a GEMM with edge tiles and the elementwise/reduction graph."""
    import os

    from engine.errors import BackendError
    from engine.runtime.opencl import opencl_device

    try:
        opencl_device()
    except BackendError as err:
        if os.environ.get("TILEWEAVE_REQUIRE_OPENCL") == "1":
            raise
        pytest.skip(f"no OpenCL device: {err}")
    path, inputs, (a, b, c) = gemm_graph(tmp_path, 37, 50, 29, np.random.default_rng(7))
    g, plan = plan_model(load_graph(path), "welder", "a100")
    result = run_model(g, inputs, backend="opencl", plan=plan, device="a100")
    assert _bf16_gemms(result.program)
    check_bf16_product(np.asarray(result.outputs["y"]), a, b, c)
    path, inputs, want = _norm_graph(tmp_path, 7, 45, np.random.default_rng(45))
    g, plan = plan_model(load_graph(path), "welder", "a100")
    result = run_model(g, inputs, backend="opencl", plan=plan, device="a100")
    for name, (w, tol) in want.items():
        assert (np.abs(np.asarray(result.outputs[name]).astype(np.float32) - w) <= tol).all(), name


@pytest.mark.slow
def test_bf16_plan_models_no_slower_than_the_fma_plan(tmp_path):
    """As for fp16 (test_mma_f16): bf16 contractions make tensor-core plans, and the FMA plan's groups and
    tiles re-costed on tensor cores are kept where faster (bf16 gpt2 welder on h100 modeled 198.1 against the
    FMA plan's 113.7 µs before bf16 loads counted in pipeline._tensor_cores_apply)."""
    model, _ = ms.build(next(s for s in ms.SAMPLES if s.name == "bert_layer"))
    path = tmp_path / "bert_layer.bf16.onnx"
    onnx.save(to_bf16(model), path)
    graph = load_graph(path)
    h100 = get_device("h100")
    _, plan = plan_model(graph, "welder", h100)
    _, fma = plan_model(graph, "welder", dataclasses.replace(h100, tensor_precisions=(), peak_tf32_tensor_flops=0.0))
    assert plan.modeled_us <= fma.modeled_us + 1e-9 and plan.device == "h100"
    assert any(d.startswith("tensor cores: the FMA plan") for d in plan.decisions)
