"""Tests for engine/codegen/mma.py's fp16 path: contractions of fp16 factors run as mma.sync m16n8k16 .f16
(fp32 accumulate, fp16 staging, packed half2 fragments) where the device takes that shape (sm_80 on; a V100
stays on the FMA micro-tile); the printed kernels compile with NVRTC for sm_80 and sm_90 and run under
cuda-sim (its mma is a warp collective over fp16 operands) at their real launch configuration; the cost
model charges those flops at the fp16 tensor peak and only then. No GPU here: nothing runs on tensor cores."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "engine" / "runtime" / "simt"))
sys.path.insert(0, str(ROOT / "samples" / "zoo"))
from fp16 import fp16_inputs, to_fp16  # noqa: E402
from simt_samples import ms  # noqa: E402

from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.mma import MMA_F16, MMA_TF32, f16_mma  # noqa: E402
from engine.codegen.nvrtc import compile_cuda  # noqa: E402
from engine.codegen.targets import CUDA_MMA_F16, render_c, render_cuda  # noqa: E402
from engine.device import get_device  # noqa: E402
from engine.frontend.importer import load_graph  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.runtime.simt.driver import run_cuda_source  # noqa: E402
from engine.schedule.cost import estimate_group, segment_use  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402

PTX_F16 = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
H = TensorProto.FLOAT16


def _save(tmp_path: Path, name: str, nodes, inputs, outputs, inits=()) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _rand(rng, *shape) -> np.ndarray:
    """Random fp16 values, never zero (a zero hides an unwritten or misplaced element)."""
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < 1e-2, 0.5, x).astype(np.float16)


def gemm_graph(tmp_path: Path, m: int, k: int, n: int, rng):
    """ONNX Gemm, B transposed (as exporters write Linear), with a bias row: Y = A @ W^T + c."""
    w, c = _rand(rng, n, k), _rand(rng, n)
    path = _save(tmp_path, "gemm", [helper.make_node("Gemm", ["a", "W", "c"], ["y"], transB=1)],
                 [helper.make_tensor_value_info("a", H, [m, k])], [helper.make_tensor_value_info("y", H, [m, n])],
                 [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(c, "c")])
    a = _rand(rng, m, k)
    return path, {"a": a}, (a, w.T, c)


def batched_graph(tmp_path: Path, m: int, k: int, n: int, rng):
    """MatMul of two batched inputs: Y[b] = A[b] @ B[b]."""
    path = _save(tmp_path, "bmm", [helper.make_node("MatMul", ["a", "b"], ["y"])],
                 [helper.make_tensor_value_info("a", H, [3, m, k]), helper.make_tensor_value_info("b", H, [3, k, n])],
                 [helper.make_tensor_value_info("y", H, [3, m, n])])
    a, b = _rand(rng, 3, m, k), _rand(rng, 3, k, n)
    return path, {"a": a, "b": b}, (a, b, None)


def linear_graph(tmp_path: Path, m: int, k: int, n: int, rng):
    """torch's Linear on a [2, m, k] activation: MatMul by the transposed weight, then Add of the bias."""
    w, c = _rand(rng, k, n), _rand(rng, n)
    path = _save(tmp_path, "linear", [helper.make_node("MatMul", ["x", "Wt"], ["t"]),
                                      helper.make_node("Add", ["t", "c"], ["y"])],
                 [helper.make_tensor_value_info("x", H, [2, m, k])], [helper.make_tensor_value_info("y", H, [2, m, n])],
                 [onnx.numpy_helper.from_array(w, "Wt"), onnx.numpy_helper.from_array(c, "c")])
    x = _rand(rng, 2, m, k)
    return path, {"x": x}, (x, w, c)


GRAPHS = {"gemm": gemm_graph, "batched": batched_graph, "linear": linear_graph}
# (m, k, n): whole m16n8k16 tiles, then edges in every dimension (m, k not multiples of 16, n not of 8).
SIZES = [(64, 64, 64), (45, 44, 40), (37, 50, 29)]


def _f16_gemms(program):
    return [g for k in program.kernels for g in k.gemms if g.mma == MMA_F16]


