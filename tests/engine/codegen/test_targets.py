"""C printer choices of engine/codegen/targets.py that exist for speed: row caches (a reduction's terms
reread by a later phase instead of recomputed), which segments run in parallel, and kernels built for
the host CPU. Each is checked on the source and on the result against onnxruntime."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import fuse_all, make_test_plan, policy_plan  # noqa: E402
from sample_io import SAMPLES, load_sample, rel_error  # noqa: E402

from engine.codegen.ctarget import (  # noqa: E402
    SERIAL_WORK,
    STREAM_WORK,
    _streams_weight,
    c_decisions,
    find_row_caches,
    segment_work,
)
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.targets import render_c  # noqa: E402
from engine.runtime.cpu import compile_program_c, run_cpu  # noqa: E402
from engine.schedule.plan import Tile  # noqa: E402


def _kernels_only(source: str) -> str:
    """The source without the helper definitions (which spell c0_expf themselves)."""
    return "\n".join(line for line in source.splitlines() if not line.startswith("static inline"))


def _printed(program) -> list:
    """The program's kernels as the printers see them (without provenance markers)."""
    return [k.stripped() for k in program.kernels]


def _run(graph, program, inputs) -> dict:
    outs, _ = run_cpu(compile_program_c(program), graph.specs, inputs, graph.weights)
    return outs


def test_softmax_exp_is_computed_once_and_reread_from_a_row_cache():
    """masked_softmax under welder: exp(x - max) has a phase of its own (a block buffer the sum and the
    normalise phases read), and the max phase keeps each masked logit in a row cache the exp phase
    rereads: the mask and scores are read once and exp runs once per element."""
    graph, inputs, _ = load_sample("masked_softmax")
    program = generate(policy_plan(graph, "welder"), graph)
    caches = [c for k in _printed(program) for s in k.segments for c in find_row_caches(s)]
    assert [(c.producer, c.consumer) for c in caches] == [("probs::max", "probs::exp")]
    body = _kernels_only(render_c(program))
    assert body.count("c0_expf(") == 1 and body.count("g_mask[") == 1 and body.count("g_scores[") == 1
    assert re.search(r"row0\[.*\+ r0\] = v\d+;", body) and re.search(r"= \(row0\[.*\+ i3\] - v\d+\)", body)
    assert re.search(r"s_probs__exp\[.*\] = v\d+;", body)
    assert _softmax_error(graph, program, inputs, seed=5) <= 1e-5


