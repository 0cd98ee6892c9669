"""Plan + PrimGraph in, Program (kernel IR, launch list, memory plan) out.

Each group becomes one kernel; GLOBAL_SYNC edges split it into segments (grid barriers); inside a
segment, regions propagate back from the anchor's tile, REGISTER producers (elementwise/layout) are
inlined into their consumers, everything else becomes a phase writing a BLOCK and/or GLOBAL buffer.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from engine.codegen.conv import conv_dot_products, conv_form, conv_of
from engine.codegen.ctarget import c_decisions, c_lanes
from engine.codegen.kexpr import (
    Guard,
    InBounds,
    Inlined,
    Reduce,
    free_vars,
    kchildren,
    kmap,
    kwalk,
    map_indices,
    substitute_body,
)
from engine.codegen.kir import Buffer, Gemm, Kernel, Launch, Phase, Program, Region, Scope, Segment, Span
from engine.codegen.micro import MicroBudget, micro_budget, scalar_staging, stage_gemms
from engine.codegen.mma import fma_only, tensor_core_options, use_tensor_cores
from engine.device import Device, get_device, wave_grid
from engine.errors import CompileError, PlanError, ShapeError
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import PrimGraph, Stage, StageKind
from engine.memo import memo
from engine.runtime.memory import plan_memory
from engine.schedule.plan import Conn, Group, Plan, Tile, plan_to_json
from engine.tilegraph.propagate import Box, propagate_many
from engine.tilegraph.tilegraph import inner_edges, tensor_shapes

_INLINE_KINDS = (StageKind.ELEMENTWISE, StageKind.LAYOUT)
INDEX_LIMIT = 2**31 - 1  # kernels compute element offsets in C `int`
TARGETS = ("cuda", "c")  # generate(): the CUDA program at the plan's tiles, or the C target's


def check_index_range(graph: PrimGraph) -> None:
    """Refuse a graph with a tensor too large for the kernels' 32-bit offsets (before planning: tiling a
    tensor of billions of elements would also take the planner minutes)."""
    big = next((t for t in graph.specs.values() if t.size > INDEX_LIMIT), None)
    if big is not None:
        raise ShapeError(f"tensor '{big.name}' has {big.size:,} elements: generated kernels index with 32-bit "
                         f"ints (at most {INDEX_LIMIT:,})", hint="bind smaller shapes with --shape, or run it "
                         "with --backend reference")


def generate(plan: Plan, graph: PrimGraph, device: Device | str = "a100", target: str = "cuda") -> Program:
    """Realise every group of `plan` as a kernel; refuses a plan for another model or one whose
    groups do not match its edges. `target="c"` with a GPU device first coarsens blocks
    (`coarsen.coarsen_for_c`: a CPU block is an OpenMP iteration; a plan for the host CPU holds those
    tiles already); the Program keeps the hash of the plan it was given."""
    device = get_device(device) if isinstance(device, str) else device
    if plan.model_hash != graph.structural_hash:
        raise PlanError(f"plan is for model hash {plan.model_hash}, not {graph.structural_hash}",
                        hint="re-plan this model")
    low = next((t for t in graph.specs.values() if t.dtype.is_low_float and t.dtype != DType.BF16), None)
    if low is not None:
        raise CompileError(f"tensor '{low.name}' is {low.dtype.value}: kernels are generated for bfloat16, "
                           "float16/32/64, integer and bool tensors only (float8 has no printer spelling)",
                           hint="run this model with --backend reference")
    check_index_range(graph)
    conns = {e.key: e.conn for e in plan.edges}
    missing = [e for e in graph.edges if e not in conns]
    if missing:
        raise PlanError(f"plan has no connection for edge {missing[0][0]} -> {missing[0][1]}")
    if target not in TARGETS:
        raise CompileError(f"unknown target '{target}' (choose one of {', '.join(TARGETS)})")
    given, built = plan, {}
    if target == "c" and device.kind != "cpu":
        # A GPU's plan translated for the CPU (a plan for the host has its CPU tiles already:
        # schedule.build.coarsen_plan).
        from engine.codegen.coarsen import coarsen_for_c

        plan = coarsen_for_c(plan, graph, device, built)
    kernels, launches = [], []
    for group in launch_order(plan, graph):
        with tensor_core_options(dict(given.options)):
            kernel = built.get(group.name) or build_kernel(group, graph, conns, device)
        if target == "c":
            lanes = c_lanes(device)
            kernel = c_decisions(conv_dot_products(fma_only(scalar_staging(kernel)), lanes), lanes)
        if kernel.shared_bytes > device.max_smem_per_block_bytes:
            raise PlanError(f"group {group.name}: block buffers need {kernel.shared_bytes} B of shared memory, "
                            f"over the {device.max_smem_per_block_bytes} B a block may use on {device.name}",
                            hint="use a smaller tile or connect an edge at KERNEL")
        kernels.append(kernel)
        launches.append(_launch(kernel, device))
    memory = _memory(graph, kernels)
    return Program(
        name=graph.name, model_hash=graph.structural_hash,
        plan_hash=_plan_hash(given), policy=given.policy, device=device.name,
        kernels=tuple(kernels), launches=tuple(launches), memory=memory,
        inputs=tuple(t.name for t in graph.inputs), constants=tuple(t.name for t in graph.constants),
        outputs=graph.outputs, output_names=graph.output_names,
    )


def launch_order(plan: Plan, graph: PrimGraph) -> list[Group]:
    """Groups in a topological order of their dependencies (plan order among ready groups): a group
    is listed by its first stage, which need not come after every group it reads from."""
    of = {s: g.id for g in plan.groups for s in g.stages}
    deps = {g.id: {of[p] for p, c in graph.edges if c in g.stages and of[p] != g.id} for g in plan.groups}
    order, done = [], set()
    while len(order) < len(plan.groups):
        ready = [g for g in plan.groups if g.id not in done and deps[g.id] <= done]
        if not ready:
            raise PlanError("kernel groups depend on each other in a cycle", hint="run validate on the plan")
        order.append(ready[0])
        done.add(ready[0].id)
    return order


def _plan_hash(plan: Plan) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(plan_to_json(plan), sort_keys=True).encode()).hexdigest()[:16]


def _launch(kernel: Kernel, device: Device, registers: int = 0) -> Launch:
    """The kernel's launch on `device`. A grid barrier needs every block resident at once, so a
    cooperative kernel's grid is capped to one wave (its blocks loop over the tiles). `registers` per
    thread are the compiled count (`api.fit_launches` passes it after NVRTC); 0 before compiling, when
    threads and shared memory alone cap the grid. On a GPU the launcher re-caps it with the driver's
    occupancy for the attached device."""
    grid = kernel.ntiles
    if kernel.cooperative:
        grid, why = wave_grid(device, kernel.ntiles, kernel.threads, registers, kernel.shared_bytes)
        if grid == 0:
            raise PlanError(f"kernel {kernel.name} cannot run on {device.name}: {why}")
    args = tuple(b.tensor for b in kernel.params)
    return Launch(kernel.name, grid, kernel.threads, kernel.shared_bytes, kernel.cooperative, args)


def _memory(graph: PrimGraph, kernels: list[Kernel]):
    external = {t.name for t in graph.inputs} | {t.name for t in graph.constants} | set(graph.outputs)
    live: dict[str, list[int]] = {}
    for k, kernel in enumerate(kernels):
        for b in kernel.params:
            if b.tensor not in external:
                span = live.setdefault(b.tensor, [k, k])
                span[1] = k
    return plan_memory([(t, graph.specs[t].nbytes, a, b) for t, (a, b) in live.items()])


# ---- one group ---------------------------------------------------------------------------------


def _ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _block_name(stage: str) -> str:
    """The block buffer a segment keeps `stage` in for its consumers there."""
    return f"s_{_ident(stage)}"


def _segments(group: Group, graph: PrimGraph, conns) -> list[tuple[Tile, list[str]]]:
    """Split the group by its GLOBAL_SYNC edges; pair each part with its tile; order producers first."""
    members = set(group.stages)
    parent = {s: s for s in group.stages}

    def find(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for (p, c), conn in conns.items():
        if p in members and c in members and conn in (Conn.REGISTER, Conn.SHARED):
            parent[find(p)] = find(c)
    parts: dict[str, list[str]] = {}
    for s in group.stages:
        parts.setdefault(find(s), []).append(s)
    by_stage = {t.stage: t for t in group.segments}
    out = []
    for names in parts.values():
        tiles = [by_stage[s] for s in names if s in by_stage]
        if len(tiles) != 1:
            raise PlanError(f"group {group.name}: segment {{{', '.join(names)}}} has {len(tiles)} tiles, "
                            "needs exactly one (its anchor)", hint="give each GLOBAL_SYNC-separated part one Tile")
        out.append((tiles[0], names))
    # Topological order of segments: a segment runs after every segment feeding it.
    order, done = [], set()
    while len(order) < len(out):
        progressed = False
        for tile, names in out:
            if tile.stage in done:
                continue
            deps = {p for (p, c) in conns if c in names and p in members and p not in names}
            if all(any(d in n for t2, n in out if t2.stage in done) for d in deps):
                order.append((tile, names))
                done.add(tile.stage)
                progressed = True
        if not progressed:
            raise PlanError(f"group {group.name}: its segments depend on each other in a cycle")
    return order


def build_kernel(group: Group, graph: PrimGraph, conns, device: Device | None = None,
                 sample: bool | Mapping = False) -> Kernel:
    """One group's kernel; without room in the device's shared memory to stage GEMM/conv tiles, the
    contractions keep per-element loops (the same values, computed once, at a slower rate).
    `sample`: each segment realised at one typical tile only (`tilegraph.typical_index`: interior where
    the grid allows), that box standing for every tile of the grid (the cost model counts this;
    `generate` never uses it) — a mapping gives that tile's region
    per stage, propagated already (one-segment groups). GEMMs go to tensor cores where the device has
    them and the plan option `tf32` in force allows (`mma.use_tensor_cores`)."""
    device = device or get_device("a100")
    budget = micro_budget(device)
    kernel = use_tensor_cores(stage_gemms(_build_kernel(group, graph, conns, budget, sample=sample), device), device)
    if kernel.shared_bytes > device.max_smem_per_block_bytes and (kernel.gemms or kernel.convs):
        kernel = _build_kernel(group, graph, conns, budget, tiled=False, sample=sample)
    return kernel


def _build_kernel(group: Group, graph: PrimGraph, conns, budget: MicroBudget, tiled: bool = True,
                  sample: bool | Mapping = False) -> Kernel:
    members = set(group.stages)
    params: dict[str, Buffer] = {}
    locals_: list[Buffer] = []
    segments = []
    threads = max(t.threads for t in group.segments)
    for tile, names in _segments(group, graph, conns):
        if sample is not False and not params and not locals_:
            seg = _sampled_segment(tile, names, graph, conns, members, params, locals_, group.name, sample)
        else:
            seg = _build_segment(tile, names, graph, conns, members, params, locals_, group.name, sample)
        if tiled:
            seg = _map_conv(_map_gemm(seg, tile, threads, graph, budget), threads, graph)
        segments.append(seg)
    segments = [_map_lanes(seg, threads) for seg in segments]
    origin = tuple(dict.fromkeys(o for s in group.stages for o in graph.stage(s).origin))
    return Kernel(group.name, tuple(params.values()), tuple(locals_), tuple(segments), threads,
                  tuple(group.stages), origin)


def _map_lanes(seg: Segment, threads: int) -> Segment:
    """Lanes per row for each reduction phase: the block's threads spread over the rows of the phase's
    region (a power of two up to the block: within a warp the lanes combine with shuffles, across warps
    through a shared-memory tree). Float sum/max/min/prod only."""
    phases = []
    for p in seg.phases:
        lanes = 1
        if p.combine is not None and p.gemm is None and p.conv is None and not p.region.flat and p.dtype.is_float and threads % 32 == 0 \
                and p.combine.value in ("sum", "max", "min", "prod"):
            rows = math.prod(p.region.extent)
            want = max(1, threads // max(rows, 1))
            while lanes * 2 <= min(threads, want, math.prod(p.reduce)):
                lanes *= 2
        phases.append(dataclasses.replace(p, threads_per_row=lanes))
    return dataclasses.replace(seg, phases=tuple(phases))


def _map_gemm(seg: Segment, tile: Tile, threads: int, graph: PrimGraph, budget: MicroBudget) -> Segment:
    """Phases whose contraction is a product of a (rows x k) and a (k x cols) factor over the last two
    axes of a region that is one element wide in every other axis become tiled GEMMs, their micro-tile
    within the device's accumulator budget and their k step within its staging budget."""
    step = 1
    for r in tile.reduce_step:
        step *= r
    # The plan's mapping where it is one of this block's (a segment of a kernel whose block is another
    # segment's larger one runs the default for that block, as its thread count is that block's too).
    shape = tile.thread_shape if len(tile.thread_shape) == 2 and math.prod(tile.thread_shape) == threads else ()
    phases = []
    for p in seg.phases:
        gemm = _gemm_of(p, graph, threads, step if tile.reduce_step else 32, budget, shape)
        phases.append(dataclasses.replace(p, gemm=gemm) if gemm else p)
    return dataclasses.replace(seg, phases=tuple(phases))


