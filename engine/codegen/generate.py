"""Plan + PrimGraph in, Program (kernel IR, launch list, memory plan) out.

Each group becomes one kernel; GLOBAL_SYNC edges split it into segments (grid barriers); inside a
segment, regions propagate back from the anchor's tile, REGISTER producers (elementwise/layout) are
inlined into their consumers, everything else becomes a phase writing a BLOCK and/or GLOBAL buffer.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from engine.codegen.conv import conv_of
from engine.codegen.kexpr import Guard, InBounds, Reduce, free_vars, kmap, kwalk, map_indices, substitute_body
from engine.codegen.kir import Buffer, Gemm, Kernel, Launch, Phase, Program, Region, Scope, Segment, Span
from engine.device import Device, get_device, wave_grid
from engine.errors import CompileError, PlanError
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import PrimGraph, Stage, StageKind
from engine.runtime.memory import plan_memory
from engine.schedule.plan import Conn, Group, Plan, Tile, plan_to_json
from engine.tilegraph.propagate import Box, propagate

_INLINE_KINDS = (StageKind.ELEMENTWISE, StageKind.LAYOUT)
TARGETS = ("cuda", "c")  # generate(): the CUDA program at the plan's tiles, or the C target's


def generate(plan: Plan, graph: PrimGraph, device: Device | str = "a100", target: str = "cuda") -> Program:
    """Realise every group of `plan` as a kernel; refuses a plan for another model or one whose
    groups do not match its edges. `target="c"` first coarsens convolution blocks along output
    channels (`coarsen.coarsen_for_c`: a CPU block is an OpenMP iteration); the Program keeps the
    hash of the plan it was given."""
    device = get_device(device) if isinstance(device, str) else device
    if plan.model_hash != graph.structural_hash:
        raise PlanError(f"plan is for model hash {plan.model_hash}, not {graph.structural_hash}",
                        hint="re-plan this model")
    low = next((t for t in graph.specs.values() if t.dtype.is_low_float), None)
    if low is not None:
        raise CompileError(f"tensor '{low.name}' is {low.dtype.value}: kernels are generated for float16/32/64, "
                           "integer and bool tensors only", hint="run this model with --backend reference")
    conns = {e.key: e.conn for e in plan.edges}
    missing = [e for e in graph.edges if e not in conns]
    if missing:
        raise PlanError(f"plan has no connection for edge {missing[0][0]} -> {missing[0][1]}")
    if target not in TARGETS:
        raise CompileError(f"unknown target '{target}' (choose one of {', '.join(TARGETS)})")
    given, built = plan, {}
    if target == "c":
        from engine.codegen.coarsen import coarsen_for_c

        plan = coarsen_for_c(plan, graph, device, built)
    kernels, launches = [], []
    for group in _launch_order(plan, graph):
        kernel = built.get(group.name) or build_kernel(group, graph, conns, device)
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


def _launch_order(plan: Plan, graph: PrimGraph) -> list[Group]:
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


def build_kernel(group: Group, graph: PrimGraph, conns, device: Device | None = None) -> Kernel:
    """One group's kernel, falling back when its block buffers do not fit the device's shared memory:
    first without staged GEMM/conv tiles, then with reduction-holding chains inlined at every use
    (recomputed, as the REGISTER edges say, but within the budget)."""
    limit = (device or get_device("a100")).max_smem_per_block_bytes
    kernel = _build_kernel(group, graph, conns)
    if kernel.shared_bytes > limit and (kernel.gemms or kernel.convs):
        kernel = _build_kernel(group, graph, conns, tiled=False)  # no room left to stage GEMM/conv tiles
    if kernel.shared_bytes > limit:
        kernel = _build_kernel(group, graph, conns, tiled=False, stage_heavy=False)
    return kernel


def _build_kernel(group: Group, graph: PrimGraph, conns, tiled: bool = True, stage_heavy: bool = True) -> Kernel:
    members = set(group.stages)
    params: dict[str, Buffer] = {}
    locals_: list[Buffer] = []
    segments = []
    threads = max(t.threads for t in group.segments)
    for tile, names in _segments(group, graph, conns):
        seg = _build_segment(tile, names, graph, conns, members, params, locals_, group.name, stage_heavy)
        if tiled:
            seg = _map_conv(_map_gemm(seg, tile, threads, graph), threads, graph)
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
            rows = int(np.prod(p.region.extent, dtype=np.int64))
            want = max(1, threads // max(rows, 1))
            while lanes * 2 <= min(threads, want, int(np.prod(p.reduce, dtype=np.int64))):
                lanes *= 2
        phases.append(dataclasses.replace(p, threads_per_row=lanes))
    return dataclasses.replace(seg, phases=tuple(phases))


_STAGE_BYTES = 48 * 1024  # A + B staging per k step: the static shared-memory budget of a block
_MAX_MICRO = 128  # accumulators per thread (registers)


def _map_gemm(seg: Segment, tile: Tile, threads: int, graph: PrimGraph) -> Segment:
    """Phases whose contraction is a product of a (rows x k) and a (k x cols) factor over the last two
    axes of a region that is one element wide in every other axis become tiled GEMMs."""
    step = 1
    for r in tile.reduce_step:
        step *= r
    phases = []
    for p in seg.phases:
        gemm = _gemm_of(p, graph, threads, step if tile.reduce_step else 32)
        phases.append(dataclasses.replace(p, gemm=gemm) if gemm else p)
    return dataclasses.replace(seg, phases=tuple(phases))


def _map_conv(seg: Segment, threads: int, graph: PrimGraph) -> Segment:
    """Phases (not already GEMMs) whose contraction reads its input through sliding windows become
    direct convolutions (engine/codegen/conv.py)."""
    phases = []
    for p in seg.phases:
        found = None if p.gemm is not None or p.region.flat else _contraction_of(p, graph)
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
            stack.extend(E.children(n))
    return found


def _contraction_of(p: Phase, graph: PrimGraph) -> tuple | None:
    """(target, summand, reduce vars, extents) of the phase's sum of products: the phase itself (a
    contraction stage) or the one such sum inlined at the top of its body (target: that Reduce)."""
    if p.combine is not None:
        if graph.stage(p.stage).kind != StageKind.CONTRACTION or p.combine.value != "sum":
            return None
        return None, p.body, tuple(f"r{k}" for k in range(len(p.reduce))), p.reduce
    found = [r for r in _top_reduces(p.body) if r.combine.value == "sum" and _factors(r.body) is not None]
    if len(found) != 1:
        return None
    return found[0], found[0].body, found[0].vars, found[0].extents


def _gemm_of(p: Phase, graph: PrimGraph, threads: int, step: int) -> Gemm | None:
    region = p.region
    if region.flat or region.rank < 2 or any(e != 1 for e in region.extent[:-2]) or not p.dtype.is_float:
        return None
    found = _contraction_of(p, graph)
    if found is None:
        return None
    target, body, names, extents = found
    split = _factors(body)
    if split is None:
        return None
    m, n = f"i{region.rank - 2}", f"i{region.rank - 1}"
    a, b = split
    if n in free_vars(a) or m in free_vars(b):
        a, b = b, a
    if n in free_vars(a) or m in free_vars(b):
        return None
    if any(isinstance(x, Reduce) for x in kwalk(b)) or not _row_invariant(a, tuple(names)):
        return None
    bm, bn = region.extent[-2], region.extent[-1]
    k = int(np.prod(extents, dtype=np.int64))
    bk = max(1, min(step, k))
    best = None
    tx = 1
    while tx <= threads:
        ty = threads // tx
        tm, tn = -(-bm // ty), -(-bn // tx)
        key = (tm * tn, tm + tn)
        if best is None or key < best[0]:
            best = (key, tm, tn, tx, ty)
        tx *= 2
    _, tm, tn, tx, ty = best
    if tm * tn > _MAX_MICRO or threads % tx:
        return None
    while bk > 4 and 4 * bk * (ty * tm + tx * tn) > _STAGE_BYTES:
        bk //= 2
    if 4 * bk * (ty * tm + tx * tn) > _STAGE_BYTES:
        return None
    return Gemm(a, b, target, tuple(names), tuple(extents), bm, bn, bk, tm, tn, tx, ty)


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


def _tile_boxes(stage: Stage, tile: Tile) -> list[Box]:
    if len(tile.shape) != len(stage.shape) or any(t <= 0 for t in tile.shape):
        raise PlanError(f"tile {list(tile.shape)} does not fit stage {stage.name} of shape {list(stage.shape)}")
    tiles = tuple(-(-n // t) for n, t in zip(stage.shape, tile.shape))
    boxes = []
    for idx in np.ndindex(*tiles):
        boxes.append(tuple((i * t, min((i + 1) * t, s)) for i, t, s in zip(idx, tile.shape, stage.shape)))
    return boxes


def _hull(a: Box | None, b: Box | None) -> Box | None:
    if a is None:
        return b
    if b is None:
        return a
    return tuple((min(x[0], y[0]), max(x[1], y[1])) for x, y in zip(a, b))


def _build_segment(tile, names, graph, conns, members, params, locals_, gname, stage_heavy: bool = True) -> Segment:
    anchor = graph.stage(tile.stage)
    seg = set(names)
    local_cons = {s: [c for c in graph.consumers.get(s, ()) if c in seg] for s in names}
    needs_global = {s: s in graph.outputs or any(c not in seg for c in graph.consumers.get(s, ())) for s in names}
    feeds: dict[str, bool] = {}  # the stage reaches a contraction through REGISTER elementwise stages
    for s in reversed(names):
        feeds[s] = any(conns[(s, c)] == Conn.REGISTER and (graph.stage(c).kind == StageKind.CONTRACTION or (
            feeds.get(c, False) and graph.stage(c).kind in _INLINE_KINDS)) for c in local_cons[s])
    inline: set[str] = set()
    carries: dict[str, bool] = {}  # the stage's inlined body holds a contraction
    reduces: dict[str, bool] = {}  # ... or any reduction
    for s in names:
        st = graph.stage(s)
        carries[s] = st.kind == StageKind.CONTRACTION or any(carries.get(p, False) for p in st.inputs if p in inline)
        reduces[s] = bool(st.reduce) or any(reduces.get(p, False) for p in st.inputs if p in inline)
        # Without room for block buffers (stage_heavy off), a stage also written to global memory is
        # still inlined into its REGISTER consumers (recomputed there, as the cost model counts) and
        # gets a phase of its own that only writes the global tensor.
        if (s != anchor.name and (not needs_global[s] or (not stage_heavy and st.kind in _INLINE_KINDS
                                                          and bool(local_cons[s])))
                and all(conns[(s, c)] == Conn.REGISTER for c in local_cons[s])
                and (st.kind in _INLINE_KINDS or _one_to_one(graph, s, local_cons[s]))
                and not (stage_heavy and carries[s] and any(_padded_read(graph.stage(c), s) for c in local_cons[s]))
                and not (stage_heavy and reduces[s] and not feeds[s] and not _one_to_one(graph, s, local_cons[s]))):
            inline.add(s)
        # A contraction chain read through a padded load (Concat, Pad) would sit under the pad's guard,
        # where it cannot become a tiled GEMM (one dot product per element); a chain holding a reduction
        # read one-to-many (1/sqrt(var) broadcast over a row) would redo the reduction per element —
        # unless it ends in a GEMM's factor, which stages it once per row. Either gets its own phase:
        # computed once per element of its region, as the cost model counts.
    for s in names:
        if s != anchor.name and not local_cons[s] and not needs_global[s]:
            raise PlanError(f"group {gname}: stage {s} feeds nothing in its segment or outside it")

    # Regions per tile, propagated back from the anchor (union over in-segment consumers).
    shapes = dict((k, v.shape) for k, v in graph.specs.items())
    boxes = _tile_boxes(anchor, tile)
    tables: dict[str, list[Box]] = {s: [] for s in names}
    for box in boxes:
        region = {anchor.name: box}
        for s in reversed(names):
            if s == anchor.name:
                continue
            acc = None
            for c in local_cons[s]:
                if region.get(c) is not None:
                    acc = _hull(acc, propagate(graph.stage(c), region[c], shapes).box(s))
            region[s] = acc
        for s in names:
            tables[s].append(region[s] if region[s] is not None else tuple((0, 0) for _ in graph.stage(s).shape))

    tiles = tuple(-(-n // t) for n, t in zip(anchor.shape, tile.shape))
    regions = {s: fit_region(graph.stage(s).shape, tiles, tables[s]) for s in names
               if s not in inline or needs_global[s]}
    # A stage read outside the segment whose tiles do not cover it (the anchor reads only part of it)
    # gets a completion phase: each block recomputes its flat share of the whole tensor from globals.
    partial = [s for s in names if s != anchor.name and needs_global[s]
               and not _covers(graph.stage(s), tables[s])]

    block_buf: dict[str, str] = {}
    phases = []
    for s in names:
        if s in inline and (not needs_global[s] or s in partial):
            continue
        stage = graph.stage(s)
        stores = []
        if local_cons[s] and s not in inline:
            buf = Buffer(f"s_{_ident(s)}", s, stage.dtype, stage.shape, Scope.BLOCK, regions[s])
            locals_.append(buf)
            block_buf[s] = buf.name
            stores.append(buf.name)
        if needs_global[s] and s not in partial:
            stores.append(_global(params, graph, s))
        body = _resolve(stage, graph, inline, block_buf, params)
        phases.append(Phase(s, stage.dtype, body, regions[s], tuple(stores), stage.reduce, stage.combine))
    for s in partial:
        stage = graph.stage(s)
        body = _resolve(stage, graph, set(names) - {s}, {}, params)
        region = Region(stage.shape, tiles, flat=-(-stage.size // len(boxes)))
        phases.append(Phase(s, stage.dtype, body, region, (_global(params, graph, s),), stage.reduce,
                            stage.combine))
    return Segment(anchor.name, len(boxes), tuple(phases))


def fit_region(shape: tuple[int, ...], tiles: tuple[int, ...], boxes: list[Box]) -> Region:
    """Express per-tile boxes as affine spans of the tile coordinates (clamped to the tensor) when
    they are; else keep the explicit table."""
    coords = list(np.ndindex(*tiles)) if tiles else [()]
    strides = [int(np.prod(tiles[k + 1:], dtype=np.int64)) for k in range(len(tiles))]
    spans = []
    for d, n in enumerate(shape):
        lo = [b[d][0] for b in boxes]
        hi = [b[d][1] for b in boxes]
        span = None
        for side in (lo, hi):
            coeffs = tuple(side[strides[k]] - side[0] if tiles[k] > 1 else 0 for k in range(len(tiles)))
            shift = [sum(c * x for c, x in zip(coeffs, tc)) for tc in coords]
            base = min(a - s for a, s in zip(lo, shift))
            top = max(b - s for b, s in zip(hi, shift))
            raw = [(base + s, top + s) for s in shift]
            if all(max(a, 0) == x and min(b, n) == y for (a, b), x, y in zip(raw, lo, hi)):
                clamp = any(a < 0 or b > n for a, b in raw)
                span = Span(base, top - base, coeffs, clamp)
                break
        if span is None:
            rows = tuple(tuple(lo for lo, _ in b) + tuple(hi for _, hi in b) for b in boxes)
            return Region(tuple(shape), tuple(tiles), (), rows)
        spans.append(span)
    return Region(tuple(shape), tuple(tiles), tuple(spans))


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
    """Inline REGISTER producers into the body and point every load at a buffer name."""
    ranges = {f"i{k}": (0, n - 1) for k, n in enumerate(stage.shape)}
    ranges.update({f"r{k}": (0, n - 1) for k, n in enumerate(stage.reduce)})

    depth = [0]

    def expand(e: E.Expr) -> E.Expr:
        if isinstance(e, E.Load) and e.tensor in inline:
            producer = graph.stage(e.tensor)
            mapping = {f"i{k}": ix for k, ix in enumerate(e.index)}
            names = []
            for k in range(len(producer.reduce)):
                # The producer's r0.. would clash with the consumer's own reduce loops; names by
                # nesting depth keep nested loops apart while two copies of one reduction stay
                # structurally equal, so the printer computes it once (a mean used twice in a variance).
                names.append(f"u{depth[0] + 1}" + (f"_{k}" if k else ""))
                mapping[f"r{k}"] = I.var(names[-1])
                # One name may serve reductions of different extents: bounds cover the widest.
                ranges[names[-1]] = (0, max(ranges.get(names[-1], (0, 0))[1], producer.reduce[k] - 1))
            depth[0] += bool(producer.reduce)
            value = kmap(substitute_body(producer.body, mapping), expand)
            depth[0] -= bool(producer.reduce)
            if producer.reduce:
                value = Reduce(value, tuple(names), producer.reduce, producer.combine, producer.dtype)
            if e.pad is not None:
                return Guard(InBounds(e.index, producer.shape), value, E.imm(e.pad, e.dtype))
            return value
        return e

    body = kmap(stage.body, expand)

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
