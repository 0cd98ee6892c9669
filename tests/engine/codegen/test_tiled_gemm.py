"""Tiled GEMM phases (engine/codegen/generate.py `_map_gemm`, printer `render_gemm_phase`): which
contractions are tiled, that partial m/n/k tiles and fused epilogues still match onnxruntime on the
C backend, and that the CUDA form (shared A/B tiles, barriers, register micro-tiles) compiles."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from plans import fuse_all, make_test_plan, policy_plan  # noqa: E402
from sample_io import load_sample  # noqa: E402
from support import max_rel_error, run_ort  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.nvrtc import compile_cuda  # noqa: E402
from engine.codegen.targets import render_c, render_cuda  # noqa: E402
from engine.runtime.execute import run_model  # noqa: E402
from engine.schedule.plan import Conn, Tile  # noqa: E402

TOL = 1e-4


def _gemm_model(path: Path, a_shape, b_shape) -> Path:
    """y = relu(A @ B + bias): A an input, B and bias constants (random, fixed seed)."""
    rng = np.random.default_rng(7)
    b = rng.standard_normal(b_shape).astype(np.float32)
    bias = rng.standard_normal(b_shape[-1]).astype(np.float32)
    out = [*a_shape[:-1], b_shape[-1]]
    nodes = [helper.make_node("MatMul", ["a", "B"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "bias"], ["sum"], name="add"),
             helper.make_node("Relu", ["sum"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        [onnx.numpy_helper.from_array(b, "B"), onnx.numpy_helper.from_array(bias, "bias")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _phases(program):
    return [p for k in program.kernels for s in k.segments for p in s.phases]


@pytest.mark.parametrize("a_shape,b_shape,tile,reduce_step", [
    ((37, 45), (45, 29), (16, 8), (8,)),  # partial tiles in m, n and k
    ((2, 3, 19, 21), (2, 3, 21, 17), (1, 1, 8, 16), (32,)),  # batched; one k step covers all of k
])
def test_fused_gemm_with_partial_tiles_matches_onnxruntime(tmp_path, a_shape, b_shape, tile, reduce_step):
    path = _gemm_model(tmp_path / "gemm.onnx", a_shape, b_shape)
    graph = load_graph(path)
    blocks = int(np.prod([-(-n // t) for n, t in zip(graph.stage("y").shape, tile)]))
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", tile, 64, blocks)})
    group = plan.groups[0]
    plan = dataclasses.replace(plan, groups=(dataclasses.replace(
        group, segments=tuple(dataclasses.replace(t, reduce_step=reduce_step) for t in group.segments)),))
    program = generate(plan, graph)
    (phase,) = _phases(program)
    g = phase.gemm
    assert g is not None and g.target is not None  # the matmul is inlined into its relu epilogue
    assert (g.bm, g.bn, g.bk) == (tile[-2], tile[-1], min(reduce_step[0], a_shape[-1]))
    assert g.tx * g.ty == program.kernels[0].threads and g.tm * g.ty >= g.bm and g.tn * g.tx >= g.bn
    x = np.random.default_rng(3).standard_normal(a_shape).astype(np.float32)
    result = run_model(graph, {"a": x}, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, {"a": x})["y"]) <= TOL
    cuda = render_cuda(program)
    assert "float* st_a = (float*)(smem" in cuda and cuda.count("__syncthreads();") >= 2
    assert f"float acc[{g.tm * g.tn}];" in cuda
    assert f".entry {program.kernels[0].name}(" in compile_cuda(cuda, name=program.name, arch="sm_80").ptx
    assert "#pragma omp simd" in render_c(program)


def test_welder_gemm_epilogues_are_tiled_and_shared_memory_counts_staging():
    graph = load_sample("nerf_mlp")[0]
    program = generate(policy_plan(graph, "welder"), graph)
    tiled = [p for p in _phases(program) if p.gemm is not None]
    assert len(tiled) >= 8  # every Linear of the MLP, epilogues (bias + relu) at REGISTER
    for k in program.kernels:
        a, b = k.staging
        assert k.shared_bytes >= k.locals_bytes + 4 * (a + b)
        assert all(p.gemm.a_elems <= a for s in k.segments for p in s.phases if p.gemm)
    assert any("tiled gemm" in line for k in program.kernels for s in k.segments
               for line in (p.describe() for p in s.phases))


def test_non_gemm_contractions_keep_the_per_element_loop():
    """A 3x3 convolution's input factor depends on both output axes: no rows x cols split."""
    graph = load_sample("conv_bn_relu")[0]
    program = generate(policy_plan(graph, "welder"), graph)
    assert all(p.gemm is None for p in _phases(program) if "conv" in p.stage.lower())