def _softmax_error(graph, program, inputs, seed: int) -> float:
    """masked_softmax's `program` against onnxruntime on random logits (so a row cache read at the wrong row
    or column cannot match by chance): the largest relative error over its outputs."""
    rng = np.random.default_rng(seed)
    inputs = dict(inputs, scores=rng.standard_normal(inputs["scores"].shape).astype(np.float32) * 4)
    sess = ort.InferenceSession(str(SAMPLES / "masked_softmax.onnx"), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
    got = _run(graph, program, inputs)
    assert got.keys() == want.keys()
    return max(rel_error(got[k], want[k]) for k in want)


def test_no_row_cache_where_the_consumer_tile_splits_the_row():
    """The normalise phase tiled half a row wide cannot read a full-row cache: exp is recomputed there
    (the sum phase may still reread the max phase's terms), and the result still matches onnxruntime."""
    graph, inputs, expected = load_sample("masked_softmax")
    plan = make_test_plan(graph, fuse_all(graph), tiles={"probs": Tile("probs", (1, 1, 4, 64), 128, 0)})
    program = generate(plan, graph)
    assert not [c for k in _printed(program) for s in k.segments for c in find_row_caches(s) if c.consumer == "probs"]
    assert _kernels_only(render_c(program)).count("c0_expf(") == 2
    got = _run(graph, program, inputs)
    assert max(rel_error(got[k], expected[k]) for k in expected) <= 1e-3


def test_row_cache_on_rows_the_tiles_do_not_divide():
    """128 rows per head in tiles of 48: the last tile's rows are clamped (32 of them). The sum phase's exp
    terms are still kept for the normalise phase — both phases clamp their rows alike, and the cache is
    indexed from the tile's first row — so exp runs once per element; random logits match onnxruntime (a
    cache read at the wrong row could not match by chance)."""
    graph, inputs, _ = load_sample("masked_softmax")
    plan = make_test_plan(graph, fuse_all(graph), tiles={"probs": Tile("probs", (1, 1, 48, 128), 128, 0)})
    program = generate(plan, graph)
    caches = [c for k in _printed(program) for s in k.segments for c in find_row_caches(s)]
    assert [(c.producer, c.consumer) for c in caches] == [("probs::max", "probs::sum"), ("probs::sum", "probs")]
    spans = [p.region.spans for k in _printed(program) for s in k.segments for p in s.phases if p.stage == "probs"]
    assert spans and spans[0][2].clamp
    assert _kernels_only(render_c(program)).count("c0_expf(") == 1
    assert _softmax_error(graph, program, inputs, seed=11) <= 1e-5


POOL_CALL = re.compile(r"^\s+tw_parallel_for\(", re.M)  # a pooled tile loop's call in a kernel


@pytest.mark.parametrize("loops", ["pool", "omp"])
def test_transcendental_work_runs_in_parallel_and_tiny_segments_serially(loops, monkeypatch):
    """gelu_chain (tanh on 393 K elements) is worth parallel threads (the pool's, or an OpenMP team
    under TILEWEAVE_C_LOOPS=omp); a segment of a few elements is not."""
    monkeypatch.setenv("TILEWEAVE_C_LOOPS", loops)
    graph = load_sample("gelu_chain")[0]
    program = generate(policy_plan(graph, "welder"), graph)
    segs = [s for k in _printed(program) for s in k.segments]
    assert all(segment_work(s) >= SERIAL_WORK for s in segs)
    source = _kernels_only(render_c(program))
    assert source.count("#pragma omp parallel for") == (len(segs) if loops == "omp" else 0)
    assert len(POOL_CALL.findall(source)) == (len(segs) if loops == "pool" else 0)
    lstm = load_sample("lstm")[0]
    small = [s for k in generate(policy_plan(lstm, "welder"), lstm).kernels for s in k.segments
             if segment_work(s) < SERIAL_WORK]
    assert small  # the per-step gate kernels stay on the calling thread


@pytest.mark.parametrize("loops", ["pool", "omp"])
def test_weight_streaming_gemv_segments_split_statically(loops, monkeypatch):
    """lstm's per-step h @ R^T segments (dot products over a 1 MB weight) run as a static OpenMP
    split, so each thread rereads the same part of R from its own L2 every step; the gate-only
    segments stay serial."""
    monkeypatch.setenv("TILEWEAVE_C_LOOPS", loops)
    lstm = load_sample("lstm")[0]
    program = generate(policy_plan(lstm, "welder"), lstm)
    source = _kernels_only(render_c(program))
    steps = [s for k in _printed(program) for s in k.segments if _streams_weight(s) and segment_work(s) >= STREAM_WORK]
    assert len(steps) >= 30
    if loops == "omp":
        assert source.count("#pragma omp parallel for schedule(static)") == len(steps)
    else:
        assert source.count("pooled: streaming a weight: one even share per thread") == len(steps)
        assert len(re.findall(r"^\s+tw_parallel_for\(\d+, 0, ", source, re.M)) == len(steps)
    assert "element-steps: serial" in source


def test_c_target_runs_weight_streaming_gemv_one_block_per_thread(monkeypatch):
    """The C target coarsens lstm's per-step dot-product segments to one block per OpenMP thread (each
    thread then recomputes the hidden state the products read once per step, not once per block); the
    CUDA program keeps the plan's four blocks. Still matches onnxruntime."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    graph, inputs, expected = load_sample("lstm")
    plan = policy_plan(graph, "welder")
    cuda, c = generate(plan, graph), generate(plan, graph, target="c")
    steps = [(a.ntiles, b.ntiles) for ka, kb in zip(cuda.kernels, c.kernels) for a, b in zip(ka.segments, kb.segments)
             if _streams_weight(a) and a.ntiles == 4]
    assert len(steps) >= 30 and all(n == 2 for _, n in steps)
    got = _run(graph, c, inputs)
    assert max(rel_error(got[k], expected[k]) for k in expected) <= 1e-4


def test_row_invariants_are_computed_before_the_column_loop():
    """LayerNorm's normalise phase: the row's 1/sqrt(var + eps) (and the row reads behind it) sit
    before the vectorised column loop (OpenMP outlining drops restrict, so GCC would redo them per
    vector behind the stores); the column loop holds only per-column work. Still matches
    onnxruntime."""
    graph, inputs, expected = load_sample("layernorm_residual")
    program = generate(policy_plan(graph, "welder"), graph)
    lines = _kernels_only(render_c(program)).splitlines()
    store = next(k for k, x in enumerate(lines) if "g_y[" in x and "] = " in x)
    column = max(k for k in range(store) if lines[k].lstrip().startswith("for ("))
    assert lines[column - 1].strip() == "#pragma omp simd"
    assert not any(("1.0f /" in x or "sqrtf(" in x or " / " in x) for x in lines[column:store])
    row = max(k for k in range(column) if lines[k].lstrip().startswith("for ("))
    assert any("1.0f /" in x for x in lines[row:column])
    got = _run(graph, program, inputs)
    assert max(rel_error(got[k], expected[k]) for k in expected) <= 1e-5


def test_division_by_a_row_value_becomes_a_reciprocal_only_there():
    """x / y with y constant along the column becomes x * (1 / y); a column-varying divisor and a
    division inside the divisor's own row value stay divisions."""
    from engine.codegen.ctarget import reciprocal_divisions
    from engine.ir import expr as E
    from engine.ir import index as I
    from engine.ir.dtypes import DType

    col = E.Load("x", (I.var("i0"), I.var("i1")), DType.F32)
    row = E.Load("s", (I.var("i0"),), DType.F32)
    out = reciprocal_divisions(E.div(E.div(col, E.div(row, E.imm(3.0))), col), "i1")
    assert out == E.div(E.mul(col, E.Unary("recip", E.div(row, E.imm(3.0)), DType.F32)), col)


@pytest.mark.parametrize("vector", [8, 16])
def test_convolution_kernels_carry_no_per_kernel_attributes(vector):
    """Blocked for AVX2 (ctarget.c_decisions at 8 lanes) or AVX-512 (16), no kernel carries a target or
    optimize attribute: GCC refuses to inline the math helpers across one (see
    test_conv.test_fused_conv_kernels_inline_every_math_helper); the conv micro-tiles get their FMA
    from C0_VFMA8 / C0_VFMA16 instead. Both match onnxruntime."""
    graph, inputs, expected = load_sample("conv_bn_relu")
    program = generate(policy_plan(graph, "unfused"), graph)
    program = dataclasses.replace(program, kernels=tuple(c_decisions(k, vector) for k in program.kernels))
    assert {p.conv.lanes for k in program.kernels for s in k.segments for p in s.phases if p.conv} == {vector}
    c = render_c(program)
    sigs = [x for x in c.splitlines() if x.rstrip().endswith("{") and " void k" in " " + x]
    assert any(p.conv for k in program.kernels for s in k.segments for p in s.phases)
    assert sigs and not [x for x in sigs if "__attribute__" in x]
    assert "__attribute__((optimize" not in c and f"C0_VFMA{vector}(a0, x0_0, r0_0_0)" in c
    got = _run(graph, program, inputs)
    assert max(rel_error(got[k], expected[k]) for k in expected) <= 1e-3


def test_select_chain_over_tensors_loads_through_one_pointer():
    """lstm's y picks one of 32 per-step h buffers per element: printed as one load through a
    pointer chosen by the (element-independent) step conditions, not 32 loads and a select chain;
    the CUDA printer shares it. Still matches onnxruntime."""
    graph, inputs, expected = load_sample("lstm")
    program = generate(policy_plan(graph, "welder"), graph)
    c = _kernels_only(render_c(program))
    picks = [x for x in c.splitlines() if x.lstrip().startswith("const float* v") and "g_y__d0_t0_h :" in x]
    assert picks and all(x.count(" ? ") == 31 for x in picks)
    assert not any(x.strip().startswith("const float v") and "g_y__d0_t7_h[" in x for x in c.splitlines())
    got = _run(graph, program, inputs)
    assert max(rel_error(got[k], expected[k]) for k in expected) <= 1e-4


def test_a_pick_chosen_by_the_row_is_counted_once_per_row():
    """The pick of lstm's y (one of 32 per-step h buffers, chosen by the step index): the C target computes
    the conditions before the row's loop and GCC hoists the pointer choice after them, so the count charges
    them once per row, not per element (zoo lstm's stack kernels modeled 50 us against 8 measured while it
    charged 31 conditions and choices per element: benchmarks/NOTES.md rowpicks)."""
    from engine.codegen.count import _strip, count_kernel
    from engine.codegen.printer import pick_chain

    graph, _, _ = load_sample("lstm")
    program = generate(policy_plan(graph, "unfused"), graph, target="c")
    found = 0
    for kernel in program.kernels:
        for seg in kernel.segments:
            for phase in seg.phases:
                if phase.gemm is not None or phase.region.flat or pick_chain(kernel, _strip(phase.body)) is None:
                    continue
                alone = dataclasses.replace(kernel, segments=(dataclasses.replace(seg, phases=(phase,)),))
                elems = seg.ntiles * float(np.prod(phase.region.extent))
                row = phase.region.extent[-1]
                assert row > 1
                # 31 links: per element that was at least 31 pointer choices and 31 conditions.
                assert count_kernel(alone).flops / elems < 2 * 31 * 2 / row + 1, kernel.name
                found += 1
    assert found


def test_weight_panels_are_staged_once_per_column_tile():
    """bert's GEMMs against weights (the FFN's, the projections): B is staged whole per column tile
    into a per-thread panel kept across tiles walked column tile by column tile, not per tile; every
    panel is freed; matches onnxruntime. A GEMM whose B depends on the row's batch/head (attention's
    K) keeps per-tile staging. Planned on an a100 without the cost model's latency term, whose plan has
    the weight-panel segments this checks (with the term, welder's wider tiles take another C path)."""
    import dataclasses

    from engine.device import get_device

    graph, inputs, expected = load_sample("bert_layer")
    program = generate(policy_plan(graph, "welder", dataclasses.replace(get_device("a100"), mem_latency_cycles=0.0)),
                       graph, target="c")
    c = _kernels_only(render_c(program))
    assert re.search(r"stage B's k x \d+ panel once", c)
    assert c.count("malloc(") == c.count("free(") > 0
    assert "const int tc2 = t / " in c  # column tiles outermost in the panel segments
    assert "st_b[" in c  # per-tile staging where B is not a weight
    got = _run(graph, program, inputs)
    assert max(rel_error(got[k], expected[k]) for k in expected) <= 1e-3


@pytest.mark.parametrize("fused", [True, False])
def test_batched_projection_sums_run_column_wise(tmp_path, fused):
    """A sum over a region of several rows of several batch entries, with a weight per batch entry
    (attention's probabilities @ V on 4 x 2 x 32 tiles: the GEMM path, rows flattened over the batch and
    row axes, needs a B that does not depend on them), runs with the sum outside and the columns inside —
    acc[j] += a(k) * W[b, k, j], rows of W contiguous — instead of one strided dot product per element:
    `fused`, the sum inlined into a per-element phase (measured 4.8x on mobilevit's segment before its
    projections became GEMMs over flattened rows); else the phase is the sum itself (gpt2's welder
    kernels: welder/unfused 1.5 -> 1.05). It matches onnxruntime."""
    import onnx
    from onnx import TensorProto, helper

    from engine.api import load_graph
    from engine.schedule.plan import Conn

    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 32, 24)).astype(np.float32)
    nodes = ([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("MatMul", ["s", "W"], ["m"]),
              helper.make_node("Relu", ["m"], ["y"])] if fused else [helper.make_node("MatMul", ["x", "W"], ["y"])])
    graph = helper.make_graph(nodes, "proj", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16, 24])],
                              [onnx.numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, tmp_path / "proj.onnx")
    g = load_graph(tmp_path / "proj.onnx")
    out = g.stage(g.outputs[0])
    conns = fuse_all(g, reduce_conn=Conn.REGISTER) if fused else {}
    plan = make_test_plan(g, conns, {out.name: Tile("", (4, 2, 24), 32, 8)})
    program = generate(plan, g, target="c")
    phases = [p for k in program.kernels for s in k.segments for p in s.phases]
    assert all(p.gemm is None for p in phases)  # B depends on the batch axis: not the GEMM path
    if not fused:
        (phase,) = phases
        assert phase.combine is not None
    assert any(p.column_sums for p in phases)  # ctarget.sum_columns chose them
    source = render_c(program)
    assert "ax0[i2 - " in source and "] += " in source
    x = rng.standard_normal((4, 16, 32)).astype(np.float32)
    outs, _ = run_cpu(compile_program_c(program), g.specs, {"x": x}, g.weights)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert rel_error(outs["y"], sess.run(None, {"x": x})[0]) < 1e-5