def _map_conv(seg: Segment, threads: int, graph: PrimGraph) -> Segment:
    """Phases (not already GEMMs) whose contraction reads its input through sliding windows become
    direct convolutions (engine/codegen/conv.py)."""
    phases = []
    for p in seg.phases:
        found = None if p.gemm is not None or p.region.flat else _contraction_of(p, graph, repeated=True)
        conv = conv_of(p, found, _factors(found[1]) if found else None, threads) if found else None
        phases.append(dataclasses.replace(p, conv=conv) if conv else p)
    return dataclasses.replace(seg, phases=tuple(phases))


def _top_reduces(body) -> list[Reduce]:
    """Inlined reductions not nested in a guard or another reduction (evaluated once per element)."""
    found, stack = [], [body]
    while stack:
        n = stack.pop()
        if isinstance(n, Reduce):
            found.append(n)
        elif not isinstance(n, Guard):
            stack.extend(kchildren(n))
    return found


def _contraction_of(p: Phase, graph: PrimGraph, repeated: bool = False) -> tuple | None:
    """(target, summand, reduce vars, extents) of the phase's sum of products: the phase itself (a
    contraction stage) or the one such sum inlined at the top of its body (target: that Reduce). With
    `repeated`, the one sum may occur several times (SiLU: c * sigmoid(c)); the printers and the count
    replace every occurrence by the accumulator. The direct convolution asks for that; the GEMM does not
    yet: a GELU epilogue taken as the GEMM's moved the welder plans of bert and convnext (a100 preset) to
    tiles whose C ran 1.6-4x slower (benchmarks/NOTES.md)."""
    if p.combine is not None:
        if graph.stage(p.stage).kind != StageKind.CONTRACTION or p.combine.value != "sum":
            return None
        return None, p.body, tuple(f"r{k}" for k in range(len(p.reduce))), p.reduce
    tops = _top_reduces(p.body)
    found = [r for r in (dict.fromkeys(tops) if repeated else tops)
             if r.combine.value == "sum" and _factors(r.body) is not None]
    if len(found) != 1:
        return None
    return found[0], found[0].body, found[0].vars, found[0].extents