def _row_gemm(tmp_path, k: int):
    """y = (x * sqrt(sum_row(x^2))) @ W for x [20, k], W [k, 24]."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((k, 24)).astype(np.float32)
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
             helper.make_node("ReduceSum", ["sq", "axes"], ["s"], name="sum", keepdims=1),
             helper.make_node("Sqrt", ["s"], ["r"], name="sqrt"),
             helper.make_node("Mul", ["x", "r"], ["xs"], name="scale"),
             helper.make_node("MatMul", ["xs", "W"], ["y"], name="mm")]
    graph_proto = helper.make_graph(
        nodes, "rowgemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [20, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [20, 24])],
        [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")])
    path = tmp_path / f"rowgemm{k}.onnx"
    onnx.save(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path, load_graph(path)


def test_row_reduction_inside_factor_a_is_staged_once_per_row(tmp_path):
    """y = (x * sqrt(sum_row(x^2))) @ W with every edge at REGISTER: the row sum is an inlined,
    k-invariant reduction inside factor a, computed per staged row before its k loop (both printers).
    With k in one step (24 <= 32) that is once per row: legal, and the result matches onnxruntime.
    With k = 40 (two steps of 32) each row's sum would run twice — validate refuses it (rule 2, with
    the count), and at SHARED the sum is computed once per row and matches."""
    from engine.codegen.count import count_kernel
    from engine.codegen.kexpr import Reduce, kwalk
    from engine.device import get_device
    from engine.schedule.validate import validate

    rng = np.random.default_rng(5)
    path, graph = _row_gemm(tmp_path, 24)
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", (8, 16), 32, 6)})
    assert not validate(plan, graph, get_device("a100"))
    program = generate(plan, graph)
    (phase,) = _phases(program)
    assert phase.gemm is not None and any(isinstance(x, Reduce) for x in kwalk(phase.gemm.a))
    c = render_c(program)
    staging = c[c.index("for (int mm = 0; mm < m_n; ++mm)"):c.index("for (int kk = 0; kk < k_n; ++kk)")]
    assert "for (int u" in staging  # the row's sum runs before its k loop
    cuda = render_cuda(program)
    assert "for (int mm = threadIdx.x;" in cuda
    assert f".entry {program.kernels[0].name}(" in compile_cuda(cuda, name=program.name, arch="sm_80").ptx
    x = rng.standard_normal((20, 24)).astype(np.float32)
    result = run_model(graph, {"x": x}, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, {"x": x})["y"]) <= TOL

    path, graph = _row_gemm(tmp_path, 40)
    bad = validate(make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER),
                                  {"y": Tile("", (8, 16), 32, 6)}), graph, get_device("a100"))
    assert any(v.rule == "register_one_to_many" and "recompute 2x > 1x" in v.message for v in bad)
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.SHARED), {"y": Tile("", (8, 24), 32, 3)})
    assert not validate(plan, graph, get_device("a100"))
    program = generate(plan, graph)
    assert count_kernel(program.kernels[0]).evals["s"] == 20  # each row's sum once
    x = rng.standard_normal((20, 40)).astype(np.float32)
    result = run_model(graph, {"x": x}, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, {"x": x})["y"]) <= TOL


def test_transposed_operands_are_staged_along_their_contiguous_axis(tmp_path):
    """y = relu(At)^T @ W^T (At [k, m] and W [n, k] inputs: both factors have their contiguous
    axis where the plain order has its outer loop, as lstm's h @ R^T and attention's Q @ K^T do): the
    C printer stages A (computed: the relu is inlined into the load) with k outside and B (rows of
    12 > GEMV_ROWS, so no dot products) in column bands with k inside, and with partial tiles (rows
    past the last 4-row block, columns padded to 16) the result still matches onnxruntime. An
    untransposed GEMM of a computed A keeps the plain orders."""
    rng = np.random.default_rng(11)
    m, k, n = 23, 37, 45
    nodes = [helper.make_node("Relu", ["at"], ["ra"], name="relu"),
             helper.make_node("Transpose", ["ra"], ["a"], name="ta", perm=[1, 0]),
             helper.make_node("Transpose", ["W"], ["b"], name="tb", perm=[1, 0]),
             helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    graph_proto = helper.make_graph(
        nodes, "tgemm", [helper.make_tensor_value_info("at", TensorProto.FLOAT, [k, m]),
                         helper.make_tensor_value_info("W", TensorProto.FLOAT, [n, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])])
    path = tmp_path / "tgemm.onnx"
    onnx.save(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    graph = load_graph(path)
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", (12, 24), 64, 4)})
    program = generate(plan, graph)
    (phase,) = _phases(program)
    assert phase.gemm is not None
    c = render_c(program)
    stage = c[c.index("for (int k0 = 0;"):c.index("for (int mm = 0; mm + 4 <= m_n; mm += 4)")]
    assert stage.index("for (int kk = 0;") < stage.index("for (int mm = 0; mm < m_n; ++mm)")  # A: k outside
    assert "for (int nb = 0; nb < n_n; nb += 16)" in stage  # B: banded, k inside
    assert "float st_a[384], st_b[1024], acc[384];" in c  # B's rows and acc padded to 32 columns
    assert "a_in" not in c and "b_in" not in c
    feeds = {"at": rng.standard_normal((k, m)).astype(np.float32), "W": rng.standard_normal((n, k)).astype(np.float32)}
    result = run_model(graph, feeds, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, feeds)["y"]) <= TOL

    plain = load_graph(_computed_model(tmp_path / "gemm.onnx", (m, k), (k, n)))
    plain_c = render_c(generate(make_test_plan(plain, fuse_all(plain, reduce_conn=Conn.REGISTER),
                                               {"y": Tile("", (12, 24), 64, 4)}), plain))
    stage = plain_c[plain_c.index("for (int k0 = 0;"):plain_c.index("for (int mm = 0; mm + 4 <= m_n; mm += 4)")]
    assert "nb += 16" not in stage and "b_in" not in plain_c  # a staged B (computed) keeps k outside
    assert stage.index("for (int mm = 0; mm < m_n; ++mm)") < stage.index("for (int kk = 0;")


def _computed_model(path: Path, a_shape, b_shape) -> Path:
    """y = exp(a) @ tanh(b), a and b inputs: both factors computed in their loads."""
    nodes = [helper.make_node("Exp", ["a"], ["ea"], name="exp"),
             helper.make_node("Tanh", ["b"], ["tb"], name="tanh"),
             helper.make_node("MatMul", ["ea", "tb"], ["y"], name="mm")]
    graph = helper.make_graph(
        nodes, "cgemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape)),
                         helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*a_shape[:-1], b_shape[-1]])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


@pytest.mark.parametrize("a_shape,b_shape,tile", [
    ((37, 45), (45, 29), (16, 8)),  # 8-column tiles: no whole chunk of 16, only the tail
    ((23, 70), (70, 53), (12, 40)),  # whole chunks and a tail; 4-row blocks and single rows
    ((2, 9, 33), (33, 50), (1, 5, 24)),  # batched A, B shared by the batch
])
def test_plain_factors_are_read_in_place(tmp_path, a_shape, b_shape, tile):
    """relu(A @ B + bias) with A an input and B a row-major constant: both are plain affine loads,
    so the C printer stages neither (no st_a/st_b, no copy per k step), reads B's rows in place and
    stops its column chunks at n_n (no padding columns to read past B's end), and still matches
    onnxruntime. The same GEMM with both factors computed stages both; CUDA still stages and compiles."""
    path = _gemm_model(tmp_path / "gemm.onnx", a_shape, b_shape)
    graph = load_graph(path)
    blocks = int(np.prod([-(-n // t) for n, t in zip(graph.stage("y").shape, tile)]))
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", tile, 64, blocks)})
    program = generate(plan, graph)
    (phase,) = _phases(program)
    assert phase.gemm is not None
    c = render_c(program)
    assert "st_a" not in c and "st_b" not in c
    assert "const float* restrict brow = b_in + (k0 + kk) * " in c and "a_in[(mm + 3) * " in c
    assert "n0 + 16 <= n_n" in c and "n0 = n_n - n_n % 16" in c
    x = np.random.default_rng(3).standard_normal(a_shape).astype(np.float32)
    result = run_model(graph, {"a": x}, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, {"a": x})["y"]) <= TOL
    cuda = render_cuda(program)
    assert "a_in" not in cuda and "float* st_b = (float*)(smem" in cuda
    assert f".entry {program.kernels[0].name}(" in compile_cuda(cuda, name=program.name, arch="sm_80").ptx

    path = _computed_model(tmp_path / "cgemm.onnx", a_shape, b_shape)
    graph = load_graph(path)
    # Each row tile recomputes tanh(B) and each column tile exp(A) (the tiles' overlap, several times
    # their size): allowed by the plan's bound, as the staging is what this part is about.
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", tile, 64, blocks)},
                          options={"recompute_bound": 16.0})
    c = render_c(generate(plan, graph))
    assert "st_a[" in c and "st_b[" in c and "a_in" not in c and "b_in" not in c
    rng = np.random.default_rng(4)
    feeds = {"a": 0.5 * rng.standard_normal(a_shape).astype(np.float32),
             "b": rng.standard_normal(b_shape).astype(np.float32)}
    result = run_model(graph, feeds, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, feeds)["y"]) <= TOL


def _a_times_w_transposed(path, m: int, k: int, n: int, tile, computed: bool = False):
    """y = A @ W^T with W [n, k] an input (a constant's transpose would be folded: B contiguous along k),
    A = h or sigmoid(h) (`computed`), planned as one kernel at `tile`: (path, graph, plan, program)."""
    nodes = [helper.make_node("Transpose", ["W"], ["wt"], name="tw", perm=[1, 0])]
    nodes += [helper.make_node("Sigmoid", ["h"], ["hs"], name="sig")] if computed else []
    nodes += [helper.make_node("MatMul", ["hs" if computed else "h", "wt"], ["y"], name="mm")]
    graph_proto = helper.make_graph(
        nodes, "gemv", [helper.make_tensor_value_info("h", TensorProto.FLOAT, [m, k]),
                        helper.make_tensor_value_info("W", TensorProto.FLOAT, [n, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])])
    onnx.save(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    graph = load_graph(path)
    blocks = int(np.prod([-(-s // t) for s, t in zip((m, n), tile)]))
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", tile, 64, blocks)})
    program = generate(plan, graph)
    (phase,) = _phases(program)
    assert phase.gemm is not None
    return path, graph, plan, program


def _matches_onnxruntime(path, graph, plan, rng, m: int, k: int, n: int) -> None:
    feeds = {"h": rng.standard_normal((m, k)).astype(np.float32), "W": rng.standard_normal((n, k)).astype(np.float32)}
    result = run_model(graph, feeds, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, feeds)["y"]) <= TOL


@pytest.mark.parametrize("m,k,n,tile,computed", [
    (1, 256, 96, (1, 64), False),  # lstm's h @ R^T: k a multiple of the lanes; a partial column tile
    (3, 75, 40, (3, 16), False),  # k past the last 32 lanes; three rows
    (2, 50, 33, (2, 32), True),  # A computed: its rows are staged once over the whole of k
])
def test_tiny_m_with_k_contiguous_b_runs_as_dot_products(tmp_path, m, k, n, tile, computed):
    """y = A @ W^T with W [n, k] (B contiguous along k) and tiles of at most GEMV_ROWS rows: each
    output is a dot product over the whole of k with 32 lane partial sums, B read in place (no
    staging, no k steps); the k order differs from onnxruntime's, and the result still matches it
    to 1e-4 relative (an error in the lanes or the k remainder would be of the order of the values)."""
    path, graph, plan, program = _a_times_w_transposed(tmp_path / "gemv.onnx", m, k, n, tile, computed)
    c = render_c(program)
    assert "float part[32];" in c and "b_in + nn * " in c and "st_b" not in c and "k0 += 32" in c
    assert ("kf = 64; kf < 75" in c) == (k == 75)
    assert (f"float st_a[{tile[0] * k}];" in c) == computed
    _matches_onnxruntime(path, graph, plan, np.random.default_rng(17), m, k, n)
    cuda = render_cuda(program)
    assert f".entry {program.kernels[0].name}(" in compile_cuda(cuda, name=program.name, arch="sm_80").ptx


@pytest.mark.parametrize("m,k,n,tile,dots", [
    (96, 128, 1, (96, 1), True),  # nerf's sigma head: one column, A read in place along k
    (40, 75, 3, (16, 3), True),  # its RGB head's three columns; k past the last 32 lanes; a partial row tile
    (40, 16, 3, (40, 3), False),  # k under one 32-lane step: the micro-kernel
    (40, 64, 5, (40, 5), False),  # five columns: the micro-kernel
])
def test_few_columns_with_k_contiguous_factors_run_as_dot_products(tmp_path, m, k, n, tile, dots):
    """y = A @ W^T with W [n, k] and A read in place along k: a tile of at most GEMV_COLS columns runs as
    dot products (the micro-kernel pads its columns to GEMM_COLS: one column did 16x the multiply-adds),
    a wider one or a short k as the micro-kernel; either matches onnxruntime."""
    path, graph, plan, program = _a_times_w_transposed(tmp_path / "skinny.onnx", m, k, n, tile)
    c = render_c(program)
    assert ("float part[32];" in c and "arow = a_in + mm * " in c and "st_a" not in c) == dots
    _matches_onnxruntime(path, graph, plan, np.random.default_rng(19), m, k, n)


def test_b_rows_that_crowd_one_cache_set_are_staged():
    """B's rows read in place 12 KiB apart (bert's [768, 3072] weight) all fall in one L1 set, so a
    tile with several row groups stages them; 1.5 KiB apart (a 384-wide B) they spread over 8 sets."""
    from engine.codegen.ctarget import _rows_share_sets

    assert _rows_share_sets(3072, 32) and _rows_share_sets(1024, 32) and _rows_share_sets(1536, 32)
    assert not _rows_share_sets(384, 32) and not _rows_share_sets(29, 32) and not _rows_share_sets(3072, 4)


@pytest.mark.parametrize("a_shape,tile,rows", [
    ((1, 5, 7, 24), (1, 2, 7, 16), 2),  # a channels-last image: the tile's rows span H (partial) and W
    ((3, 6, 10, 24), (2, 3, 10, 16), 3),  # a batch of token rows under one weight: three row axes
])
def test_gemm_rows_span_several_axes_on_both_printers(tmp_path, a_shape, tile, rows):
    """A tile several elements wide in more than one axis before the last, with B independent of them,
    runs as one GEMM whose rows are those axes flattened (partial tiles included), on the C target and in
    the CUDA printed from the same kernel IR (NVRTC compiles it; cuda-sim runs it with no findings);
    outputs match onnxruntime, and the kernel IR's count has one multiply-add per (row, column, k)."""
    from engine.codegen.count import count_kernel

    path = _gemm_model(tmp_path / "gemm.onnx", a_shape, (24, 20))
    graph = load_graph(path)
    out = graph.stage("y").shape
    blocks = int(np.prod([-(-n // t) for n, t in zip(out, tile)]))
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", tile, 64, blocks)})
    x = np.random.default_rng(13).standard_normal(a_shape).astype(np.float32)
    want = run_ort(path, {"a": x})["y"]
    for target, backend in (("c", "cpu"), ("cuda", "cuda-sim")):
        program = generate(plan, graph, target=target)
        (phase,) = _phases(program)
        g = phase.gemm
        assert g is not None and g.rows == rows and g.bm == int(np.prod(tile[len(tile) - 1 - rows:-1])), phase.describe()
        result = run_model(graph, {"a": x}, backend=backend, plan=plan)
        assert max_rel_error(result.outputs["y"], want) <= TOL, target
        if target == "cuda":
            assert result.sim.ok, "\n".join(result.sim.summary_lines())
            cuda = render_cuda(program)
            assert f".entry {program.kernels[0].name}(" in compile_cuda(cuda, name=program.name, arch="sm_80").ptx
    work = count_kernel(generate(plan, graph, target="cuda").kernels[0])
    macs = int(np.prod(out)) * 24
    assert 2 * macs <= work.flops <= 2 * macs * 1.5  # padded micro-tiles aside, each MAC once


@pytest.mark.parametrize("k,reduce_step", [(37, (64,)), (45, (16,)), (24, (7,))])
def test_micro_kernel_k_loop_runs_an_even_count_then_the_odd_step(tmp_path, k, reduce_step):
    """The C micro-kernel's k loop is printed as its even part and a one-step tail: a single loop of odd
    trip count made GCC keep the partial sums on the stack (nerf's K = 191 GEMM at ~43 GFLOP/s against
    ~105 for even K; benchmarks/NOTES.md, hostwelder). Every k step still runs once, in k order: odd K in
    one step, odd last step, odd steps; outputs match onnxruntime."""
    import re

    path = _gemm_model(tmp_path / "gemm.onnx", (48, k), (k, 32))
    graph = load_graph(path)
    tile = (16, 32)
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {"y": Tile("", tile, 64, 3)})
    group = plan.groups[0]
    plan = dataclasses.replace(plan, groups=(dataclasses.replace(
        group, segments=tuple(dataclasses.replace(t, reduce_step=reduce_step) for t in group.segments)),))
    c = render_c(generate(plan, graph, target="c"))
    blocks = re.findall(r"float r0\[\d+\];(.*?)#pragma omp simd\s+for \(int c = 0; c < nc; \+\+c\) \{\s+acc\[", c, re.S)
    assert blocks  # the register-blocked micro-kernel printed
    for body in blocks:
        loops = re.findall(r"for \(int kk = ([^;]+); kk < ([^;]+); \+\+kk\)", body)
        assert loops == [("0", "(k_n & ~1)"), ("k_n & ~1", "k_n")], loops
    x = np.random.default_rng(11).standard_normal((48, k)).astype(np.float32)
    result = run_model(graph, {"a": x}, backend="cpu", plan=plan)
    assert max_rel_error(result.outputs["y"], run_ort(path, {"a": x})["y"]) <= TOL