@pytest.mark.parametrize("shape,ntiles", [((16, 16, 96), 32), ((4, 6, 10), 12), ((3, 5, 8), 15), ((2, 4, 6), 1),
                                          ((7, 9), 3), ((4, 6, 10), 16)])
def test_chunk_boxes_partition_the_tensor_in_row_major_chunks(shape, ntiles):
    """A stage completed in ntiles row-major chunks, each chunk a box where it is one: the boxes cover
    exactly the chunk's elements; None where a chunk is not a box (4x6x10 in 16 chunks of 15)."""
    from engine.codegen.generate import _chunk_boxes

    boxes = _chunk_boxes(shape, ntiles)
    size = int(np.prod(shape))
    if size % ntiles or (size // ntiles) % shape[-1] and shape[-1] % (size // ntiles):
        assert boxes is None
        return
    assert boxes is not None and len(boxes) == ntiles
    flat = np.arange(size).reshape(shape)
    for t, box in enumerate(boxes):
        got = flat[tuple(slice(lo, hi) for lo, hi in box)].ravel()
        assert np.array_equal(got, np.arange(t * size // ntiles, (t + 1) * size // ntiles))


def test_stage_completed_in_chunks_runs_as_a_gemm(tmp_path):
    """A projection whose tile computes only the columns its in-block consumer reads, while the whole
    tensor is also a graph output (swin's batched QKV: Q used in the block, Q, K and V stored): the
    completion for global memory is split into row-major chunks that are boxes, so it runs on the GEMM
    path (it ran element by element: 1.2 of swin's 3.9 ms), with its own region bounds (it once took
    the block buffer's, sized for the consumer's columns, and overflowed); both outputs match."""
    import onnx
    from onnx import TensorProto, helper

    from engine.api import load_graph
    from engine.schedule.plan import Conn

    rng = np.random.default_rng(31)
    w = rng.standard_normal((32, 96)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["qkv"]),
             helper.make_node("Slice", ["qkv", "s0", "s1", "ax"], ["q"]), helper.make_node("Relu", ["q"], ["y"])]
    inits = [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(np.array([0], np.int64), "s0"),
             onnx.numpy_helper.from_array(np.array([32], np.int64), "s1"),
             onnx.numpy_helper.from_array(np.array([2], np.int64), "ax")]
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32]),
                               helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, 16, 96])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, tmp_path / "qkv.onnx")
    g = load_graph(tmp_path / "qkv.onnx")
    out = g.stage(g.outputs[0])
    plan = make_test_plan(g, fuse_all(g, conn=Conn.SHARED), {out.name: Tile("", (1, 8, 32), 64, 2)})
    for target in ("c", "cuda"):
        program = generate(plan, g, target=target)
        qkv = [p for k in program.kernels for s in k.segments for p in s.phases if p.stage == g.outputs[1]]
        assert len(qkv) == 2 and all(p.gemm is not None and not p.region.flat for p in qkv), \
            [p.describe() for p in qkv]
        assert qkv[1].region.extent == (1, 8, 96)
    x = rng.standard_normal((1, 16, 32)).astype(np.float32)
    outs, _ = run_cpu(compile_program_c(generate(plan, g, target="c")), g.specs, {"x": x}, g.weights)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip((outs["y"], outs["qkv"]), sess.run(None, {"x": x})):
        assert rel_error(got, want) < 1e-5


