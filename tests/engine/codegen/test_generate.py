"""Plan → Program (engine/codegen/generate.py), memory planning (engine/runtime/memory.py) and the
compile CLI: structure of kernels, segments and buffers, and refusals with one-line reasons."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plans import fuse_all, hand_conns, make_test_plan  # noqa: E402
from sample_io import SAMPLES, load_sample  # noqa: E402

from engine.codegen.generate import fit_region, generate  # noqa: E402
from engine.codegen.kir import Scope  # noqa: E402
from engine.errors import PlanError  # noqa: E402
from engine.runtime.memory import plan_memory  # noqa: E402
from engine.schedule.plan import Conn, Tile  # noqa: E402


def test_unfused_plan_is_one_kernel_per_stage_in_dependency_order():
    graph = load_sample("layernorm_residual")[0]
    program = generate(make_test_plan(graph), graph)
    assert len(program.kernels) == len(graph.stages)
    done = set(program.inputs) | set(program.constants)
    for launch in program.launches:
        kernel = program.kernel(launch.kernel)
        written = {n for s in kernel.segments for p in s.phases for n in p.stores}
        reads = [b.tensor for b in kernel.params if b.name not in written]
        assert set(reads) <= done, launch.kernel
        done |= {kernel.buffer(n).tensor for n in written}


def test_fused_layernorm_inlines_register_producers_and_keeps_reductions_in_block_buffers():
    graph = load_sample("layernorm_residual")[0]
    program = generate(make_test_plan(graph, fuse_all(graph)), graph)
    (kernel,) = program.kernels
    assert kernel.name.startswith("k00_add_mean")
    phases = [p.stage for s in kernel.segments for p in s.phases]
    assert phases == ["ReduceMean_2_out::sum", "ReduceMean_6_out::sum", "y"]
    assert [b.tensor for b in kernel.locals] == ["ReduceMean_2_out::sum", "ReduceMean_6_out::sum"]
    assert all(b.scope == Scope.BLOCK for b in kernel.locals)
    assert {b.tensor for b in kernel.params} == {"x", "residual", "gamma", "beta", "y"}
    assert program.memory.arena_bytes == 0  # nothing intermediate reaches global memory


def test_grid_barrier_splits_segments_and_caps_the_grid_to_one_wave():
    from engine.device import get_device, resident_blocks_per_sm

    graph = load_sample("gelu_chain")[0]
    plan = make_test_plan(graph, hand_conns(graph, {"Mul_7_out->Tanh_8_out": Conn.GLOBAL_SYNC}),
                          {"y": Tile("", (1, 32), 32, 0), "Mul_7_out": Tile("", (1, 32), 32, 0)})
    program = generate(plan, graph, "a100")
    (kernel,) = program.kernels
    assert [s.anchor for s in kernel.segments] == ["Mul_7_out", "y"]
    assert "Mul_7_out" in {b.tensor for b in kernel.params}  # crosses the grid barrier in global memory
    dev = get_device("a100")
    per_sm, _ = resident_blocks_per_sm(dev, kernel.threads, 0, kernel.shared_bytes)
    (launch,) = program.launches
    assert launch.cooperative and launch.grid == per_sm * dev.sm_count < kernel.ntiles  # blocks loop over tiles


def test_segment_without_exactly_one_tile_is_refused():
    graph = load_sample("gelu_chain")[0]
    plan = make_test_plan(graph, fuse_all(graph))
    group = plan.groups[0]
    extra = Tile("Mul_7_out", (1, 256), 128, 1536)
    bad = plan.__class__(**{**plan.__dict__, "groups": (group.__class__(**{**group.__dict__,
                                                                             "segments": group.segments + (extra,)}),)})
    with pytest.raises(PlanError, match="needs exactly one"):
        generate(bad, graph)


def test_plan_for_another_model_is_refused():
    a, b = load_sample("gelu_chain")[0], load_sample("layernorm_residual")[0]
    with pytest.raises(PlanError, match="model hash"):
        generate(make_test_plan(a), b)


def test_fit_region_affine_and_clamped_halo():
    # A 3-wide stencil over 10 elements in tiles of 4: boxes clipped at both ends are still affine.
    boxes = [((max(0, 4 * t - 1), min(10, 4 * t + 5)),) for t in range(3)]
    region = fit_region((10,), (3,), boxes)
    (span,) = region.spans
    assert (span.base, span.ext, span.coeffs, span.clamp) == (-1, 6, (4,), True)
    # Irregular boxes fall back to a table.
    odd = [((0, 3),), ((3, 4),), ((4, 10),)]
    assert fit_region((10,), (3,), odd).table == ((0, 3), (3, 4), (4, 10))


def test_memory_plan_reuses_dead_buffers_and_never_overlaps_live_ones():
    rng = np.random.default_rng(3)
    tensors = [(f"t{k}", int(rng.integers(1, 5000)), int(a), int(a + rng.integers(0, 4)))
               for k, a in enumerate(rng.integers(0, 10, 40))]
    mem = plan_memory(tensors)
    assert mem.arena_bytes <= mem.naive_bytes
    allocs = mem.allocations
    for i, x in enumerate(allocs):
        for y in allocs[i + 1:]:
            live = not (x.last < y.first or y.last < x.first)
            disjoint = x.offset + x.nbytes <= y.offset or y.offset + y.nbytes <= x.offset
            assert not live or disjoint, (x, y)
    chain = plan_memory([("a", 1000, 0, 1), ("b", 1000, 1, 2), ("c", 1000, 2, 3)])
    assert chain.arena_bytes < chain.naive_bytes  # a and c never live together


def test_compile_cli_writes_sources_ptx_cubin_and_program_json(tmp_path):
    from engine.cli import main

    rc = main(["compile", str(SAMPLES / "masked_softmax.onnx"), "--policy", "stitch", "--target", "cuda",
               "--device", "h100", "-o", str(tmp_path)])
    assert rc == 0
    meta = json.loads((tmp_path / "program.json").read_text())
    assert meta["arch"] == "sm_90" and meta["launches"]
    assert {"kernel", "grid", "block", "shared_bytes", "cooperative", "args"} <= meta["launches"][0].keys()
    kernel = meta["kernels"][0]["name"]
    assert (tmp_path / f"{kernel}.sm_90.cubin").read_bytes()[:4] == b"\x7fELF"
    assert ".entry " + kernel in (tmp_path / f"{kernel}.sm_90.ptx").read_text()


def test_compile_cli_refuses_a_foreign_plan(tmp_path, capsys):
    from engine.cli import main

    graph = load_sample("gelu_chain")[0]
    from engine.schedule.plan import plan_to_json

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan_to_json(make_test_plan(graph))))
    rc = main(["compile", str(SAMPLES / "layernorm_residual.onnx"), "--plan-in", str(plan_file),
               "--target", "c", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: plan was made for model") and "\n" not in err


def test_copies_of_one_inlined_reduction_are_structurally_equal():
    """A mean inlined twice into a variance (x - mean)^2 gets the same loop variable in both copies, so
    the printer's SSA memo computes it once (names by nesting depth, not a global counter). A completion
    phase inlines a whole segment like this (a LayerNorm feeding a partially tiled projection)."""
    from engine.codegen.generate import _resolve
    from engine.codegen.kexpr import Reduce, kwalk

    graph = load_sample("vit_block")[0]
    ln = "attn/LayerNormalization_1_out"
    body = _resolve(graph.stage(f"{ln}::var"), graph, {f"{ln}::mean", f"{ln}::dev"}, {}, {})
    # dev * dev holds the mean twice: one structurally equal value (even one object: expansions of a
    # producer at one index are shared), which the printer's SSA memo computes once.
    reduces = [n for n in kwalk(body) if isinstance(n, Reduce)]
    assert len(set(reduces)) == 1
    assert reduces[0].vars == ("u1",) and reduces[0].extents == (384,)


def test_c_printer_computes_a_broadcast_chain_once_per_launch_or_tile():
    """pow_broadcast_add under welder adds exp(-sqrt(|a|^2.5 + 1)) (a depends on the column only) to
    every row. Every row tile spans all 4096 columns, so the C printer evaluates the chain once per
    launch, before the tile loop (one array for the reduction's and the normalisation's copy); when
    tiles split the columns it falls back to a per-tile line cache (once per tile), never once per row.
    The reduction's input edge is pinned at REGISTER so the chain sits in both the reduction and the
    normalisation. On a GPU every row tile would recompute the chain (175x its work): the plan is made
    with a recompute_bound that allows it — the C printer's caches are what this test is about."""
    from engine.codegen.targets import render_c
    from engine.device import get_device
    from engine.runtime.cpu import compile_program_c, run_cpu
    from engine.runtime.reference import run_reference
    from engine.schedule.edits import apply_edit
    from engine.schedule.plan import Edit

    graph = load_sample("pow_broadcast_add")[0]
    a100 = get_device("a100")
    pin = Edit.make("set_edge", producer="Add_9_out", consumer="ReduceSum_11_out", conn="register")
    from engine.schedule.policies import make_plan

    plan = apply_edit(make_plan(graph, "welder", a100, options={"recompute_bound": 1e6}), graph, a100, pin)
    source = render_c(generate(plan, graph))
    assert source.count("float launch_line0[4096];") == 1 and "float line0[" not in source
    assert source.count("= c1_powf(") == 1
    # before the parallel tile loop (an OpenMP loop, or the pool's call under TILEWEAVE_C_LOOPS=pool)
    assert source.index("= c1_powf(") < re.search(r"^\s+(tw_parallel_for\(|#pragma omp parallel)", source, re.M).start()
    split = apply_edit(plan, graph, a100, Edit.make("set_tile", stage="out", shape=[8, 512], threads=256))
    program = generate(split, graph)
    source = render_c(program)
    # The row sum still spans all 4096 columns in every tile (once per launch); the normalisation's
    # 512 columns differ per tile (once per tile).
    assert source.count("float launch_line0[4096];") == 1 and source.count("float line0[512];") == 1
    assert source.count("= c1_powf(") == 2  # one per cache fill, none inside the row loops
    rng = np.random.default_rng(3)
    inputs = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in graph.inputs}
    want = run_reference(graph, inputs)
    for prog in (generate(plan, graph), program):
        got, _ = run_cpu(compile_program_c(prog), graph.specs, inputs, graph.weights)
        assert np.max(np.abs(got["out"] - want["out"])) <= 1e-4 * np.max(np.abs(want["out"]))