def _gemm_of(p: Phase, graph: PrimGraph, threads: int, step: int, budget: MicroBudget,
             thread_shape: tuple[int, ...] = ()) -> Gemm | None:
    region = p.region
    if region.flat or region.rank < 2 or not p.dtype.is_float:
        return None
    rows = gemm_rows(region.extent)
    operands = _operands_at(p, graph, region.rank, rows)
    if operands is None:
        return None
    target, names, extents, a, b = operands
    bm, bn = math.prod(region.extent[region.rank - 1 - rows:region.rank - 1]), region.extent[-1]
    k = math.prod(extents)
    bk = max(1, min(step, k))
    tm, tn, tx, ty = gemm_split(bm, bn, threads, thread_shape)
    if tm * tn > budget.accumulators or threads % tx:
        return None
    while bk > 4 and 4 * bk * (ty * tm + tx * tn) > budget.stage_bytes:
        bk //= 2
    if 4 * bk * (ty * tm + tx * tn) > budget.stage_bytes:
        return None
    return Gemm(a, b, target, tuple(names), tuple(extents), bm, bn, bk, tm, tn, tx, ty, rows)


def gemm_rows(extent: Sequence[int]) -> int:
    """How many axes `_gemm_of` flattens into a GEMM's rows over a region of `extent`: from the first axis
    wider than one before the last two (one where every such axis is one wide) to the one before the last."""
    wide = [d for d in range(len(extent) - 2) if extent[d] != 1]
    return len(extent) - 1 - wide[0] if wide else 1


def _operands_at(p: Phase, graph: PrimGraph, rank: int, rows: int) -> tuple | None:
    """`_gemm_operands`, memoised. Which factor is A and which B depends on the phase's body and the axes
    alone, not on the tile: the tile search asks for it once per candidate tile. Keyed per model, as the
    bodies are (`_resolve`): the factors come back as objects of the first body, and the work count
    memoises per object."""
    key = (graph.structural_hash, p.body, graph.stage(p.stage).kind, p.combine, p.reduce, rank, rows)
    return memo("generate.gemm_operands", 20000).lookup(key, lambda: _gemm_operands(p, graph, rank, rows))


def may_tile(graph: PrimGraph, stage: str, body: E.Expr, extent: Sequence[int]) -> bool:
    """Whether a phase computing `stage` with the resolved `body` (`resolved_body`) over a box region of
    `extent` may run its sum of products as a tiled GEMM (`_gemm_of`) or a direct convolution (`_map_conv`)
    under some block and k step. False where its dtype, the region's rank and one-wide axes and the body
    alone rule both out: the kernel IR then counts its multiply-adds as per-element flops, which the cost
    model's floor charges at a per-element rate (engine/schedule/floor.py `work_floor`)."""
    st = graph.stage(stage)
    if not st.dtype.is_float or len(extent) < 2:
        return False
    p = Phase(stage, st.dtype, body, None, (), st.reduce, st.combine)
    if _operands_at(p, graph, len(extent), gemm_rows(extent)) is not None:
        return True
    if len(extent) != 4 or extent[0] != 1:
        return False
    found = _contraction_of(p, graph, repeated=True)
    return found is not None and conv_form(found, _factors(found[1])) is not None