def test_scalar_calls_are_the_ops_the_c_printer_prints_as_libm_calls():
    """CPrinter.scalar_calls (read by the host cost model) names exactly the float unary ops the C printer
    renders as a libm call; the others it renders inline (helpers, operators or instructions)."""
    from engine.codegen.targets import CPrinter
    from engine.ir.dtypes import DType
    from engine.ir.expr import LIBM_CALLS, UNARY_OPS

    libm = {"sin": "sinf", "cos": "cosf", "exp": "expf", "log": "logf", "tanh": "tanhf", "erf": "erff",
            **{op: f"{op}f" for op in LIBM_CALLS}}
    called = {op for op in UNARY_OPS if op in libm and CPrinter().unary(op, "x", DType.F32).startswith(libm[op] + "(")}
    assert called == set(CPrinter.scalar_calls)


def test_c_math_helpers_are_always_inlined():
    """Every helper the C printer defines (c0_expf, c1_tanhf, ...) is always_inline, as CUDA's are
    __forceinline__: in a kernel past GCC's function-growth limits (lstm's 32-step recurrence fused into
    one function) a plain `static inline` c0_expf stayed a call and its gate loops ran one lane at a time.
    The program still compiles and matches onnxruntime."""
    graph, inputs, _ = load_sample("masked_softmax")
    program = generate(policy_plan(graph, "welder"), graph)
    text = render_c(program)
    defs = re.findall(r"^static inline.*? (c\d+_\w+)\(", text, re.M)
    assert "c0_expf" in defs
    assert all(line.startswith("static inline __attribute__((always_inline)) ")
               for line in text.splitlines() if re.match(r"static inline.*? c\d+_\w+\(", line)), defs
    rng = np.random.default_rng(9)
    inputs = dict(inputs, scores=rng.standard_normal(inputs["scores"].shape).astype(np.float32) * 4)
    sess = ort.InferenceSession(str(SAMPLES / "masked_softmax.onnx"), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
    got = _run(graph, program, inputs)
    assert max(rel_error(got[k], want[k]) for k in want) <= 1e-5


def test_gemm_staging_chooses_a_picked_step_buffer_once_per_row():
    """zoo lstm (a torch export of two layers) under welder, printed as C: the second layer's input
    projection stages A through a pick of one of 32 per-step h buffers, conditions on the row alone. The
    C GEMM chooses the pointer once per staged row, before its k loop (Gemm.a_row_picks), not per element
    (GCC had made the choice a jump per staged element: that kernel alone 56 -> 33 µs, RESULTS "kernels11"); the count charges
    the choice per row as printed. Outputs match onnxruntime's (the zoo's saved outputs)."""
    from engine.codegen.count import count_kernel
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    zoo = Path(__file__).resolve().parents[3] / "samples" / "zoo"
    graph = load_graph(zoo / "lstm.onnx")
    _, plan = plan_model(graph, "welder", get_device("a100"))
    program = generate(plan, graph, "a100", target="c")
    picked = [k for k in program.kernels if any(p.gemm is not None and p.gemm.a_row_picks
                                                 for s in k.segments for p in s.phases)]
    assert picked
    lines = _kernels_only(render_c(program)).splitlines()
    picks = [j for j, x in enumerate(lines) if x.lstrip().startswith("const float* v") and x.count(" ? ") == 31]
    assert picks and all(lines[j + 1].strip() == "for (int kk = 0; kk < k_n; ++kk) {" for j in picks)
    for kernel in picked:  # per element, the pick would cost its 31 conditions and choices again
        every = dataclasses.replace(kernel, segments=tuple(dataclasses.replace(s, phases=tuple(
            dataclasses.replace(p, gemm=dataclasses.replace(p.gemm, a_row_picks=False)) if p.gemm else p
            for p in s.phases)) for s in kernel.segments))
        assert count_kernel(kernel).flops < count_kernel(every).flops - 31 * 1000
    saved = np.load(zoo / "lstm.io.npz")
    got = _run(graph, program, {"x": saved["x"]})
    assert max(rel_error(got[k], saved[k]) for k in ("y", "h")) <= 1e-4


def test_a_gathered_index_invariant_in_a_reduction_is_read_once_before_its_loop(tmp_path):
    """Mixture-of-experts down projections read each token's expert weights through its routing index inside the
    dot product's loop; with the index read in the loop GCC vectorised the weight loads as gathers (3.3x the
    kernel's modeled time on Mixtral's export). The C reads it once before the loop (`invariant_indices`), the
    loop's loads are plain, and the program matches onnxruntime."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from engine.api import load_graph
    from engine.device import get_device
    from engine.runtime.execute import run_model
    from engine.schedule.pipeline import plan_model

    rng = np.random.default_rng(3)
    consts = {"w": rng.standard_normal((4, 16, 64)).astype(np.float32), "axes": np.asarray([-1], np.int64)}
    nodes = [helper.make_node("Gather", ["w", "experts"], ["rows"]),  # [tokens, 16, 64]: each token's expert
             helper.make_node("Unsqueeze", ["x", "one"], ["x3"]), helper.make_node("Mul", ["rows", "x3"], ["p"]),
             helper.make_node("ReduceSum", ["p", "axes"], ["y"], keepdims=0)]
    consts["one"] = np.asarray([1], np.int64)
    g = helper.make_graph(nodes, "moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 64)),
                                         helper.make_tensor_value_info("experts", TensorProto.INT64, (8,))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, n) for n, v in consts.items()])
    path = tmp_path / "moe.onnx"
    onnx.save(onnx.shape_inference.infer_shapes(helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)), path)
    graph = load_graph(path)
    _, plan = plan_model(graph, "welder", get_device("host"))
    text = render_c(generate(plan, graph, target="c"))
    inner = re.findall(r"#pragma omp simd reduction[^\n]*\n\s*for \([^\n]*\{\n((?:[^\n]*\n)*?)\s*\}", text)
    assert inner and not any("widx(" in body for body in inner), inner
    feeds = {"x": rng.standard_normal((8, 64)).astype(np.float32), "experts": rng.integers(0, 4, 8).astype(np.int64)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert rel_error(run_model(graph, feeds, backend="cpu", policy="welder").outputs["y"], want) < 1e-5