def test_reduction_read_one_to_many_is_refused_at_register_and_computed_once_at_shared():
    """LayerNorm with every edge at REGISTER: 1/sqrt(var) is broadcast over the row, so inlining the
    variance into the normalise phase would redo its 768-long sum for every element — validate refuses
    it, naming the edge and the count. With the reductions' edges at SHARED every reduction is computed
    once per row (the kernel IR's count), nothing nests, and the result matches."""
    from engine.codegen.count import count_kernel
    from engine.device import get_device
    from engine.runtime.cpu import compile_program_c, run_cpu
    from engine.runtime.reference import run_reference
    from engine.schedule.validate import validate

    graph, inputs, _ = load_sample("layernorm_residual")
    bad = validate(make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.REGISTER)), graph, get_device("a100"))
    assert any(v.rule == "register_one_to_many" and "ReduceMean_6_out::sum -> " in v.subject and "256x" in v.message
               for v in bad)  # each of the tile's 256 elements would redo the sum
    rows = graph.stage("y").shape[0]
    plan = make_test_plan(graph, fuse_all(graph, reduce_conn=Conn.SHARED),
                          tiles={"y": Tile("y", (2, 768), 256, rows // 2)})  # whole rows: nothing redone
    assert not [v for v in validate(plan, graph, get_device("a100")) if v.rule in ("register_one_to_many", "recompute")]
    program = generate(plan, graph)
    (kernel,) = program.kernels
    work = count_kernel(kernel)
    assert all(work.evals[s.name] == rows for s in graph.stages if s.reduce)  # each row's sums once
    assert work.nest <= 768
    got, _ = run_cpu(compile_program_c(program), graph.specs, inputs, graph.weights)
    want = run_reference(graph, inputs)
    assert np.max(np.abs(got["y"] - want["y"])) <= 1e-4 * np.max(np.abs(want["y"]))


def test_a_scalar_stored_by_every_tile_owns_no_box():
    """`_owned` where a scalar (a full reduction read outside its segment) is computed by each of two tiles: a
    box of rank 0 is the one element, so no tile can own "none of it"; every tile stores the same value (None),
    as where the owned parts are not boxes. The property test of others_refused found it raising TypeError
    (numpy indexes a rank-0 array to a scalar, not a view)."""
    from engine.codegen.generate import _owned
    from engine.codegen.kir import Region
    from engine.ir.dtypes import DType
    from engine.ir.expr import Load
    from engine.ir.graph import Combine, Stage, StageKind

    stage = Stage("s", StageKind.REDUCE, (), DType.F32, Load("x", (), DType.F32), reduce=(2,), combine=Combine.SUM)
    assert _owned(stage, Region((), (2, 1, 1)), [(), ()], 2, False) is None