def check_fp16_product(y: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> float:
    """Assert `y` (fp16) is A @ B (+ c) in float32 math on the fp16 values, within one fp16 ulp of that result
    (the output's rounding, either way of a tie) plus k * 2^-23 * (|A| @ |B| + |c|) (fp32 accumulation in
    another order than NumPy's: each order is within k * 2^-24 of the exact sum of those magnitudes).
    Returns the largest error relative to the output's largest magnitude."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    want = a32 @ b32 + (0 if c is None else c.astype(np.float32))
    scale = np.abs(a32) @ np.abs(b32) + (0 if c is None else np.abs(c.astype(np.float32)))
    k = a.shape[-1]
    tol = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32) + k * 2.0 ** -23 * scale
    err = np.abs(y.astype(np.float32) - want)
    assert (err <= tol).all(), f"{int((err > tol).sum())} elements off; worst {float((err - tol).max())} past"
    return float(err.max() / np.abs(want).max())


@pytest.mark.parametrize("kind", sorted(GRAPHS))
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_fp16_contractions_on_tensor_cores_match_numpy_under_cuda_sim(tmp_path, kind, size):
    path, inputs, (a, b, c) = GRAPHS[kind](tmp_path, *size, np.random.default_rng(sum(size)))
    graph = load_graph(path)
    g, plan = plan_model(graph, "welder", "a100")
    result = run_model(g, inputs, backend="cuda-sim", plan=plan, device="a100")
    assert result.sim.ok, "\n".join(result.sim.summary_lines())
    gemms = _f16_gemms(result.program)
    assert gemms and all(x.warps_m * x.warps_n * 32 == x.tx * x.ty and x.bk % 16 == 0 for x in gemms)
    check_fp16_product(np.asarray(result.outputs["y"]), a, b, c)
    # The shared-memory bytes the emulated threads moved (fp16 staging and fragment loads) are the count's.
    mma = {k.name for k in result.program.kernels if _f16_gemms_of(k)}
    for k in result.sim.kernels:
        if k.kernel in mma and k.modeled.get("shared"):
            moved = k.shared_load_bytes + k.shared_store_bytes
            assert abs(moved - k.modeled["shared"]) <= 0.01 * k.modeled["shared"], (k.kernel, moved, k.modeled)
    source = render_cuda(result.program)
    for arch in ("sm_80", "sm_90"):
        binary = compile_cuda(source, name=result.program.name, arch=arch)
        assert binary.ptx.count(PTX_F16) >= len(gemms) and binary.cubin[:4] == b"\x7fELF"


def _f16_gemms_of(kernel):
    return [g for g in kernel.gemms if g.mma == MMA_F16]


def test_fp16_tensor_cores_only_where_the_device_takes_m16n8k16(tmp_path):
    path, _, _ = gemm_graph(tmp_path, 64, 64, 64, np.random.default_rng(1))
    graph = load_graph(path)
    for name in ("a100", "h100", "h200", "rtx3090"):
        assert f16_mma(get_device(name))
        g, plan = plan_model(graph, "welder", name)
        program = generate(plan, g, name)
        gemms = [x for k in program.kernels for x in k.gemms]
        assert gemms and all(x.mma == MMA_F16 for x in gemms), name
        assert all(x.params["mma"] == MMA_F16 and "mma.sync m16n8k16.f16" in x.describe() for x in gemms)
        assert "tw_mma_m16n8k16_f16" in render_cuda(program) and "tw_mma_m16n8k8_tf32" not in render_cuda(program)
    # V100: fp16 tensor cores, but only mma.m8n8k4, which we do not print: the FMA micro-tile.
    v100 = get_device("v100")
    assert "fp16" in v100.tensor_precisions and not f16_mma(v100)
    g, plan = plan_model(graph, "welder", "v100")
    program = generate(plan, g, "v100")
    assert program.kernels[0].gemms and not any(x.mma for k in program.kernels for x in k.gemms)
    assert "mma" not in render_cuda(program)
    # The C target prints the FMA micro-tile from the same plan.
    g, plan = plan_model(graph, "welder", "a100")
    c_program = generate(plan, g, "a100", target="c")
    assert not any(x.mma for k in c_program.kernels for x in k.gemms) and "tw_mma" not in render_c(c_program)


def test_fp32_contractions_stay_off_the_fp16_path(tmp_path):
    w = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    path = _save(tmp_path, "mm32", [helper.make_node("MatMul", ["a", "B"], ["y"])],
                 [helper.make_tensor_value_info("a", TensorProto.FLOAT, [64, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], [onnx.numpy_helper.from_array(w, "B")])
    graph = load_graph(path)
    g, plan = plan_model(graph, "welder", "a100")
    assert not any(x.mma for k in generate(plan, g, "a100").kernels for x in k.gemms)
    g, plan = plan_model(graph, "welder", "a100", options={"tf32": True})
    assert {x.mma for k in generate(plan, g, "a100").kernels for x in k.gemms} == {MMA_TF32}


def mma16_kernel(ctype: str, pack: str, mma: str) -> str:
    """One warp, one mma: A (16x16) and B (16x8) of `ctype` packed into registers by the PTX ISA's table for
    m16n8k16 (9.7.14.5.8; .f16 and .bf16 share it, written out here independently of the printer), C added,
    D read back by the accumulator layout."""
    return f"""
extern "C" __global__ void mma16(const {ctype}* a, const {ctype}* b, const float* c, float* d) {{
    const int lane = threadIdx.x, grp = lane >> 2, tig = lane & 3;
    unsigned ra[4], rb[2];
    for (int r = 0; r < 4; ++r) {{  // a_{{2r}}, a_{{2r+1}}: row grp (+8 for r odd), k 2 tig (+8 for r >= 2)
        const int row = grp + 8 * (r & 1), k = 2 * tig + 8 * (r >> 1);
        ra[r] = {pack}(a[row * 16 + k], a[row * 16 + k + 1]);
    }}
    for (int r = 0; r < 2; ++r) rb[r] = {pack}(b[(2 * tig + 8 * r) * 8 + grp], b[(2 * tig + 8 * r + 1) * 8 + grp]);
    float acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = c[(grp + 8 * (i >> 1)) * 8 + 2 * tig + (i & 1)];
    {mma}(acc[0], acc[1], acc[2], acc[3], ra[0], ra[1], ra[2], ra[3], rb[0], rb[1]);
    for (int i = 0; i < 4; ++i) d[(grp + 8 * (i >> 1)) * 8 + 2 * tig + (i & 1)] = acc[i];
}}
"""


def test_emulated_m16n8k16_follows_the_ptx_fragment_layout():
    """One warp, one hand-written mma: A (16x16) and B (16x8) packed into registers by the PTX ISA's table
    for m16n8k16 .f16 (written out again here), D = C + A @ B read back by the accumulator layout. cuda-sim's
    result is the fp32 sum of exact products; the same source builds for sm_80 with the inline-PTX helper."""
    rng = np.random.default_rng(5)
    a, b = _rand(rng, 16, 16), _rand(rng, 16, 8)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    kernel = mma16_kernel("__half", "tw_pack_half2", "tw_mma_m16n8k16_f16")
    (_, _, _, d), report = run_cuda_source(kernel, "mma16", [(a, "in"), (b, "in"), (c, "in"),
                                                            (np.empty((16, 8), np.float32), "out")], grid=1, block=32)
    assert report.ok, report.summary_lines()
    want = c.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(d - want).max() <= 17 * 2.0 ** -24 * (np.abs(c) + np.abs(a.astype(np.float64)) @ np.abs(b)).max()
    assert np.abs(d - (c + a.astype(np.float32).T[:16, :16] @ b.astype(np.float32))).max() > 1e-2  # layout matters
    source = "#include <cuda_fp16.h>\n" + CUDA_MMA_F16 + kernel
    assert compile_cuda(source, name="mma16", arch="sm_80").ptx.count(PTX_F16) == 1


@pytest.mark.parametrize("name", ["nerf_mlp", pytest.param("bert_layer", marks=pytest.mark.slow),
                                  pytest.param("vit_block", marks=pytest.mark.slow)])
def test_fp16_samples_print_tensor_core_kernels_that_compile_for_sm80_and_sm90(tmp_path, name):
    check_sample_mma_compiles(tmp_path, name, to_fp16, MMA_F16, PTX_F16)


def check_sample_mma_compiles(tmp_path: Path, name: str, convert, mma: str, ptx: str) -> None:
    """Sample `name` converted by `convert` (to fp16 or bf16), planned for a100: its GEMMs take `mma`, and its
    CUDA compiles for sm_80 and sm_90 with at least one `ptx` instruction per such GEMM."""
    model, _ = ms.build(next(s for s in ms.SAMPLES if s.name == name))
    path = tmp_path / f"{name}.{convert.__name__}.onnx"
    onnx.save(convert(model), path)
    g, plan = plan_model(load_graph(path), "welder", "a100")
    program = generate(plan, g, "a100")
    gemms = [x for k in program.kernels for x in k.gemms if x.mma == mma]
    assert gemms
    source = render_cuda(program)
    for arch in ("sm_80", "sm_90"):
        binary = compile_cuda(source, name=program.name, arch=arch)
        assert binary.ptx.count(ptx) >= len(gemms) and binary.cubin[:4] == b"\x7fELF"


def test_fp16_plan_models_no_slower_than_the_fma_plan(tmp_path, monkeypatch):
    """The search with cheaper GEMMs found a slower plan for fp16 bert_layer on h100 (190.6 against the FMA
    plan's 167.2 µs): the FMA plan's groups and tiles, re-costed on tensor cores, are kept where faster."""
    model, _ = ms.build(next(s for s in ms.SAMPLES if s.name == "bert_layer"))
    path = tmp_path / "bert_layer.fp16.onnx"
    onnx.save(to_fp16(model), path)
    graph = load_graph(path)
    h100 = get_device("h100")
    _, plan = plan_model(graph, "welder", h100)
    _, fma = plan_model(graph, "welder", dataclasses.replace(h100, tensor_precisions=(), peak_tf32_tensor_flops=0.0))
    assert plan.modeled_us <= fma.modeled_us + 1e-9 and plan.device == "h100"
    # The guard itself, on the walk's own tensor-core plan as it was before the walk weighed a side at the
    # tiles it kept (sched4; 190.6 us then, 120.5 now and not beaten), still takes the FMA plan's groups
    # and tiles.
    import time

    from engine.schedule import build
    from engine.schedule.pipeline import _at_least_the_fma_plan, batch_graph
    from engine.schedule.policies.welder import welder_walk

    stands = build._as_it_stands
    monkeypatch.setattr(build, "_as_it_stands", lambda g, s, c, d, m, kept: stands(g, s, c, d, m, None))
    batched, _ = batch_graph(graph)
    walk = welder_walk(batched, h100, {"batching": True}, time.perf_counter())
    guarded = _at_least_the_fma_plan(batched, "welder", h100, walk)
    assert guarded.modeled_us < walk.modeled_us
    assert any(d.startswith("tensor cores: the FMA plan") for d in guarded.decisions)


def test_cost_model_charges_fp16_mma_at_the_fp16_tensor_peak_and_fma_at_the_fp32_peak(tmp_path):
    path, _, _ = batched_graph(tmp_path, 512, 512, 512, np.random.default_rng(3))
    graph = load_graph(path)

    def compute_us(plan, g, device):
        group = plan.groups[0]
        conns = {e.key: e.conn for e in plan.edges}
        return estimate_group(g, group.stages, conns, group.segments, device).terms_us["compute"], group, conns

    a100 = get_device("a100")
    g, plan = plan_model(graph, "unfused", a100)
    assert len(plan.groups) == 1
    base, group, conns = compute_us(plan, g, a100)
    use = segment_use(g, list(group.stages), conns, group.segments[0], device=a100)
    assert use.flops_tc > 0 and use.flops_tc_f16 == use.flops_tc  # every tensor-core flop is fp16
    # The fp16 peak sets the term; the TF32 peak does not; most of the term is the mma flops.
    assert compute_us(plan, g, dataclasses.replace(a100, peak_tf32_tensor_flops=a100.peak_tf32_tensor_flops / 4))[0] == base
    faster = compute_us(plan, g, dataclasses.replace(a100, peak_fp16_tensor_flops=a100.peak_fp16_tensor_flops * 2))[0]
    assert faster < 0.6 * base
    # V100 prints the FMA micro-tile: no tensor-core flops, the term moves with the fp32 peak alone.
    v100 = get_device("v100")
    g, plan = plan_model(graph, "unfused", v100)
    fma, group, conns = compute_us(plan, g, v100)
    assert segment_use(g, list(group.stages), conns, group.segments[0], device=v100).flops_tc == 0
    assert compute_us(plan, g, dataclasses.replace(v100, peak_fp16_tensor_flops=v100.peak_fp16_tensor_flops * 4))[0] == fma
    assert compute_us(plan, g, dataclasses.replace(v100, peak_fp32_flops=v100.peak_fp32_flops * 2))[0] < 0.6 * fma
    # Against the same contraction on a100's fp32 cores: 312 against 19.5 TFLOP/s (datasheet).
    assert base < fma * v100.peak_fp32_flops / a100.peak_fp16_tensor_flops * 4


def test_persistent_kernel_with_fp16_tensor_cores_runs_under_cuda_sim(tmp_path):
    """The rProgram's persistent kernel carries the tasks' mma helpers (inline PTX, not printer HELPERS)."""
    from engine.rprogram.persistent import persistent_cuda
    from engine.rprogram.wavefront import build_rprogram, plan_for_rprogram
    from engine.runtime.simt.persistent import run_persistent_simt
    from engine.schedule.policies import make_plan

    rng = np.random.default_rng(7)
    w1, w2 = _rand(rng, 48, 64) * np.float16(0.2), _rand(rng, 64, 32) * np.float16(0.2)
    path = _save(tmp_path, "mlp", [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                                   helper.make_node("MatMul", ["r", "W2"], ["y"])],
                 [helper.make_tensor_value_info("x", H, [64, 48])], [helper.make_tensor_value_info("y", H, [64, 32])],
                 [onnx.numpy_helper.from_array(w1, "W1"), onnx.numpy_helper.from_array(w2, "W2")])
    graph, inputs = load_graph(path), {"x": _rand(rng, 64, 48)}
    a100 = get_device("a100")
    small = dataclasses.replace(a100, name="a100-2sm", sm_count=2)
    plan = make_plan(graph, "welder", a100)
    rp = build_rprogram(plan, small, graph=graph)
    program = generate(plan_for_rprogram(plan, rp, graph, small), graph, small)
    assert _f16_gemms(program)
    source = persistent_cuda(program, rp).source
    assert source.count("void tw_mma_m16n8k16_f16(") == 1
    assert compile_cuda(source, name="persistent", arch="sm_80").ptx.count(PTX_F16) >= 1
    outs, report = run_persistent_simt(program, rp, graph, inputs, device=small)
    assert report.ok, "\n".join(report.summary_lines())
    want = run_model(graph, inputs, backend="reference").outputs
    for n in graph.output_names:  # fp16 outputs: a couple of ulps of the largest
        y, w = np.asarray(outs[n], np.float32), np.asarray(want[n], np.float32)
        assert np.abs(y - w).max() <= 4e-3 * np.abs(w).max(), n


ZOO = ROOT / "samples" / "zoo"
# fp16 everywhere in onnxruntime, fp16 only at graph tensors in ours (a fused kernel keeps fp32 between
# its stages): a few fp16 ulps (2^-10 relative at the top) of the largest output apart.
ZOO_TOL = 5e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["nerf", "gpt2"])
def test_fp16_zoo_models_on_tensor_cores_match_onnxruntime_under_cuda_sim(tmp_path, name):
    import onnxruntime as ort

    path = tmp_path / f"{name}.fp16.onnx"
    onnx.save(to_fp16(onnx.load(ZOO / f"{name}.onnx")), path)
    graph = load_graph(path)
    data = np.load(ZOO / f"{name}.io.npz")
    inputs = fp16_inputs({t.name: data[t.name] for t in graph.inputs})
    g, plan = plan_model(graph, "welder", "a100")
    result = run_model(g, inputs, backend="cuda-sim", plan=plan, device="a100")
    assert _f16_gemms(result.program)
    assert result.sim.ok, "\n".join(result.sim.summary_lines())
    want = ort.InferenceSession(str(path)).run(None, inputs)
    for n, w in zip(graph.output_names, want):
        y = np.asarray(result.outputs[n], np.float32)
        assert np.abs(y - w.astype(np.float32)).max() <= ZOO_TOL * np.abs(w.astype(np.float32)).max(), n