def resolved_body(graph: PrimGraph, stage: str, inline: set[str], buffered: Collection[str]) -> E.Expr:
    """The body a phase of `stage` computes in a segment whose stages in `inline` are inlined and in
    `buffered` kept in block buffers (`_build_segment`'s `_resolve`, from the same memo)."""
    return _resolve(graph.stage(stage), graph, inline, {t: _block_name(t) for t in buffered}, {})


def micro_tile(bm: int, bn: int, threads: int) -> tuple[int, int, int, int]:
    """(tm, tn, tx, ty): the block's threads as tx (a power of two) x ty over a bm x bn GEMM tile, each
    with a tm x tn micro-tile, the fewest accumulators per thread (then the fewest operand loads)."""
    best = None
    tx = 1
    while tx <= threads:
        ty = threads // tx
        tm, tn = -(-bm // ty), -(-bn // tx)
        key = (tm * tn, tm + tn)
        if best is None or key < best[0]:
            best = (key, tm, tn, tx, ty)
        tx *= 2
    return best[1:]


def gemm_split(bm: int, bn: int, threads: int, thread_shape: tuple[int, ...] = ()) -> tuple[int, int, int, int]:
    """(tm, tn, tx, ty) of a bm x bn GEMM tile on `threads`: the recorded (ty, tx) of a Tile's
    `thread_shape`, or `micro_tile`'s default when none is recorded."""
    if not thread_shape:
        return micro_tile(bm, bn, threads)
    ty, tx = thread_shape[-2:]
    return -(-bm // ty), -(-bn // tx), tx, ty


def thread_splits(bm: int, bn: int, threads: int, accumulators: int) -> list[tuple[int, int]]:
    """The (ty, tx) mappings of `threads` over a bm x bn GEMM tile worth searching: tx a power of two
    dividing `threads`, tm x tn accumulators within the register budget, and no mapping another beats
    or ties on every term the model charges for it (accumulators: registers and occupancy; tm + tn
    shared-memory operand loads per k; ty * tm + tx * tn staged rows and columns: shared bytes). The
    default (`micro_tile`) first. Power-of-two tiles on power-of-two blocks have one such mapping (the
    square-most); a padded extent (197 tokens) trades registers against loads."""
    tm0, tn0, tx0, ty0 = micro_tile(bm, bn, threads)
    out: list[tuple[tuple[int, int, int], tuple[int, int]]] = []
    tx = 1
    while tx <= threads:
        if threads % tx == 0:
            ty = threads // tx
            tm, tn = -(-bm // ty), -(-bn // tx)
            if tm * tn <= accumulators or (ty, tx) == (ty0, tx0):
                out.append(((tm * tn, tm + tn, ty * tm + tx * tn), (ty, tx)))
        tx *= 2
    out.sort(key=lambda x: x[1] != (ty0, tx0))  # the default first: it stands for its ties
    front: list[tuple[int, int]] = []
    kept: list[tuple[int, int, int]] = []
    for key, m in out:
        beaten = any(o != key and all(a <= b for a, b in zip(o, key)) for o, _ in out)
        if m == (ty0, tx0) or (not beaten and key not in kept):
            front.append(m)
            kept.append(key)
    return front


def _gemm_operands(p: Phase, graph: PrimGraph, rank: int, rows: int) -> tuple | None:
    """(target, reduce vars, extents, A, B) of a phase whose contraction is a (rows x k) by (k x cols)
    product over its last axes (`rows` of them flattened into the rows), else None."""
    found = _contraction_of(p, graph)
    if found is None:
        return None
    target, body, names, extents = found
    split = _factors(body)
    if split is None:
        return None
    ms, n = {f"i{d}" for d in range(rank - 1 - rows, rank - 1)}, f"i{rank - 1}"
    a, b = split
    if n in free_vars(a) or ms & free_vars(b):
        a, b = b, a
    if n in free_vars(a) or ms & free_vars(b):
        return None
    if any(isinstance(x, Reduce) for x in kwalk(b)) or not _row_invariant(a, tuple(names)):
        return None
    return target, names, extents, a, b


def _factors(body) -> tuple[E.Expr, E.Expr] | None:
    """A float product of two factors."""
    if not (isinstance(body, E.Binary) and body.op == "mul" and body.dtype.is_float):
        return None
    return body.a, body.b


def _row_invariant(e, kvars: tuple[str, ...]) -> bool:
    """Every inlined reduction in `e` sits inside one that is independent of the k variables and not
    under a pad guard: it is computed once per staged row (a LayerNorm's mean feeding a GEMM)."""
    top = _top_reduces(e)
    if any(free_vars(r) & set(kvars) for r in top):
        return False
    inside = {id(x) for r in top for x in kwalk(r) if isinstance(x, Reduce)}
    return all(id(x) in inside for x in kwalk(e) if isinstance(x, Reduce))


def _global(params: dict[str, Buffer], graph: PrimGraph, tensor: str) -> str:
    if tensor not in params:
        spec = graph.specs[tensor]
        params[tensor] = Buffer(f"g_{_ident(tensor)}", tensor, spec.dtype, spec.shape, Scope.GLOBAL)
    return params[tensor].name


def _tile_arrays(stage: Stage, tile: Tile, first_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every tile's box of `stage` (or the typical tile's alone) as (lo, hi) rows in np.ndindex order."""
    if len(tile.shape) != len(stage.shape) or any(t <= 0 for t in tile.shape):
        raise PlanError(f"tile {list(tile.shape)} does not fit stage {stage.name} of shape {list(stage.shape)}")
    tiles = tuple(-(-n // t) for n, t in zip(stage.shape, tile.shape))
    if first_only:  # the tile standing for all
        from engine.tilegraph.tilegraph import typical_index

        coords = np.array([typical_index(stage.shape, tile.shape)], dtype=np.int64).reshape(1, len(tiles))
    elif not tiles:  # a scalar stage: one tile
        coords = np.zeros((1, 0), dtype=np.int64)
    else:
        coords = np.indices(tiles, dtype=np.int64).reshape(len(tiles), -1).T
    lo = coords * np.array(tile.shape, dtype=np.int64)
    return lo, np.minimum(lo + np.array(tile.shape, dtype=np.int64), np.array(stage.shape, dtype=np.int64))


def _hull_many(a: tuple | None, b: tuple) -> tuple:
    """Row-wise hull of two sets of boxes (`propagate_many`'s rows; a row with hi <= lo has none)."""
    if a is None:
        return b
    (alo, ahi), (blo, bhi) = a, b
    ina, inb = np.all(ahi > alo, axis=1)[:, None], np.all(bhi > blo, axis=1)[:, None]
    both = ina & inb
    lo = np.where(both, np.minimum(alo, blo), np.where(ina, alo, blo))
    hi = np.where(both, np.maximum(ahi, bhi), np.where(ina, ahi, bhi))
    return lo, hi


def _sampled_segment(tile, names, graph, conns, members, params, locals_, gname, sample) -> Segment:
    """`_build_segment` of a kernel's first segment realised at one sampled tile, memoised: its phases
    depend on the tile's anchor and shape, not on its threads (mapped onto them afterwards), and the
    tile search costs each shape under several thread counts. Fills `params` and `locals_` as the
    build would."""
    boxes = tuple(sorted(sample.items())) if isinstance(sample, Mapping) else sample
    key = (graph.structural_hash, tuple(names), inner_edges(graph, names, conns), tile.stage, tile.shape, boxes)
    seg, buffers, blocks = memo("generate.sampled_segments", 20000).lookup(key, lambda: _built_alone(
        tile, names, graph, conns, members, gname, sample))
    params.update(buffers)
    locals_.extend(blocks)
    return seg


def _built_alone(tile, names, graph, conns, members, gname, sample) -> tuple:
    params: dict[str, Buffer] = {}
    locals_: list[Buffer] = []
    seg = _build_segment(tile, names, graph, conns, members, params, locals_, gname, sample)
    return seg, tuple(params.items()), tuple(locals_)


def _build_segment(tile, names, graph, conns, members, params, locals_, gname, sample=False) -> Segment:
    """One segment's phases: every stage computed once per element of its region per tile, in a phase
    of its own (stored to a block buffer for in-segment consumers, to global memory for the others), or
    — every in-segment consumer connected at REGISTER and nothing outside reading it — inlined into
    its consumers' expressions (validate bounds how often that evaluates it: a reduction once)."""
    anchor = graph.stage(tile.stage)
    seg = set(names)
    local_cons = {s: [c for c in graph.consumers.get(s, ()) if c in seg] for s in names}
    needs_global = {s: s in graph.outputs or any(c not in seg for c in graph.consumers.get(s, ())) for s in names}
    inline = {s for s in names if s != anchor.name and not needs_global[s]
              and all(conns[(s, c)] == Conn.REGISTER for c in local_cons[s])}
    for s in names:
        if s != anchor.name and not local_cons[s] and not needs_global[s]:
            raise PlanError(f"group {gname}: stage {s} feeds nothing in its segment or outside it")

    # Regions per tile, propagated back from the anchor (union over in-segment consumers).
    tiles = tuple(-(-n // t) for n, t in zip(anchor.shape, tile.shape))
    ntiles = math.prod(tiles)
    if isinstance(sample, Mapping):  # the typical tile's regions, propagated by the caller already
        zero = {s: tuple((0, 0) for _ in graph.stage(s).shape) for s in names}
        tables = {s: [sample.get(s) or zero[s]] for s in names}
    else:
        # Consumers come after their producers in `names`: walking it backwards, a stage's region is
        # whole (every in-segment consumer has read from it) before it is propagated to the boxes it
        # reads of its in-segment producers — for every tile at once (`propagate_many`), or the
        # typical tile alone when `sample` is True.
        local_prods = {c: [s for s in dict.fromkeys(graph.stage(c).inputs) if s in seg and s != c] for c in names}
        region: dict[str, tuple | None] = {s: None for s in names}
        region[anchor.name] = _tile_arrays(anchor, tile, first_only=bool(sample))
        for c in reversed(names):
            if region[c] is None or not local_prods[c]:
                continue
            reads = propagate_many(graph.stage(c), region[c], tensor_shapes(graph))
            for s in local_prods[c]:
                region[s] = _hull_many(region[s], reads[s])
        arrays = {}
        for s in names:  # a tile reading nothing of s: the empty box at the origin
            rank, n = len(graph.stage(s).shape), 1 if sample else ntiles
            if region[s] is None:
                arrays[s] = (np.zeros((n, rank), np.int64), np.zeros((n, rank), np.int64))
            else:
                rlo, rhi = region[s]
                ok = np.all(rhi > rlo, axis=1)[:, None]
                arrays[s] = (np.where(ok, rlo, 0), np.where(ok, rhi, 0))
        # Per-tile boxes as tuples, for the stages `_covers` and `_owned` look at (not the anchor: its tiles
        # cover it, and it feeds nothing in the segment) — a large grid makes thousands of them.
        listed = names if sample else [s for s in names if needs_global[s] and (s != anchor.name or local_cons[s])]
        tables = {s: [tuple(zip(a, b)) for a, b in zip(arrays[s][0].tolist(), arrays[s][1].tolist())] for s in listed}

    if sample:  # one box stands for every tile of the grid
        zeros = (0,) * len(tiles)
        regions = {s: Region(graph.stage(s).shape, tiles, tuple(Span(lo, hi - lo, zeros) for lo, hi in tables[s][0]))
                   for s in names if s not in inline}
    else:
        regions = {s: fit_region(graph.stage(s).shape, tiles, arrays[s]) for s in names if s not in inline}
    # A stage read outside the segment whose tiles do not cover it (the anchor reads only part of it)
    # gets a completion phase: each block recomputes its flat share of the whole tensor from globals.
    partial = [s for s in names if s != anchor.name and needs_global[s]
               and not (_sample_covers(graph, names, conns, tile, s, tables[s][0], ntiles, inline) if sample
                        else _covers(graph.stage(s), tables[s]))]

    block_buf: dict[str, str] = {}
    phases = []
    for s in names:
        if s in inline:
            continue
        stage = graph.stage(s)
        stores = []
        if local_cons[s]:
            buf = Buffer(_block_name(s), s, stage.dtype, stage.shape, Scope.BLOCK, regions[s])
            locals_.append(buf)
            block_buf[s] = buf.name
            stores.append(buf.name)
        if needs_global[s] and s not in partial:
            stores.append(_global(params, graph, s))
        if not stores:
            continue
        body = _resolve(stage, graph, inline, block_buf, params)
        owned = _owned(stage, regions[s], tables[s], ntiles, sample) if needs_global[s] and local_cons[s] else None
        phases.append(Phase(s, stage.dtype, body, regions[s], tuple(stores), stage.reduce, stage.combine,
                            owned=owned))
    for s in partial:
        stage = graph.stage(s)
        body = _resolve(stage, graph, set(names) - {s}, {}, params)
        boxes = _chunk_boxes(stage.shape, ntiles)
        region = fit_region(stage.shape, tiles, boxes) if boxes else None
        region = region or Region(stage.shape, tiles, flat=-(-stage.size // ntiles))
        phases.append(Phase(s, stage.dtype, body, region, (_global(params, graph, s),), stage.reduce,
                            stage.combine))
    return Segment(anchor.name, ntiles, tuple(phases))


def _chunk_boxes(shape: tuple[int, ...], ntiles: int) -> list[Box] | None:
    """Tile t's row-major chunk [t*size/ntiles, (t+1)*size/ntiles) of a tensor as a box, for every t,
    when the chunks are boxes (whole trailing axes and an equal part of the next): a stage completed
    in chunks is then a box region, which the GEMM path can take (swin's batched QKV projection was
    completed element by element: 1.2 of the welder program's 3.9 ms). None otherwise."""
    size = math.prod(shape)
    if not shape or ntiles < 1 or size % ntiles:
        return None
    flat, inner, d = size // ntiles, 1, len(shape) - 1
    while d >= 0 and flat % (inner * shape[d]) == 0:
        inner *= shape[d]
        d -= 1
    if d < 0:
        return [tuple((0, n) for n in shape)] if ntiles == 1 else None
    part = flat // inner
    if shape[d] % part:
        return None
    boxes = []
    for t in range(ntiles):
        at = np.unravel_index(t * flat, shape)
        boxes.append(tuple((int(at[k]), int(at[k]) + 1) if k < d else (int(at[k]), int(at[k]) + part) if k == d
                           else (0, n) for k, n in enumerate(shape)))
    return boxes


def _owned(stage: Stage, region: Region, boxes: list[Box], ntiles: int, sample) -> Region | None:
    """The part of each tile's region it alone writes to global memory, where the regions of the tiles
    overlap (each element by the first tile whose region holds it); None where they do not overlap. A
    sampled segment gets a flat region of size/ntiles per tile: the same count of stores."""
    from engine.codegen.count import region_extents

    size = stage.size
    if sample:
        live = float(np.prod(region_extents(region), axis=1).sum())
        return Region(stage.shape, region.tiles, flat=-(-size // ntiles)) if live > size else None
    if sum(math.prod(hi - lo for lo, hi in b) for b in boxes) <= size or not stage.shape:
        return None  # no overlap; or a scalar, which every tile stores (the same value: no box says "none of it")
    covered = np.zeros(stage.shape, dtype=bool)
    owned = []
    for b in boxes:
        view = covered[tuple(slice(lo, hi) for lo, hi in b)]
        mine = ~view
        if mine.all():
            owned.append(b)
        elif not mine.any():
            owned.append(tuple((lo, lo) for lo, _ in b))
        else:
            where = np.nonzero(mine)
            sub = tuple((int(w.min()), int(w.max()) + 1) for w in where)
            if int(mine.sum()) != math.prod(hi - lo for lo, hi in sub):
                return None  # not a box: every tile stores its whole region (the same values)
            owned.append(tuple((lo + a, lo + c) for (lo, _), (a, c) in zip(b, sub)))
        view[...] = True
    return fit_region(stage.shape, region.tiles, owned)  # spans, or a table where they are not affine


def _sample_covers(graph: PrimGraph, names, conns, tile: Tile, stage: str, box, ntiles: int, inline) -> bool:
    """Coverage for a sampled segment (one tile's box standing for all): the tiles cannot cover more
    than their boxes add up to; when they add up to the tensor, exact propagation makes a gap unlikely,
    so only a stage computing a contraction (costly to finish twice) is checked tile by tile."""
    if math.prod(hi - lo for lo, hi in box) * ntiles < graph.stage(stage).size:
        return False
    seen, todo = set(), [stage]
    while todo:  # does the stage carry a contraction (itself or inlined into it)?
        s = todo.pop()
        if s in seen:
            continue
        seen.add(s)
        if graph.stage(s).kind == StageKind.CONTRACTION:
            return covers(graph, names, conns, tile, stage)
        todo += [p for p in graph.stage(s).inputs if p in inline]
    return True


def covers(graph: PrimGraph, names, conns, tile: Tile, stage: str) -> bool:
    """Whether the blocks' regions of `stage` together cover the whole tensor under `tile` — every
    block's region propagated from its own anchor tile (memoised: the cost model asks per candidate)."""
    from engine.tilegraph.tilegraph import anchor_box, propagate_group

    members = set(names)
    inner = tuple((p, c, str(conns.get((p, c)))) for p in names for c in graph.consumers.get(p, ()) if c in members)
    key = (graph.structural_hash, tuple(names), inner, tile.stage, tile.shape, stage)
    table = memo("generate.covers", 50000)
    hit = table.get(key)
    if hit is None:
        anchor = graph.stage(tile.stage)
        # Only the stages between `stage` and the anchor shape its region.
        down, todo = {stage}, [stage]
        while todo:
            for c in graph.consumers.get(todo.pop(), ()):
                if c in members and c not in down:
                    down.add(c)
                    todo.append(c)
        names = [n for n in names if n in down]
        counts = [-(-d // t) for d, t in zip(anchor.shape, tile.shape)]
        first = propagate_group(graph, names, conns, tile.stage, anchor_box(anchor.shape, tile.shape))
        box = first.stages.get(stage)
        hit = box is not None and first.exact and math.prod(hi - lo for lo, hi in box) * math.prod(counts) \
            == math.prod(graph.stage(stage).shape) and _first_is_translate(anchor, tile, box, graph.stage(stage))
        if not hit:
            hit = _covered_by_spans(graph, names, conns, tile, stage)
        if hit is None:
            mask = np.zeros(graph.stage(stage).shape, dtype=bool)
            for index in np.ndindex(*counts):
                b = propagate_group(graph, names, conns, tile.stage,
                                    anchor_box(anchor.shape, tile.shape, index)).stages.get(stage)
                if b is not None:
                    mask[tuple(slice(lo, hi) for lo, hi in b)] = True
            hit = bool(mask.all())
        table.put(key, hit)
    return hit


def _covered_by_spans(graph: PrimGraph, names, conns, tile: Tile, stage: str) -> bool | None:
    """Coverage from the stage's regions fitted to a few tiles, where each of its axes moves with at
    most one tile axis and no tile axis moves two of them: the union of the tiles' boxes is then, per
    axis, the union of that axis's intervals (covered when they start at 0, leave no gap and reach
    the end). None when the regions do not have that form (the caller checks tile by tile)."""
    from engine.tilegraph.tilegraph import anchor_box, propagate_group

    anchor = graph.stage(tile.stage)
    st = graph.stage(stage)
    tiles = tuple(-(-n // t) for n, t in zip(anchor.shape, tile.shape))
    coords = _sample_coords(tiles)
    boxes = []
    for tc in coords:
        b = propagate_group(graph, names, conns, tile.stage, anchor_box(anchor.shape, tile.shape, tc)).stages.get(stage)
        if b is None:
            return None
        boxes.append(b)
    region = fit_region(st.shape, tiles, boxes, coords)
    if region is None:
        return None
    used = [k for sp in region.spans for k, c in enumerate(sp.coeffs) if c]
    if len(used) != len(set(used)) or any(sum(1 for c in sp.coeffs if c) > 1 for sp in region.spans):
        # Axes moving together: paint every tile's box (from the fitted spans, no propagation).
        from engine.codegen.count import region_bounds_of

        lo, hi = region_bounds_of(region)
        mask = np.zeros(st.shape, dtype=bool)
        for a, b in zip(lo.tolist(), hi.tolist()):
            mask[tuple(slice(x, y) for x, y in zip(a, b))] = True
        return bool(mask.all())
    for d, sp in enumerate(region.spans):
        k = next((k for k, c in enumerate(sp.coeffs) if c), None)
        n = tiles[k] if k is not None else 1
        step = sp.coeffs[k] if k is not None else 0
        if sp.base > 0 or step > sp.ext or sp.base + step * (n - 1) + sp.ext < st.shape[d]:
            return False
    return True


def _first_is_translate(anchor: Stage, tile: Tile, box, stage: Stage) -> bool:
    """The cheap coverage test holds only when the stage's box is the anchor's tile itself (same
    shape, same box): then the tiles partition it."""
    return stage.shape == anchor.shape and tuple(hi - lo for lo, hi in box) == tuple(
        min(t, n) for t, n in zip(tile.shape, anchor.shape))


def fit_region(shape: tuple[int, ...], tiles: tuple[int, ...], boxes: list[Box] | tuple[np.ndarray, np.ndarray],
               coords: list[tuple[int, ...]] | None = None) -> Region | None:
    """Express per-tile boxes (a list, or (lo, hi) arrays with a row per tile) as affine spans of the
    tile coordinates (clamped to the tensor) when they are; else keep the explicit table. With
    `coords`, `boxes` are those tiles' only (the first, the second along each axis, the last...):
    spans fitted to them stand for the grid (None when they are not affine)."""
    sampled = coords is not None
    rank = len(shape)
    if isinstance(boxes, tuple) and len(boxes) == 2 and isinstance(boxes[0], np.ndarray):
        lo_all, hi_all = boxes
    else:
        lo_all = np.array([[a for a, _ in b] for b in boxes], dtype=np.int64).reshape(len(boxes), rank)
        hi_all = np.array([[b_ for _, b_ in b] for b in boxes], dtype=np.int64).reshape(len(boxes), rank)
    if not sampled:
        grid = (np.indices(tiles, dtype=np.int64).reshape(len(tiles), -1).T if tiles
                else np.zeros((1, 0), dtype=np.int64))
        strides = [int(np.prod(tiles[k + 1:], dtype=np.int64)) for k in range(len(tiles))]
        at = [strides[k] for k in range(len(tiles))]
    else:
        grid = np.array(coords, dtype=np.int64).reshape(len(coords), len(tiles))
        where = {tc: j for j, tc in enumerate(coords)}
        at = [where.get(tuple(int(k == a) for a in range(len(tiles))), 0) for k in range(len(tiles))]
    spans = []
    for d, n in enumerate(shape):
        lo, hi = lo_all[:, d], hi_all[:, d]
        span = None
        for side in (lo, hi):
            coeffs = tuple(int(side[at[k]] - side[0]) if tiles[k] > 1 else 0 for k in range(len(tiles)))
            shift = grid @ np.array(coeffs, dtype=np.int64) if tiles else np.zeros(len(lo), dtype=np.int64)
            base, top = int((lo - shift).min()), int((hi - shift).max())
            raw_lo, raw_hi = base + shift, top + shift
            if np.array_equal(np.maximum(raw_lo, 0), lo) and np.array_equal(np.minimum(raw_hi, n), hi):
                clamp = bool((raw_lo < 0).any() or (raw_hi > n).any())
                span = Span(base, top - base, coeffs, clamp)
                break
        if span is None:
            if sampled:
                return None
            rows = tuple(tuple(a) + tuple(b) for a, b in zip(lo_all.tolist(), hi_all.tolist()))
            return Region(tuple(shape), tuple(tiles), (), rows)
        spans.append(span)
    return Region(tuple(shape), tuple(tiles), tuple(spans))


def _sample_coords(tiles: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Tiles whose boxes fix an affine fit: the first, the second and the last along each axis, and
    the last tile of the grid."""
    out = [(0,) * len(tiles)]
    for k, n in enumerate(tiles):
        for i in (1, n - 1):
            if 0 < i < n:
                tc = tuple(i if a == k else 0 for a in range(len(tiles)))
                if tc not in out:
                    out.append(tc)
    last = tuple(n - 1 for n in tiles)
    if last not in out:
        out.append(last)
    return out


def _one_to_one(graph: PrimGraph, producer: str, consumers: list[str]) -> bool:
    """A reduction read by exactly one elementwise consumer, element for element: inlining it there
    computes each reduced value once, in the thread that uses it (no recompute)."""
    if len(consumers) != 1:
        return False
    p, c = graph.stage(producer), graph.stage(consumers[0])
    if c.reduce or c.shape != p.shape:
        return False
    ident = I.out_vars(len(p.shape))
    return all(ld.index == ident and ld.pad is None for ld in E.loads(c.body) if ld.tensor == producer)


def _padded_read(consumer: Stage, producer: str) -> bool:
    return any(ld.tensor == producer and ld.pad is not None for ld in E.loads(consumer.body))


def _covers(stage: Stage, boxes: list[Box]) -> bool:
    """Whether the union of the per-tile boxes is the whole tensor."""
    mask = np.zeros(stage.shape, dtype=bool)
    for b in boxes:
        mask[tuple(slice(lo, hi) for lo, hi in b)] = True
    return bool(mask.all())


def _resolve(stage: Stage, graph: PrimGraph, inline: set[str], block_buf: dict[str, str], params) -> E.Expr:
    """Inline REGISTER producers into the body and point every load at a buffer name (memoised: the
    cost model realises the same segments for many candidate tiles; the body does not depend on them)."""
    # The body depends only on the stages inlined into it (transitively) and on the block buffers of the
    # tensors those read: key on exactly that, so every trial group holding the same chain hits.
    closure, todo = set(), [stage.name]
    while todo:
        for t in graph.stage(todo.pop()).inputs:
            if t in inline and t not in closure:
                closure.add(t)
                todo.append(t)
    reads = {t for x in closure | {stage.name} for t in graph.stage(x).inputs}
    key = (graph.structural_hash, stage.name, frozenset(closure),
           tuple(sorted((t, block_buf[t]) for t in reads if t in block_buf)))
    table = memo("generate.resolved", 20000)
    hit = table.get(key)
    if hit is None:
        used: dict[str, Buffer] = {}
        body = _resolve_body(stage, graph, closure, block_buf, used)
        hit = table.put(key, (body, tuple(used)))
    for t in hit[1]:
        _global(params, graph, t)
    return hit[0]


def _resolve_body(stage: Stage, graph: PrimGraph, inline: set[str], block_buf: dict[str, str], params) -> E.Expr:
    ranges = {f"i{k}": (0, n - 1) for k, n in enumerate(stage.shape)}
    ranges.update({f"r{k}": (0, n - 1) for k, n in enumerate(stage.reduce)})

    depth = [0]
    table = memo("generate.expanded", 50000)

    def closure_of(name: str) -> frozenset:
        out, todo = set(), [name]
        while todo:
            for t in graph.stage(todo.pop()).inputs:
                if t in inline and t not in out:
                    out.add(t)
                    todo.append(t)
        return frozenset(out)

    def expand(e: E.Expr) -> E.Expr:
        if not (isinstance(e, E.Load) and e.tensor in inline):
            return e
        # A producer read at one index, at one nesting depth, through the same inlined chain expands
        # to the same value wherever it is read (memoised across stages and trial groups).
        key = (graph.structural_hash, e, depth[0], closure_of(e.tensor))
        hit = table.get(key)
        if hit is None:
            producer = graph.stage(e.tensor)
            mapping = {f"i{k}": ix for k, ix in enumerate(e.index)}
            names = []
            for k in range(len(producer.reduce)):
                # The producer's r0.. would clash with the consumer's own reduce loops; names by
                # nesting depth keep nested loops apart while two copies of one reduction stay
                # structurally equal, so the printer computes it once (a mean used twice in a variance).
                names.append(f"u{depth[0] + 1}" + (f"_{k}" if k else ""))
                mapping[f"r{k}"] = I.var(names[-1])
            depth[0] += bool(producer.reduce)
            value = kmap(substitute_body(producer.body, mapping), expand)
            depth[0] -= bool(producer.reduce)
            if producer.reduce:
                value = Reduce(value, tuple(names), producer.reduce, producer.combine, producer.dtype)
            value = Inlined(producer.name, value)
            if e.pad is not None:
                value = Guard(InBounds(e.index, producer.shape), value, E.imm(e.pad, e.dtype))
            hit = table.put(key, value)
        return hit

    body = kmap(stage.body, expand)
    expand = None  # noqa: F841 -- it refers to itself: no cycle left for the garbage collector (policies.gc_paused)
    # The inlined reductions' loop variables (one name may serve reductions of different extents:
    # bounds cover the widest).
    for n in kwalk(body):
        if isinstance(n, Reduce):
            for v, ext in zip(n.vars, n.extents):
                ranges[v] = (0, max(ranges.get(v, (0, 0))[1], ext - 1))

    def rename(e: E.Expr) -> E.Expr:
        if isinstance(e, E.Load):
            name = block_buf.get(e.tensor) or _global(params, graph, e.tensor)
            return E.Load(name, e.index, e.dtype, e.pad)
        return e

    def fix_index(ix: I.Lin) -> I.Lin:
        ix = I.simplify(ix, ranges)
        for t in ix.indirect_tensors():
            if t in block_buf or t in inline:
                raise PlanError(f"stage {stage.name} gathers with indices from {t} computed in the same segment",
                                hint=f"connect {t} -> {stage.name} at KERNEL")
            ix = I.rename_tensor(ix, t, _global(params, graph, t))
        return ix

    return map_indices(kmap(body, rename), fix_index)
