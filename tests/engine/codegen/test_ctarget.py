"""The C target's passes (engine/codegen/ctarget.py), each alone on one small kernel: the parameters it
records for a CPU with 8 and with 16 vector lanes, and the C printed from them compiled and compared
with NumPy on random inputs (random shapes for split_chains, window_interiors and conv_tails)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import fuse_all, make_test_plan  # noqa: E402

from engine.api import load_graph  # noqa: E402
from engine.codegen.ccompile import compiler_lanes  # noqa: E402
from engine.codegen.ctarget import (  # noqa: E402
    CLAIM_WORK,
    GEMV_LANES,
    K_RUN_MOST,
    SERIAL_WORK,
    STAGE_STEPS,
    STREAM_WORK,
    TWO_CHAINS_BELOW,
    _map_phases,
    block_convs,
    block_gemms,
    by_channel_blocking,
    c_decisions,
    cache_lines,
    cache_rows,
    conv_tails,
    depthwise_blocking,
    depthwise_by_channel,
    for_c,
    k_run,
    reciprocal_rows,
    schedule_segments,
    segment_work,
    split_chains,
    staged_window,
    window_interiors,
)
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.kir import program_to_json  # noqa: E402
from engine.codegen.targets import render_c  # noqa: E402
from engine.runtime.cpu import compile_program_c, run_cpu  # noqa: E402
from engine.schedule.plan import Conn, Tile  # noqa: E402

TOL = 1e-4


def _save(path: Path, nodes, inputs, inits) -> Path:
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(onnx.shape_inference.infer_shapes(model), path)
    return path


def _program(path: Path, tile: tuple[int, ...], threads: int = 64):
    """The CUDA-target program of the one fused kernel (no C passes run yet) and its graph."""
    graph = load_graph(path)
    out = graph.stage(graph.outputs[0])
    blocks = int(np.prod([-(-n // t) for n, t in zip(out.shape, tile)]))
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER), {out.name: Tile("", tile, threads, blocks)})
    return generate(plan, graph, "a100"), graph


def _with(program, fn):
    return dataclasses.replace(program, kernels=tuple(fn(k) for k in program.kernels))


def _phases(program):
    return [p for k in program.kernels for s in k.segments for p in s.phases]


def _run_c(program, graph, feeds) -> np.ndarray:
    outs, _ = run_cpu(compile_program_c(program), graph.specs, feeds, graph.weights)
    return outs["y"]


def _conv(tmp_path):
    rng = np.random.default_rng(21)
    w = rng.standard_normal((16, 5, 3, 3)).astype(np.float32)
    path = _save(tmp_path / "conv.onnx", [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
                                          helper.make_node("Relu", ["c"], ["y"])], [("x", (1, 5, 12, 40))], {"W": w})
    program, graph = _program(path, (1, 16, 6, 40))
    x = rng.standard_normal((1, 5, 12, 40)).astype(np.float32)
    xp = np.pad(x[0], ((0, 0), (1, 1), (1, 1)))
    want = np.einsum("cikl,ikl...->c...", w, np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))
                     .transpose(0, 3, 4, 1, 2))
    return program, graph, {"x": x}, np.maximum(want, 0)[None]


# (lanes) -> (chunk, chunk_channels, chunk_rows, lone_rows) for 16 output channels x 6 x 40 pixels per tile:
# AVX-512 one 16-column vector per chunk (32 would pad 40 to 64), 8 channels x 1 row; AVX2 a 20-column
# chunk (the widest divisor of 40), 3 vectors a row, so 2 channels x 2 rows in 12 registers, 4 rows alone.
CONV_BLOCKING = {16: (16, 8, 1, 4), 8: (20, 2, 2, 4)}
# What the printer makes of it: named vector registers (16 columns: whole vectors), or fixed-size arrays
# of partial sums for 2 channels x 2 rows (20 columns: not whole 8-lane vectors).
CONV_SUMS = {16: "c0_v16 r0_0_0;", 8: "float r0_0[20]; float r0_1[20]; float r1_0[20]; float r1_1[20];"}


@pytest.mark.parametrize("lanes", sorted(CONV_BLOCKING))
def test_block_convs_from_the_lanes(tmp_path, lanes):
    program, graph, feeds, want = _conv(tmp_path)
    (before,) = [p.conv for p in _phases(program) if p.conv is not None]
    assert before.lanes == 0 and not before.dot_lanes
    blocked = _with(program, lambda k: block_convs(k, lanes))
    (conv,) = [p.conv for p in _phases(blocked) if p.conv is not None]
    assert (conv.lanes, conv.chunk, conv.chunk_channels, conv.chunk_rows, conv.lone_rows) == (lanes, *CONV_BLOCKING[lanes])
    assert not conv.by_channel
    # the input is padded: its window is staged, bc channels per step
    assert not conv.x_in_place and conv.step == conv.bc and not conv.prefetch
    assert dataclasses.replace(conv, lanes=0, chunk=0, chunk_channels=0, chunk_rows=0, lone_rows=0, step=0) == before
    source = render_c(_with(blocked, lambda k: c_decisions(k, lanes)))
    assert CONV_SUMS[lanes] in source and f"q0 += {CONV_BLOCKING[lanes][0]})" in source
    got = _run_c(_with(blocked, lambda k: c_decisions(k, lanes)), graph, feeds)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


def test_pointwise_conv_over_fewer_pixels_than_a_vector_puts_channels_in_the_lanes(tmp_path):
    """A 1x1 conv over 1x6 pixels per tile and 16 output channels: at 8 and 16 lanes the channels go in
    the vector lanes (6 pixels < lanes <= 16 channels); at 4 lanes a row of the tile fills a vector."""
    rng = np.random.default_rng(22)
    w = rng.standard_normal((16, 12, 1, 1)).astype(np.float32)
    path = _save(tmp_path / "pw.onnx", [helper.make_node("Conv", ["x", "W"], ["y"])], [("x", (1, 12, 4, 6))], {"W": w})
    program, graph = _program(path, (1, 16, 1, 6))
    x = rng.standard_normal((1, 12, 4, 6)).astype(np.float32)
    want = np.einsum("ci,ihw->chw", w[:, :, 0, 0], x[0])[None]
    for lanes, by_channel in ((16, True), (8, True), (4, False)):
        blocked = _with(program, lambda k, lanes=lanes: c_decisions(k, lanes))
        (conv,) = [p.conv for p in _phases(blocked) if p.conv is not None]
        assert conv.by_channel == by_channel and conv.lanes == lanes
        assert conv.x_in_place and conv.step == 12  # unpadded: rows read in place, every channel in one step
        got = _run_c(blocked, graph, {"x": x})
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


def _direct_conv(x, w, stride: int, pad: int, dilation: int) -> np.ndarray:
    """NumPy's reference of an NCHW conv (batch 1): each tap's strided window times its weights."""
    k, co = w.shape[-1], w.shape[0]
    xp = np.pad(x[0], ((0, 0), (pad, pad), (pad, pad)))
    span = (k - 1) * dilation + 1
    oh = (xp.shape[1] - span) // stride + 1
    ow = (xp.shape[2] - span) // stride + 1
    out = np.zeros((co, oh, ow), np.float64)
    for i in range(k):
        for j in range(k):
            win = xp[:, i * dilation:i * dilation + (oh - 1) * stride + 1:stride,
                     j * dilation:j * dilation + (ow - 1) * stride + 1:stride]
            out += np.einsum("oc,chw->ohw", w[:, :, i, j].astype(np.float64), win)
    return out[None].astype(np.float32)


@pytest.mark.parametrize("case", [(3, 1, 1, 1, 4), (3, 2, 0, 1, 9), (1, 2, 0, 1, 8), (3, 1, 2, 2, 4)],
                         ids=["3x3-padded", "3x3-stride2-in-place", "1x1-stride2-in-place", "3x3-dilated"])
def test_a_dense_conv_whose_tile_rows_are_narrower_than_a_vector_puts_channels_in_the_lanes(tmp_path, case):
    """A dense conv of 32 input channels over a 4x4 map, in tiles of 16 of its 24 output channels x 4x4
    pixels: a row of 4 columns never fills a chunk of 8 or 16 (staged, the micro-kernel ran half its lanes on
    padding; read in place, the lane loop with its sums in memory: zoo resnet's late 3x3 convs 1.8x their
    model, benchmarks/NOTES.md narrowbychannel), so at 8 and 16 lanes the output channels go in the vector
    lanes, with every tap, stride and dilation (`dense_by_channel`: read in place, at 8 and 16 lanes; staged,
    at 8 lanes — 16 pixels, two vectors' worth, and 288 terms a step — not at 16); the last tile's 8 channels
    keep the window form. Each output adds its (channel, tap row, tap column) terms in the window form's
    order: the same floats as that form, and NumPy's within rounding."""
    k, stride, pad, dilation, hw = case
    rng = np.random.default_rng(90 + k * 10 + stride + dilation)
    ci, co = 32, 24
    wt = rng.standard_normal((co, ci, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[k, k], strides=[stride] * 2,
                            pads=[pad] * 4, dilations=[dilation] * 2)
    path = _save(tmp_path / "narrow.onnx", [node], [("x", (1, ci, hw, hw))], {"W": wt})
    program, graph = _program(path, (1, 16, 4, 4))
    x = rng.standard_normal((1, ci, hw, hw)).astype(np.float32)
    want = _direct_conv(x, wt, stride, pad, dilation)
    assert want.shape == (1, co, 4, 4)
    window = {"by_channel": False, "channel_vectors": 0, "channel_pixels": 0}
    for lanes in (8, 16):
        full = _with(program, lambda kern, lanes=lanes: c_decisions(kern, lanes))
        (conv,) = [p.conv for p in _phases(full) if p.conv is not None]
        assert conv.x_in_place == (pad == 0) and conv.by_channel == (pad == 0 or lanes == 8)
        assert conv.channel_vectors * lanes == (16 if conv.by_channel else 0)
        got = _run_c(full, graph, {"x": x})
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL
        columns = _with(full, lambda kern: _map_phases(kern, lambda bare, ph: window if ph.conv is not None else None))
        np.testing.assert_array_equal(got, _run_c(columns, graph, {"x": x}))


def test_a_narrow_conv_staged_with_few_terms_a_step_keeps_the_window_form(tmp_path):
    """`dense_by_channel` keeps the window form for a staged conv over narrow rows whose step holds fewer than
    BY_CHANNEL_TERMS (channel, tap) terms (per tile its transposed weights and the sums moved in and out of
    the accumulator cost more than the padded lanes: convnext's 2x2 downsampling 1.3x slower by channel) or
    whose tile has fewer pixels than two vectors; a 1x1 stride-1 conv over narrow rows keeps it too."""
    rng = np.random.default_rng(95)
    for ci, k, pad, tile, by_channel in ((8, 3, 1, (1, 16, 4, 4), False), (32, 3, 1, (1, 16, 2, 4), False),
                                         (32, 3, 1, (1, 16, 4, 4), True), (32, 1, 0, (1, 16, 4, 4), False)):
        wt = rng.standard_normal((16, ci, k, k)).astype(np.float32)
        node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[k, k], pads=[pad] * 4)
        path = _save(tmp_path / f"few{ci}_{k}_{tile[2]}.onnx", [node], [("x", (1, ci, 4, 4))], {"W": wt})
        program, _ = _program(path, tile)
        (conv,) = [p.conv for p in _phases(_with(program, lambda kern: c_decisions(kern, 8))) if p.conv is not None]
        assert conv.by_channel == by_channel, (ci, k, tile)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("staged", [False, True], ids=["in-place", "staged"])
def test_by_channel_sums_stay_in_vector_registers(tmp_path, lanes, staged):
    """A 1x1 conv of 40 output channels in tiles of 32 over 1x3 pixels: 32 channels fill whole vectors,
    so the sums of a group of channel vectors x pixels are named vector registers (an array of sums was
    kept in memory across the channel loop: every FMA a load and a store); the last tile's 8 channels
    take the array form. The input read in place, or staged (Relu(x) inlined into the conv). Each output
    sums its input channels in the order of the array form: bit-identical to it."""
    rng = np.random.default_rng(24)
    w = rng.standard_normal((40, 12, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["r" if staged else "x", "W"], ["y"])]
    if staged:
        nodes.insert(0, helper.make_node("Relu", ["x"], ["r"]))
    path = _save(tmp_path / "pw.onnx", nodes, [("x", (1, 12, 2, 3))], {"W": w})
    program, graph = _program(path, (1, 32, 1, 3))
    x = rng.standard_normal((1, 12, 2, 3)).astype(np.float32)
    want = np.einsum("ci,ihw->chw", w[:, :, 0, 0], np.maximum(x[0], 0) if staged else x[0])[None]
    blocked = _with(program, lambda k: c_decisions(k, lanes))
    (conv,) = [p.conv for p in _phases(blocked) if p.conv is not None]
    groups, pixels = by_channel_blocking(32 // lanes, 3, lanes)
    assert conv.by_channel and (conv.channel_vectors, conv.channel_pixels) == (groups, pixels)
    assert conv.x_in_place != staged
    source = render_c(blocked)
    assert "if (c_n == 32) {" in source and f"c0_v{lanes} r0_0;" in source and "float r[32];" in source
    got = _run_c(blocked, graph, {"x": x})
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL
    arrays = _with(blocked, lambda k: _map_convs(k, channel_vectors=0, channel_pixels=0))
    assert "if (c_n == 32)" not in render_c(arrays)
    assert np.array_equal(_run_c(arrays, graph, {"x": x}), got)


def test_by_channel_blocking_fits_the_registers():
    """Sums at most half the vector registers (16 of AVX-512's 32, 8 of AVX2's 16), a group the largest
    divisor of the channel vectors up to half of those, as many pixels of the row as the rest allows."""
    assert by_channel_blocking(4, 4, 16) == (4, 4)  # convnext's 64 channels x 1x4 pixels
    assert by_channel_blocking(40, 2, 16) == (8, 2)
    assert by_channel_blocking(3, 7, 16) == (3, 5)
    assert by_channel_blocking(4, 3, 8) == (4, 2)
    assert by_channel_blocking(7, 3, 8) == (1, 3)
    for vectors in range(1, 50):
        for lanes, regs in ((16, 32), (8, 16)):
            g, p = by_channel_blocking(vectors, 15, lanes)
            assert vectors % g == 0 and g * p <= regs // 2 and p >= 1


def _gemm(tmp_path, rows: int, transposed: bool):
    """y = relu(A @ B): B a [64, 48] weight, or (transposed) A @ W^T with W [48, 64]."""
    rng = np.random.default_rng(23)
    w = rng.standard_normal((48, 64) if transposed else (64, 48)).astype(np.float32)
    mm = (helper.make_node("Gemm", ["a", "W"], ["c"], transB=1) if transposed
          else helper.make_node("MatMul", ["a", "W"], ["c"]))
    path = _save(tmp_path / "mm.onnx", [mm, helper.make_node("Relu", ["c"], ["y"])], [("a", (32, 64))], {"W": w})
    program, graph = _program(path, (rows, 48))
    a = rng.standard_normal((32, 64)).astype(np.float32)
    return program, graph, {"a": a}, np.maximum(a @ (w.T if transposed else w), 0)


@pytest.mark.parametrize("lanes", [8, 16])
def test_block_gemms_register_block_and_operands_in_place(tmp_path, lanes):
    """8-row tiles of A [32, 64] @ W [64, 48]: a 4 x 16 register block at both widths (measured best at
    AVX2 and AVX-512 alike), the 1-row tail 16 wide (48 columns: no 32 or 64 divides them), A read in
    place (rows 64 apart, k contiguous), W's rows read in place (contiguous columns, rows 48 apart)."""
    program, graph, feeds, want = _gemm(tmp_path, 8, transposed=False)
    blocked = _with(program, lambda k: c_decisions(k, lanes))
    (g,) = [p.gemm for p in _phases(blocked) if p.gemm is not None]
    assert (g.c_rows, g.c_cols, g.c_wide, g.a_in, g.b_in, g.gemv, g.panel) == (4, 16, 16, (64, 1), (1, 48), 0, False)
    assert "4x16 register block" in json.dumps(program_to_json(blocked))
    source = render_c(blocked)
    assert "const float* restrict a_in = " in source and "const float* restrict b_in = " in source
    assert np.max(np.abs(_run_c(blocked, graph, feeds) - want)) / np.max(np.abs(want)) < TOL


def test_k_run_doubles_the_step_while_b_rows_keep_clear_of_l1_sets():
    """k_run: the staging step doubled while the rows of B read in place still fit L1's sets
    (`_rows_share_sets`), up to k and K_RUN_MOST: rows 768 floats (3 KiB) apart share 4 sets, so 16; rows
    48 floats apart spread over 64, so the whole k up to the cap; rows 4 KiB apart one set, so the step."""
    assert k_run(3072, 8, 768) == 16
    assert k_run(64, 32, 48) == 64 and k_run(4096, 32, 48) == K_RUN_MOST
    assert k_run(3072, 8, 1024) == 8
    assert k_run(200, 8, 768) == 16 and k_run(12, 8, 48) == 8


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("lanes", [8, 16])
def test_a_gemm_reading_b_in_place_runs_its_sums_over_the_k_run(tmp_path, lanes, staged):
    """Whole rows of a 768-wide product (a LayerNorm's tile: bert-base's FFN down projection) stage a k step of
    8 under the staging budget for both panels, but B is read in place: the micro-kernel keeps its sums in
    registers over k_run's 16 steps (Gemm.c_krun) rather than storing the block's sums every 8, A read in place
    or (`staged`: a computed operand, GPT-2's GELU into its down projection) staged 16 columns at a time;
    k = 200 leaves a short last run. The C matches NumPy."""
    rng = np.random.default_rng(24)
    w = rng.standard_normal((200, 768)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"])] if staged else [helper.make_node("Identity", ["x"], ["a"])]
    path = _save(tmp_path / "mm.onnx", nodes + [helper.make_node("MatMul", ["a", "W"], ["y"])], [("x", (16, 200))],
                 {"W": w})
    program, graph = _program(path, (8, 768), threads=256)
    x = rng.standard_normal((16, 200)).astype(np.float32)
    blocked = _with(program, lambda k: c_decisions(k, lanes))
    (g,) = [p.gemm for p in _phases(blocked) if p.gemm is not None]
    assert bool(g.a_in) != staged and g.b_in and g.bk == 8 and g.c_krun == k_run(200, 8, 768) == 16
    source = render_c(blocked)
    assert "k0 += 16" in source and "k run 16" in json.dumps(program_to_json(blocked))
    assert ("st_a[128]" in source) == staged  # 8 rows x the run
    want = (np.maximum(x, 0) if staged else x) @ w
    assert np.max(np.abs(_run_c(blocked, graph, {"x": x}) - want)) / np.max(np.abs(want)) < TOL


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("lanes", [8, 16])
def test_gemm_sums_in_named_vectors_where_a_chunk_spans_several(tmp_path, lanes, transposed):
    """A [30, 37] @ B [37, 60] in 10-row tiles (two 4-row blocks, two tail rows 64 wide; odd k): B read in
    place (a partial chunk of 12 columns past three whole ones) or, transposed, staged. Where a chunk
    spans several vectors (AVX2: the 4x16 block is two 8-float vectors a row; AVX-512: the 64-wide tail
    rows, four) its sums are named vector registers with B pinned in registers (float arrays of several
    vectors stayed on the stack: 35 against 57 GFLOP/s on Zen 3); a chunk of one vector stays an array.
    The outputs are bit-identical to the float-array form's: the same fused multiply-adds, in k order."""
    rng = np.random.default_rng(29)
    w = rng.standard_normal((60, 37) if transposed else (37, 60)).astype(np.float32)
    mm = (helper.make_node("Gemm", ["a", "W"], ["c"], transB=1) if transposed
          else helper.make_node("MatMul", ["a", "W"], ["c"]))
    path = _save(tmp_path / "mm.onnx", [mm, helper.make_node("Relu", ["c"], ["y"])], [("a", (30, 37))], {"W": w})
    program, graph = _program(path, (10, 60))
    a = rng.standard_normal((30, 37)).astype(np.float32)
    want = np.maximum(a @ (w.T if transposed else w), 0)
    blocked = _with(program, lambda k: c_decisions(k, lanes))
    (g,) = [p.gemm for p in _phases(blocked) if p.gemm is not None]
    assert (g.c_rows, g.c_cols, g.c_wide, g.c_vector, bool(g.b_in)) == (4, 16, 64, lanes, not transposed)
    assert ("register block in 8-float vectors" in json.dumps(program_to_json(blocked))) == (lanes == 8)
    source = render_c(blocked)
    block = "c0_v8 r3_1;" if lanes == 8 else "float r0[16]; float r1[16]; float r2[16]; float r3[16];"
    assert block in source and f"c0_v{lanes} r0_3;" in source and f"C0_PIN{lanes}(b3);" in source
    arrays = _with(blocked, lambda k: _map_phases(k, lambda _, p: {"c_vector": 0} if p.gemm is not None else None))
    assert "c0_v" not in render_c(arrays).split("tw_parallel_for")[-1]
    got, base = _run_c(blocked, graph, {"a": a}), _run_c(arrays, graph, {"a": a})
    assert np.array_equal(got.view(np.uint32), base.view(np.uint32))
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


def test_gemm_vector_sums_compile_for_avx512():
    """The 16-lane form (C0_PIN16's EVEX constraint) compiles for an AVX-512 target too; this machine may
    not run it, so the source is only compiled."""
    from engine.codegen.ccompile import DEFAULT_OPTIONS, compile_c
    from engine.codegen.targets import C_HEADER, _gemm_vector_chunk

    body = "\n".join(_gemm_vector_chunk(4, 2, 16, 32, "b + kk * 32 + n0", "a[(mm + {q}) * 9 + kk]"))
    source = ("#include <string.h>\n" + C_HEADER + "void f(float* restrict acc, const float* "
              "restrict a, const float* restrict b) {\n const int k_n = 9;\n for (int mm = 0; mm < 8; mm += 4)\n"
              "  for (int n0 = 0; n0 < 32; n0 += 32) {\n" + body + "\n  }\n}\n")
    assert compile_c(source, name="pin16", options=(*DEFAULT_OPTIONS, "-mavx512f", "-mfma")).exists()


def test_block_gemms_runs_few_rows_against_a_transposed_weight_as_dot_products(tmp_path):
    """2-row tiles of A @ W^T (W [48, 64]: B contiguous along k) run as dot products over k in
    GEMV_LANES partial sums, B's columns read in place 64 apart."""
    program, graph, feeds, want = _gemm(tmp_path, 2, transposed=True)
    blocked = _with(program, block_gemms)
    (g,) = [p.gemm for p in _phases(blocked) if p.gemm is not None]
    assert g.gemv == GEMV_LANES and g.b_in == (64, 1) and not g.panel
    blocked = _with(blocked, lambda k: c_decisions(k, 16))
    assert f"float part[{GEMV_LANES}];" in render_c(blocked)
    assert np.max(np.abs(_run_c(blocked, graph, feeds) - want)) / np.max(np.abs(want)) < TOL


def test_segment_work_counts_a_conv_s_staged_window(tmp_path):
    """A conv's staged input window counts STAGE_STEPS element-steps an element on top of its arithmetic:
    a 3x3 stride-2 depthwise conv over 64 channels of 32x32 in tiles of 8 channels (zoo mobilevit's, which
    ran 37.5 µs on one core with its 147 K element-steps of arithmetic alone) is past SERIAL_WORK and gets
    the pool; an unpadded 1x1 conv, whose rows the window form reads in place, counts none."""
    rng = np.random.default_rng(61)
    wt = rng.standard_normal((64, 1, 3, 3)).astype(np.float32)
    path = _save(tmp_path / "dws2.onnx", [helper.make_node("Conv", ["x", "W"], ["y"], group=64, pads=[1] * 4,
                                                           strides=[2, 2])], [("x", (1, 64, 32, 32))], {"W": wt})
    program, graph = _program(path, (1, 8, 16, 16))
    (seg,) = [s for k in program.kernels for s in k.stripped().segments]
    (phase,) = [p for p in seg.phases if p.conv is not None]
    assert staged_window(phase.conv) == 8 * 33 * 33
    arithmetic = 8 * 16 * 16 * 9 * seg.ntiles
    assert segment_work(seg) == arithmetic + STAGE_STEPS * 8 * 33 * 33 * seg.ntiles
    assert arithmetic < SERIAL_WORK <= segment_work(seg)
    (scheduled,) = [s for k in _with(program, schedule_segments).kernels for s in k.segments]
    assert scheduled.omp == "guided"
    x = rng.standard_normal((1, 64, 32, 32)).astype(np.float32)
    want = np.einsum("ckl,chwkl->chw", wt[:, 0], _windows(x[0], 3, 1)[:, ::2, ::2][:, :16, :16])[None]
    got = _run_c(_with(program, lambda k: c_decisions(k, compiler_lanes())), graph, {"x": x})
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL
    w1 = rng.standard_normal((16, 12, 1, 1)).astype(np.float32)
    pw = _save(tmp_path / "pw1.onnx", [helper.make_node("Conv", ["x", "W"], ["y"])], [("x", (1, 12, 4, 6))], {"W": w1})
    (seg1,) = [s for k in _program(pw, (1, 16, 2, 3))[0].kernels for s in k.stripped().segments]
    assert segment_work(seg1) == 16 * 2 * 3 * 12 * seg1.ntiles  # read in place: no staging counted


def test_schedule_segments_records_the_work_and_the_split(tmp_path):
    program, graph, feeds, want = _conv(tmp_path)
    scheduled = _with(program, schedule_segments)
    bare = [s for k in program.kernels for s in k.stripped().segments]
    segs = [s for k in scheduled.kernels for s in k.segments]
    assert [s.work for s in segs] == [segment_work(s) for s in bare] and all(s.work for s in segs)
    assert [s.omp for s in segs] == ["serial" if s.work < SERIAL_WORK else "guided" for s in segs]
    assert [s.loops for s in segs] == ["" if s.omp == "serial" else "pool" for s in segs]
    # a pooled claim: the fewest tiles holding CLAIM_WORK element-steps (one where a tile is that much)
    assert all(s.chunk == max(1, -(-CLAIM_WORK * s.ntiles // s.work)) for s in segs if s.omp == "guided")
    pooled = "pooled: claims of at least" in render_c(scheduled)
    assert pooled == any(s.omp == "guided" for s in segs)
    omp = _with(program, lambda k: schedule_segments(k, "omp"))
    assert [s.loops for k in omp.kernels for s in k.segments] == [s.loops and "omp" for s in segs]
    pragma = "#pragma omp parallel for schedule(guided)" in render_c(omp)
    assert pragma == any(s.omp == "guided" for s in segs)


def test_a_gemv_every_tile_computes_whole_is_not_split_as_a_streamed_weight(tmp_path):
    """A segment with a matrix-vector product of STREAM_WORK element-steps or more is split statically, each
    thread reading its part of the weight (ctarget._streams_weight) — unless a GEMV in it is computed whole
    by every tile (relu(x @ w1) staged per tile ahead of its half of @ w2; lstm's welder kernels of two
    recurrence steps): then every thread reads all of that weight and the tiles do that work twice, and the
    segment is sized like any other (here under SERIAL_WORK: serial). The C runs right either way."""
    rng = np.random.default_rng(7)
    w1, w2 = rng.standard_normal((128, 256)).astype(np.float32), rng.standard_normal((256, 512)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["t"]),
             helper.make_node("MatMul", ["t", "w2"], ["y"])]
    graph = load_graph(_save(tmp_path / "gemvs.onnx", nodes, [("x", (1, 128))], {"w1": w1, "w2": w2}))
    x = rng.standard_normal((1, 128)).astype(np.float32)
    want = np.maximum(x @ w1, 0) @ w2
    tiles = {"y": Tile("", (1, 256), 32, 2)}
    fused = make_test_plan(graph, {("a", "t"): Conn.REGISTER, ("t", "y"): Conn.SHARED}, tiles)
    for plan, whole in ((fused, True), (make_test_plan(graph, {}, tiles), False)):
        program = generate(plan, graph, "a100")
        kernel = next(k for k in program.kernels if "y" in k.stages)
        (seg,) = schedule_segments(kernel).segments
        assert STREAM_WORK <= seg.work < SERIAL_WORK and seg.ntiles == 2
        assert seg.omp == ("serial" if whole else "static")
        got = _run_c(_with(program, lambda k: c_decisions(k, compiler_lanes())), graph, {"x": x})
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


def test_cuda_program_printed_as_c_takes_the_compilers_lanes(tmp_path):
    """render_c of a program generated for CUDA runs c_decisions for the lanes the C compiler targets;
    running them twice changes nothing; the Program JSON shows them only once they ran."""
    program, graph, feeds, want = _conv(tmp_path)
    assert all(not k.c_lanes for k in program.kernels) and "c_lanes" not in json.dumps(program_to_json(program))
    lowered = for_c(program)
    assert {k.c_lanes for k in lowered.kernels} == {compiler_lanes()} and for_c(lowered) is lowered
    assert _with(lowered, lambda k: c_decisions(k, k.c_lanes)) == lowered
    meta = program_to_json(lowered)["kernels"][0]
    assert meta["c_lanes"] == compiler_lanes() and meta["convs"][0]["lanes"] == compiler_lanes()
    assert all(s["omp"] in ("serial", "guided") for s in meta["segments"])
    assert render_c(program) == render_c(lowered)


def test_cache_rows_records_softmax_terms_reread_by_a_later_phase():
    """masked_softmax fused whole: the max phase's masked logits are kept for the sum phase; the
    segment records the cache (name, producer, consumer, floats), the Program JSON shows it, and the
    printed C declares that array."""
    from sample_io import load_sample

    graph = load_sample("masked_softmax")[0]
    program = _with(generate(make_test_plan(graph, fuse_all(graph)), graph, "a100"), cache_rows)
    caches = [c for k in program.kernels for s in k.segments for c in s.row_caches]
    assert caches and all(c.producer.endswith("::max") or c.producer.endswith("::sum") for c in caches)
    assert [c.name for c in caches] == [f"row{i}" for i in range(len(caches))]
    shown = [r for k in program_to_json(program)["kernels"] for s in k["segments"] for r in s.get("row_caches", ())]
    assert len(shown) == len(caches)
    source = render_c(program)
    assert all(f"{c.name}[{c.size}];  // {c.producer} terms, reread by {c.consumer}" in source for c in caches)


def test_reciprocal_rows_divides_once_per_row():
    """layernorm_residual fused whole: the normalise phase's division by the row's sqrt(var + eps)
    becomes a multiply by its reciprocal (computed once per row in the printed C), in the phase body
    the Program records; reduction phases keep their bodies."""
    from sample_io import load_sample

    from engine.codegen.kexpr import kwalk
    from engine.ir import expr as E

    def recips(program):
        return [p.stage for p in _phases(program) if any(isinstance(n, E.Unary) and n.op == "recip"
                                                         for n in kwalk(p.body))]

    graph, inputs, expected = load_sample("layernorm_residual")
    program = generate(make_test_plan(graph, fuse_all(graph)), graph, "a100")
    lowered = _with(program, reciprocal_rows)
    assert not recips(program) and recips(lowered)
    assert all(p.combine is None for p in _phases(lowered) if p.stage in recips(lowered))
    assert "(1.0f / " in render_c(lowered)
    got, _ = run_cpu(compile_program_c(lowered), graph.specs, inputs, graph.weights)
    assert max(np.max(np.abs(got[k] - expected[k])) / np.max(np.abs(expected[k])) for k in expected) < 1e-3


def test_cache_lines_records_launch_and_tile_line_caches():
    """pow_broadcast_add's exp(-sqrt(|a|^2.5 + 1)) chain along the columns (see
    test_generate.test_c_printer_computes_a_broadcast_chain_once_per_launch_or_tile): with every row
    tile spanning the 4096 columns, one LineCache per launch that both phases read; with the
    normalisation's tiles 512 columns wide, that phase computes its copy once per tile instead."""
    from sample_io import load_sample

    from engine.device import get_device
    from engine.schedule.edits import apply_edit
    from engine.schedule.plan import Edit
    from engine.schedule.policies import make_plan

    graph = load_sample("pow_broadcast_add")[0]
    a100 = get_device("a100")
    pin = Edit.make("set_edge", producer="Add_9_out", consumer="ReduceSum_11_out", conn="register")
    plan = apply_edit(make_plan(graph, "welder", a100, options={"recompute_bound": 1e6}), graph, a100, pin)
    whole = _with(generate(plan, graph, a100), cache_lines)
    (seg,) = [s for k in whole.kernels for s in k.segments if s.launch_lines]
    (line,) = seg.launch_lines
    assert (line.name, line.lo, line.hi) == ("launch_line0", 0, 4096)
    assert sum(1 for p in seg.phases for n, name, _ in p.line_reads if name == line.name) == 2
    assert not any(p.tile_lines for p in seg.phases)
    assert "launch_line0: " in json.dumps(program_to_json(whole))
    split = apply_edit(plan, graph, a100, Edit.make("set_tile", stage="out", shape=[8, 512], threads=256))
    split = _with(generate(split, graph, a100), cache_lines)
    (seg,) = [s for k in split.kernels for s in k.segments if s.launch_lines]
    assert len(seg.launch_lines) == 1 and [len(p.tile_lines) for p in seg.phases if p.tile_lines] == [1]


def _windows(x: np.ndarray, taps: int, pad: int) -> np.ndarray:
    """x [C, H, W] padded by `pad`, as [C, H', W', taps, taps] windows (stride 1)."""
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    return np.lib.stride_tricks.sliding_window_view(xp, (taps, taps), axis=(1, 2))


def _depthwise(tmp_path, seed: int):
    """A depthwise 3x3 conv of random size (channels, rows, columns), padded, and its C-less program."""
    rng = np.random.default_rng(seed)
    c, h, w = int(rng.integers(3, 9)), int(rng.integers(5, 12)), int(rng.integers(9, 41))
    wt = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    path = _save(tmp_path / f"dw{seed}.onnx", [helper.make_node("Conv", ["x", "W"], ["y"], group=c, pads=[1, 1, 1, 1])],
                 [("x", (1, c, h, w))], {"W": wt})
    program, graph = _program(path, (1, c, int(rng.integers(1, h + 1)), w))
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    want = np.einsum("ckl,chwkl->chw", wt[:, 0], _windows(x[0], 3, 1))[None]
    return program, graph, {"x": x}, want


@pytest.mark.parametrize("seed", [31, 32])
def test_split_chains_alone_two_chains_for_depthwise_taps(tmp_path, seed):
    """split_chains on a random-size depthwise 3x3 conv: Conv.two_chains_below set (dense convs and
    one-tap-row convs keep one chain: test_block_convs' conv untouched), the C prints the second chain
    `e`, and the output matches NumPy with the split and without it (the field alone decides)."""
    program, graph, feeds, want = _depthwise(tmp_path, seed)
    lanes = compiler_lanes()
    blocked = _with(program, lambda k: block_convs(k, lanes))
    split = _with(blocked, split_chains)
    (conv,) = [p.conv for p in _phases(split) if p.conv is not None]
    assert conv.depthwise and conv.two_chains_below == TWO_CHAINS_BELOW
    assert dataclasses.replace(conv, two_chains_below=0) == [p.conv for p in _phases(blocked) if p.conv][0]
    dense = _conv(tmp_path)[0]
    assert all(p.conv.two_chains_below == 0 for p in _phases(_with(dense, split_chains)) if p.conv)
    full = _with(program, lambda k: c_decisions(k, lanes))
    assert " e0_0" in render_c(full)
    one = _with(full, lambda k: _map_convs(k, two_chains_below=0))
    assert " e0_0" not in render_c(one)
    for prog in (full, one):
        got = _run_c(prog, graph, feeds)
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


def _map_convs(kernel, **fields):
    """`kernel` with `fields` set on every conv (a pass's decision overridden, to test the field alone)."""
    segs = tuple(dataclasses.replace(s, phases=tuple(dataclasses.replace(p, conv=dataclasses.replace(p.conv, **fields))
                                                     if p.conv else p for p in s.phases)) for s in kernel.segments)
    return dataclasses.replace(kernel, segments=segs)


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize("seed", [51, 52, 53])
@pytest.mark.parametrize("staged", [False, True], ids=["padded-load", "relu-inlined"])
def test_depthwise_conv_over_narrow_rows_puts_channels_in_the_lanes(tmp_path, lanes, seed, staged):
    """A depthwise conv of random taps (3 or 7), stride (1 or 2), image under 8 columns wide and channels
    in tiles of whole vectors plus a last partial tile: block_convs marks it by channel, the C stages the
    window channels-last (the pad value filled in and only the interior copied where the input is a plain
    padded load; every position checked where Relu is inlined into it), the last tile keeps the window
    form, and both match NumPy — as does the window form alone (the field off)."""
    rng = np.random.default_rng(seed)
    k, s = int(rng.choice([3, 7])), int(rng.integers(1, 3))
    h, w, full = int(rng.integers(2, 12)), int(rng.integers(1, 7 * s + 1)), 2 * lanes  # under 8 output columns
    c = full + int(rng.integers(1, lanes))
    wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["r" if staged else "x", "W"], ["y"], group=c, pads=[k // 2] * 4, strides=[s, s])]
    if staged:
        nodes.insert(0, helper.make_node("Relu", ["x"], ["r"]))
    path = _save(tmp_path / f"dwc{seed}.onnx", nodes, [("x", (1, c, h, w))], {"W": wt})
    ho, wo = (h + 2 * (k // 2) - k) // s + 1, (w + 2 * (k // 2) - k) // s + 1
    program, graph = _program(path, (1, full, int(rng.integers(1, ho + 1)), wo))
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    xin = np.maximum(x[0], 0) if staged else x[0]
    want = np.einsum("ckl,chwkl->chw", wt[:, 0], _windows(xin, k, k // 2)[:, ::s, ::s][:, :ho, :wo])[None]
    blocked = _with(program, lambda kern: c_decisions(kern, lanes))
    (conv,) = [p.conv for p in _phases(blocked) if p.conv is not None]
    assert conv.depthwise and conv.by_channel and not conv.x_in_place
    assert (conv.channel_vectors, conv.channel_pixels) == depthwise_blocking(full // lanes, wo, lanes)
    source = render_c(blocked)
    assert f"if (c_n == {full}) {{" in source and "st_xc[" in source and f"c0_v{lanes} r0_0 = {{0}};" in source
    assert ("st_xc[e] = 0.0f;" in source) == (not staged)
    got = _run_c(blocked, graph, {"x": x})
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL
    columns = _with(blocked, lambda kern: _map_convs(kern, by_channel=False))
    assert "st_xc[" not in render_c(columns)
    assert np.max(np.abs(_run_c(columns, graph, {"x": x}) - want)) / np.max(np.abs(want)) < TOL


def test_depthwise_by_channel_only_for_narrow_rows_of_whole_channel_vectors(tmp_path):
    """The window form stays where its column chunks are full enough (8 columns and more), where the
    tile's channels do not fill whole vectors, and at 4 lanes; the blocking keeps DW_SUMS partial sums."""
    rng = np.random.default_rng(55)
    wt = rng.standard_normal((32, 1, 7, 7)).astype(np.float32)
    path = _save(tmp_path / "dwn.onnx", [helper.make_node("Conv", ["x", "W"], ["y"], group=32, pads=[3] * 4)],
                 [("x", (1, 32, 4, 12))], {"W": wt})
    for tile, lanes, marked in (((1, 32, 4, 4), 16, True), ((1, 32, 4, 8), 16, False), ((1, 24, 4, 4), 16, False),
                                ((1, 24, 4, 4), 8, True), ((1, 32, 4, 4), 4, False)):
        program, _ = _program(path, tile)
        (conv,) = [p.conv for p in _phases(program) if p.conv is not None]
        assert depthwise_by_channel(conv, lanes) == marked, (tile, lanes)
    assert depthwise_blocking(4, 4, 16) == (2, 4)  # convnext's 64 channels x 4x4: 8 sums
    assert depthwise_blocking(4, 2, 16) == (4, 2) and depthwise_blocking(1, 4, 16) == (1, 4)
    assert depthwise_blocking(3, 4, 8) == (1, 4) and depthwise_blocking(6, 1, 8) == (6, 1)


@pytest.mark.parametrize("seed", [41, 42])
def test_window_interiors_alone_records_the_unchecked_window(tmp_path, seed):
    """window_interiors on a random-size padded conv: the interior is the window positions inside the
    input (pad 1: rows 1..H, columns 1..W of the padded window's coordinates), the C stages it without
    checks (`w_a`/`w_b`), and both it and the all-checked form (interior None) match NumPy."""
    program, graph, feeds, want = _depthwise(tmp_path, seed)
    h, w = feeds["x"].shape[2:]
    blocked = _with(program, lambda k: block_convs(k, compiler_lanes()))
    (conv,) = [p.conv for p in _phases(_with(blocked, window_interiors)) if p.conv is not None]
    assert not conv.x_in_place and conv.interior == ((1, h), (1, w))
    full = _with(program, lambda k: c_decisions(k, compiler_lanes()))
    checked = _with(full, lambda k: _map_convs(k, interior=None))
    assert "w_a" in render_c(full) and "w_a" not in render_c(checked)
    for prog in (full, checked):
        got = _run_c(prog, graph, feeds)
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


@pytest.mark.parametrize("lanes", [8, 16])
def test_conv_tails_alone_on_a_conv_read_in_place(tmp_path, lanes, monkeypatch):
    """conv_tails: the whole-chunk tails after the chunk loop (one AVX-512 vector, then chunks of 8);
    on an unpadded 1x1 conv of random width, read in place row by row (its tiles span whole rows, so the
    flat form is turned off here: `test_a_pointwise_conv_over_whole_rows_runs_its_pixels_flat`), Conv.tails
    is what conv_tails gives, the C prints those tails, and the output matches NumPy with them and with
    none (the live columns then run at the chunk's width)."""
    import engine.codegen.ctarget as ctarget

    monkeypatch.setattr(ctarget, "flat_pixels", lambda kernel, p: False)
    assert conv_tails(32, 16) == (16, 8) and conv_tails(32, 8) == (8,) and conv_tails(16, 16) == (8,)
    assert conv_tails(8, 16) == () and conv_tails(24, 8) == (8,)
    rng = np.random.default_rng(50 + lanes)
    ci, co, h = int(rng.integers(2, 6)), int(rng.integers(2, 6)), int(rng.integers(2, 5))
    # widths whose chunk leaves columns over: 24-column chunks at 8 lanes, 32-column ones at 16
    w = int(rng.choice([47, 71])) if lanes == 8 else int(rng.integers(81, 96))
    wt = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
    path = _save(tmp_path / "pw.onnx", [helper.make_node("Conv", ["x", "W"], ["y"])], [("x", (1, ci, h, w))], {"W": wt})
    program, graph = _program(path, (1, co, h, w))
    x = rng.standard_normal((1, ci, h, w)).astype(np.float32)
    want = np.einsum("ci,ihw->chw", wt[:, :, 0, 0], x[0])[None]
    full = _with(program, lambda k: c_decisions(k, lanes))
    (conv,) = [p.conv for p in _phases(full) if p.conv is not None]
    assert conv.x_in_place and not conv.by_channel and conv.chunk == {8: 24, 16: 32}[lanes]
    assert conv.tails == conv_tails(conv.chunk, lanes) == {8: (8,), 16: (16, 8)}[lanes]
    source = render_c(full)
    assert all(f"q0 += {t}" in source for t in conv.tails)
    bare = _with(full, lambda k: _map_convs(k, tails=()))
    for prog in (full, bare):
        got = _run_c(prog, graph, {"x": x})
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_a_pointwise_conv_over_whole_rows_runs_its_pixels_flat(tmp_path, lanes):
    """A 1x1 stride-1 conv read in place whose tiles span whole rows runs each tile's rows as one run of
    pixels (Conv.flat): whole vectors, then the last few pixels as one vector loaded lane by lane up to the
    run's end (c0_loadnN), the sums in registers — row by row, a 7-wide row ran one short lane loop with its
    sums in memory (resnet50's 1x1 convs over 7x7 maps 4.4x their model, benchmarks/NOTES.md flatpixels).
    Random widths and row counts, tiles of several rows with a shorter last one; a tile narrower than the
    rows keeps the row-by-row form. The C matches NumPy either way."""
    rng = np.random.default_rng(90 + lanes)
    ci, co = int(rng.integers(3, 40)), int(rng.integers(2, 20))
    h, w = int(rng.integers(6, 12)), int(rng.integers(6, 17))
    rows = int(rng.integers(3, h))  # h % rows may leave a shorter last tile; at least a vector of pixels a tile
    wt = rng.standard_normal((co, ci, 1, 1)).astype(np.float32)
    path = _save(tmp_path / "pw.onnx", [helper.make_node("Conv", ["x", "W"], ["y"])], [("x", (1, ci, h, w))], {"W": wt})
    x = rng.standard_normal((1, ci, h, w)).astype(np.float32)
    want = np.einsum("ci,ihw->chw", wt[:, :, 0, 0], x[0])[None]
    for tile, flat in (((1, co, rows, w), True), ((1, co, rows, max(1, w - 2)), False)):
        program, graph = _program(path, tile)
        full = _with(program, lambda k: c_decisions(k, lanes))
        (conv,) = [p.conv for p in _phases(full) if p.conv is not None]
        assert conv.x_in_place and not conv.by_channel and conv.flat == flat, (tile, conv.by_channel)
        source = render_c(full)
        assert ("fl_n = oh_n * ow_n" in source) == flat
        assert ("one run of pixels" in json.dumps(program_to_json(full))) == flat  # program.json says which
        if flat and (rows * w) % lanes:
            assert f"c0_loadn{lanes}(x0, qn)" in source
        got = _run_c(full, graph, {"x": x})
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


@pytest.mark.parametrize("stride, in_place", [(1, True), (2, True), (4, False), (8, False)])
def test_a_patch_conv_wider_than_stride_two_stages_its_window(tmp_path, stride, in_place):
    """A conv whose kernel equals its stride (ViT's patch embedding, the 4x4/4 stems): read in place, a
    column stride above 2 makes every vector operand a strided gather (vit's 8x8/8 conv measured 286 us
    against 47 staged, benchmarks/RESULTS.md vitconv), so its window is staged and de-interleaved; strides
    of 1 and 2 keep reading in place. Either way the C matches NumPy."""
    rng = np.random.default_rng(70 + stride)
    ci, co, k = 3, 16, stride
    hw = 4 * stride
    wt = rng.standard_normal((co, ci, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[k, k], strides=[stride, stride])
    path = _save(tmp_path / "patch.onnx", [node], [("x", (1, ci, hw, hw))], {"W": wt})
    program, graph = _program(path, (1, co, 2, 4))
    x = rng.standard_normal((1, ci, hw, hw)).astype(np.float32)
    patches = x[0].reshape(ci, 4, k, 4, k)  # [c, oh, kh, ow, kw]
    want = np.einsum("ocij,cyixj->oyx", wt, patches)[None]
    for lanes in (8, 16):
        full = _with(program, lambda kern, lanes=lanes: c_decisions(kern, lanes))
        (conv,) = [p.conv for p in _phases(full) if p.conv is not None]
        assert conv.x_in_place == in_place
        got = _run_c(full, graph, {"x": x})
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


@pytest.mark.parametrize("k", [1, 3])
def test_a_stride_two_row_read_in_place_loads_its_even_floats_as_vectors(tmp_path, k):
    """An unpadded stride-2 conv reads its window rows in place; where a chunk is whole vectors, each operand
    is the even floats of the 2n - 1 it reads in place (c0_evenN: two loads and a shuffle, never past the row's last
    float used) in named vector registers, not an `omp simd` lane loop over x[q * 2] (GCC ran that at 4 lanes, its
    sums in memory: zoo resnet's 1x1 stride-2 shortcut convs 2.5-3.5x slower, benchmarks/NOTES.md
    "evenlanes"). The input's width puts the last chunk's last float on the row's last element. The C
    matches NumPy at both widths of vector."""
    rng = np.random.default_rng(80 + k)
    ci, co, ow = 6, 8, 16
    hw = 2 * (ow - 1) + k  # 31 (1x1) or 33 (3x3): the last column the conv reads is the row's last
    wt = rng.standard_normal((co, ci, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[k, k], strides=[2, 2])
    path = _save(tmp_path / "s2.onnx", [node], [("x", (1, ci, hw, hw))], {"W": wt})
    program, graph = _program(path, (1, co, 4, ow))
    x = rng.standard_normal((1, ci, hw, hw)).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x[0], (k, k), axis=(1, 2))[:, ::2, ::2]  # [c, oh, ow, kh, kw]
    want = np.einsum("ocij,cyxij->oyx", wt, windows)[None]
    assert want.shape == (1, co, ow, ow)
    for lanes in (8, 16):
        full = _with(program, lambda kern, lanes=lanes: c_decisions(kern, lanes))
        (conv,) = [p.conv for p in _phases(full) if p.conv is not None]
        assert conv.x_in_place and conv.chunk % lanes == 0
        source = render_c(full)
        assert f"= c0_even{lanes}(x0 + " in source  # the whole chunks (a narrower last one keeps the lane loop)
        got = _run_c(full, graph, {"x": x})
        assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < TOL


def test_a_rows_pointer_pick_is_chosen_before_the_column_loop_and_the_loop_vectorises(tmp_path):
    """lstm's y (its 32 step outputs stacked) reads each row through a pointer picked by the row's step: the C
    target chooses that pointer once per row, before the `omp simd` column loop (in the loop, GCC made the choice
    per element: zoo lstm's stack kernel 7.5 us against 2.2); the outputs are the reference's."""
    from engine.device import get_device
    from engine.runtime.execute import run_model
    from engine.schedule.pipeline import plan_model

    graph = load_graph(Path(__file__).resolve().parents[3] / "samples" / "lstm.onnx")
    device = get_device("a100")
    planned, plan = plan_model(graph, "unfused", device)
    lines = render_c(generate(plan, planned, device, target="c")).splitlines()
    picks = [k for k, line in enumerate(lines) if line.lstrip().startswith("const float* v") and "? g_" in line]
    assert picks
    for k in picks:
        assert lines[k + 1].strip() == "#pragma omp simd" and lines[k + 2].lstrip().startswith("for (int i")
    rng = np.random.default_rng(5)
    inputs = {s.name: rng.standard_normal(s.shape).astype(np.float32) for s in graph.inputs}
    got = run_model(graph, inputs, backend="cpu", plan=plan).outputs
    want = run_model(graph, inputs, backend="reference").outputs
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5)


def test_a_gemm_phase_of_no_rows_in_a_fused_kernel_prints(tmp_path):
    """The slow fuzz profile's find: a MatMul feeding a depthwise 1x1 stride-2 conv padded above only, fused into
    one kernel, leaves the MatMul's GEMM phase a tile of no rows (the conv's first output row reads padding
    alone); `k_run`'s bound on a staged A divided by those rows (ZeroDivisionError in block_gemms). The C runs
    and matches onnxruntime under every policy."""
    from support import assert_runs_like_onnxruntime, graph_model

    rng = np.random.default_rng(51)
    x = rng.standard_normal((1, 13, 1, 13)).astype(np.float32)
    w0 = rng.standard_normal((13, 1)).astype(np.float32)
    w1 = rng.standard_normal((13, 1, 1, 1)).astype(np.float32)
    model = graph_model([helper.make_node("MatMul", ["x", "w0"], ["m"]),
                         helper.make_node("Conv", ["m", "w1"], ["y"], group=13, kernel_shape=[1, 1],
                                          pads=[1, 0, 0, 0], strides=[2, 2])], {"x": x}, {"w0": w0, "w1": w1}, opset=17)
    onnx.save(model, tmp_path / "m.onnx")
    for policy in ("unfused", "stitch", "welder"):
        assert_runs_like_onnxruntime(tmp_path / "m.onnx", {"x": x}, backend="cpu", policy=policy)
