"""A floor under a kernel's modeled time from its tiles' regions alone, no kernel IR built: a group's
stages, connections and one candidate Tile per segment in, microseconds out (`floor_us`), never above
what `cost.estimate_group` models for the same tiles. The tile search costs candidates in floor order
and stops where the floor passes the modeled times it must beat."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.codegen.mma import bf16_mma, f16_mma
from engine.device import Device, resident_blocks_per_sm
from engine.ir import expr as E
from engine.ir.graph import PrimGraph, Stage, StageKind
from engine.memo import memo
from engine.schedule import cost as C
from engine.schedule.plan import Conn, Tile
from engine.tilegraph.propagate import Box, box_size
from engine.tilegraph.tilegraph import GroupRegions, inner_edges, stage_order

# A load whose every index is a constant or one variable plus a constant, no variable twice, no padding:
# over a box of its variables it reads exactly the box of their ranges, every element of it.
# Per index: (variable, offset), or None for a constant.
BoxLoad = tuple[str, tuple[tuple[str, int] | None, ...]]


def floor_us(graph: PrimGraph, stages: Sequence[str], conns: Mapping, tiles: Sequence[Tile], device: Device,
             segs: Sequence[Sequence[str]], local: dict | None = None) -> float:
    """A floor under `estimate_group(...).modeled_us`: per segment, its DRAM reads and writes (completion
    phase left out) and the global loads and stores its kernel IR must count at least (`work_floor`),
    each over its bandwidth and slowed by the latency efficiency of the warps an SM would hold, bounded
    as `estimate_group` bounds its terms, times that residency's wave quantisation — the least over
    every residency the block size allows — plus the launch and the grid barriers (on a CPU of several
    threads, where two serial segments in a row have none — `cost.serial_on` — those next to a segment the
    C target certainly splits over its threads: `surely_parallel`). `local`: the tile search's memo (its
    connections and segments are fixed), for the per-segment bytes."""
    serial_cpu = device.kind == "cpu" and device.sm_count > 1
    barriers = 0 if serial_cpu else len(segs) - 1
    total = device.launch_overhead_s * 1e6 + barriers * device.grid_barrier_s * 1e6
    local = {} if local is None else local
    shared = local.get(("floor-group",))
    if shared is None:  # what does not depend on the tiles, once per search
        in_llc = C._in_llc(graph, device)
        seg_of = {s: k for k, seg in enumerate(segs) for s in seg}
        _, written = C._group_writes(graph, stages, conns, seg_of, device, in_llc, local)
        shared = local[("floor-group",)] = (set(stages), in_llc, written)
    members, in_llc, written = shared
    # Registers and shared memory only lower the blocks an SM holds: the thread count bounds them.
    most = max(1, resident_blocks_per_sm(device, max(t.threads for t in tiles), 0, 0)[0])
    # The C target runs a segment under ctarget.SERIAL_WORK element-steps on one thread, and the model charges
    # each segment of a kernel so that its own kernel would run (`cost.serial_on` of `segment_use`'s build).
    parallel = []
    for k, (seg, tile) in enumerate(zip(segs, tiles)):
        fkey = ("floor-work", k, tile.stage, tile.shape, tile.blocks, tile.row_split)
        got = local.get(fkey)
        if got is None:
            # An input an earlier segment of the kernel reads may be an L2 hit here (estimate_group charges
            # a kernel at most a tensor's size for it): none of it counts toward the floor.
            earlier = local.get(("floor-earlier", k))
            if earlier is None:
                earlier = local[("floor-earlier", k)] = {
                    t: C.nbytes(graph, t) for x in (x for seg_ in segs[:k] for x in seg_)
                    for t in graph.stage(x).inputs if t not in members and t in graph.specs}
            got = local[fkey] = _segment_work(graph, members, seg, conns, tile, device, in_llc, written.get(k, 0),
                                              earlier)
        bkey = (fkey, tile.threads, most)  # a segment's floor at one residency bound, reused across trials
        best = local.get(bkey)
        if best is None:
            serial = serial_cpu and serial_for_sure(graph, seg, conns, tile, got[4])
            best = local[bkey] = _segment_floor(device, tile, most, *got[:3], serial=serial)
        total += best
        if serial_cpu and len(segs) > 1:
            parallel.append(surely_parallel(graph, tile, got[4]))
    if parallel:
        total += sum(parallel[k] or parallel[k + 1] for k in range(len(segs) - 1)) * device.grid_barrier_s * 1e6
    return total


def surely_parallel(graph: PrimGraph, tile: Tile, regions: GroupRegions) -> bool:
    """Whether the C target splits a segment anchored by `tile` over a CPU's threads whatever kernel IR
    generate builds for it: its anchor's phase alone, its box of `regions` per tile times the anchor's
    reduction, over the tiles, is ctarget.SERIAL_WORK element-steps or more (`ctarget.segment_work` counts at
    least that; rows split across blocks: no claim)."""
    from engine.codegen.ctarget import SERIAL_WORK

    anchor = graph.stage(tile.stage)
    box = regions.stages.get(tile.stage)
    if box is None or tile.row_split != 1:
        return False
    ntiles = math.prod(-(-n // t) for n, t in zip(anchor.shape, tile.shape))
    return box_size(box) * math.prod(anchor.reduce) * ntiles >= SERIAL_WORK


def score_floor(tiles: Sequence[Tile], device: Device, local: Mapping) -> float:
    """A floor under the tile search's tie-break score of `tiles`, (DRAM + L2 bytes + 1) x waves as
    `estimate_group` counts them (`tiles._search_pass`), from what `floor_us` kept in the search's
    `local` for the same tiles: its DRAM and global bytes per segment (under the kernel's DRAM and L2
    traffic; less 1 B each for the cost's truncation to whole bytes) and the waves at the most blocks per SM
    the block size allows (registers and shared memory only lower that, so the waves only rise)."""
    traffic = 0.0
    for k, tile in enumerate(tiles):
        got = local[("floor-work", k, tile.stage, tile.shape, tile.blocks, tile.row_split)]
        traffic += max(0.0, got[0] - 1) + max(0.0, got[1] - 1)
    most = max(1, resident_blocks_per_sm(device, max(t.threads for t in tiles), 0, 0)[0])
    waves = max(1, -(-max(t.blocks for t in tiles) // (most * device.sm_count)))
    return (traffic + 1) * waves


def _segment_work(graph: PrimGraph, members: set, seg: Sequence[str], conns: Mapping, tile: Tile, device: Device,
                  in_llc: bool, written: int, earlier: Mapping[str, int] | None = None) -> tuple:
    """(DRAM bytes, global bytes, compute seconds, flops) a segment's kernel IR counts at least under `tile`,
    and the regions they come from. `earlier`: inputs an earlier segment of the kernel reads (no DRAM here)."""
    regions = C.segment_regions(graph, seg, conns, tile)
    per_block = tile.blocks / max(1, tile.row_split)
    dram = C._read_dram(graph, members, C._read_lines(graph, regions, seg), per_block, device, in_llc,
                        dict(earlier) if earlier else None)  # _read_dram adds to it
    glob, macs, other, maths = work_floor(graph, seg, conns, regions) if tile.row_split == 1 else (0.0,) * 4
    # A contraction may run on tensor cores (the plan option tf32, fp16 operands: codegen/mma.py):
    # its multiply-adds at the fastest rate the device has keep this a floor either way.
    # Per-element work at the model's two per-element rates (cost.estimate_group): its math ops at the math
    # rate, the rest at the faster of the two. The kernel IR counts at least `maths` math flops and at least
    # `other` flops in all, so with the math rate the slower this stays under the model's charge whatever the
    # IR adds to either; where the probe found the math rate the faster (or one rate), all go at the faster.
    compute = compute_seconds(device, macs, other, maths)
    return dram + written, glob * per_block, compute * per_block, (macs + other) * per_block, regions


def compute_seconds(device: Device, macs: float, other: float, maths: float) -> float:
    """Seconds under what the model charges for `macs` contraction flops and `other` flops of which `maths` are
    math ops (`work_floor`'s counts): the multiply-adds at the fastest rate the device has, the rest as
    `_segment_work` explains."""
    math_rate = device.elementwise_flops or device.peak_fp32_flops
    elementwise = max(math_rate, device.plain_flops)
    fastest = max(device.peak_fp32_flops, elementwise, device.peak_tf32_tensor_flops,
                  device.peak_fp16_tensor_flops if f16_mma(device) or bf16_mma(device) else 0.0)
    return macs / fastest + (other / elementwise if elementwise == math_rate else
                             (other - maths) / elementwise + maths / math_rate)


def whole_work_floor(graph: PrimGraph, part: Sequence[str]) -> tuple[float, float]:
    """(flops, math flops among them) the kernel IR of ANY kernels computing the stages of `part` counts at
    least, no contraction among them and none outside `part` reading one of them but through global memory
    (`welder._between_floor`'s connected parts: a kernel never spans two). A stage the model outputs or a
    stage outside the part reads is stored whole, so computed on every element; a stage a stage so computed
    reads whole through a box load is computed on every element too (stored and loaded, or inlined and
    evaluated where read). Each such stage's operations count as `work_floor` counts an inlined stage's on its
    whole box — once per binding of their free variables — a GEMM-like sum per term; an operation another stage
    of the part has too, indices aside, not at all (the printer may share one value)."""
    members = set(part)
    order = sorted(part, key=stage_order(graph).__getitem__)
    whole = {s: tuple((0, n) for n in graph.stage(s).shape) for s in order}
    needed = {s for s in order if s in graph.outputs or any(c not in members for c in graph.consumers.get(s, ()))}
    for c in reversed(order):  # consumers before their producers
        if c not in needed:
            continue
        st = graph.stage(c)
        for t, index in box_loads(st):
            if t in members and t not in needed and _project(st, whole[c], index) == whole[t]:
                needed.add(t)
    seen = _op_counts({s: body_nodes(graph.stage(s)) for s in order})
    other = maths = 0.0
    for s in order:
        if s not in needed:
            continue
        st = graph.stage(s)
        if st.kind == StageKind.CONTRACTION:
            raise ValueError(f"whole_work_floor: {s} is a contraction")
        elems = math.prod(graph.stage(s).shape)
        if _gemm_like(st):
            other += elems * st.reduce_size
            continue
        for flops, v, math_op in _own_ops(st, body_nodes(st), seen):
            n = flops * _extent(st, whole[s], v)
            other += n
            maths += n if math_op else 0.0
    return other, maths


def _segment_floor(device: Device, tile: Tile, most: int, dram: float, glob: float, compute: float,
                   serial: bool = False) -> float:
    """A segment's floor in µs: its terms at the best residency up to `most` blocks per SM, wave quantised
    — or, `serial` (`serial_for_sure`), every block on one core: sm_count times its terms, as
    `estimate_group` charges a serial segment."""
    # From ceil(blocks / SMs) blocks per SM on, more residency changes nothing: no need to try those.
    fits = -(-max(1, tile.blocks) // device.sm_count)
    warps = max(1, -(-tile.threads // device.warp_size))
    best = math.inf
    for r in range(1, min(most, fits) + 1):
        memory, _, arith = C.latency_efficiency(device, min(r, fits) * warps)
        terms = [dram / device.dram_bw_bytes_per_s * 1e6 / memory, glob / device.l2_bw_bytes_per_s * 1e6 / memory,
                 0.0, compute * 1e6 / arith]
        quant = device.sm_count if serial else C.wave_quantisation(device, tile.blocks, r)
        best = min(best, C._bound(terms, device) * quant)
    return best


def serial_for_sure(graph: PrimGraph, seg: Sequence[str], conns: Mapping, tile: Tile, regions: GroupRegions) -> bool:
    """Whether the C target will run `seg` (a kernel's only segment) on one thread under `tile`, whatever
    kernel IR generate builds for it: an upper bound on `ctarget.segment_work` from the regions is under
    ctarget.SERIAL_WORK. Per phase generate can build — each stage not inlined, on its region; a stage read
    outside whose tiles do not cover it, also completed in flat chunks with every other stage inlined —
    its elements times `ctarget.element_steps` (its reduction plus the reductions inlined into it, weighed by
    its transcendentals), each inlined read counted (generate shares repeated ones),
    times the tiles. A GEMM phase counts as any other (its elements times its k), so a segment with a
    contraction or a sum of products is claimed too, with two exceptions `segment_loop` makes: a direct
    convolution's staged input window (never claimed where one may form: `_weighs`), and a GEMM of at most
    ctarget.GEMV_ROWS rows per block streaming its weight, which splits statically from ctarget.STREAM_WORK
    (claimed above that only where every phase of its own has more rows and no completion phase may be one).
    Never for a row split, or a stage read through an index (gathers)."""
    from engine.codegen.ctarget import GEMV_ROWS, SERIAL_WORK, STREAM_WORK

    recipe = _serial_recipe(graph, seg, conns, tile.stage)
    if recipe is None or tile.row_split != 1:
        return False
    own, completed, gemm = recipe
    ntiles = math.prod(-(-n // t) for n, t in zip(graph.stage(tile.stage).shape, tile.shape))
    total = sum(box_size(regions.stages[s]) * w for s, w in own if s in regions.stages)
    for s, size, w in completed:
        if s not in regions.stages or box_size(regions.stages[s]) * ntiles < size:
            total += -(-size // ntiles) * w
    total *= ntiles
    if total >= SERIAL_WORK:
        return False
    if not gemm or total < STREAM_WORK:
        return True
    return not completed and all(box_size(regions.stages[s][:-1]) > GEMV_ROWS for s, _ in own if s in regions.stages)


def _serial_recipe(graph: PrimGraph, seg: Sequence[str], conns: Mapping, anchor: str):
    """What `serial_for_sure` needs of a segment besides its regions, once per segment: ((stage, element-steps
    per element) per phase of its own, (stage, size, element-steps per element) per stage read outside it
    that a completion phase may finish, whether a stage is a contraction or sum of products), or None where
    no bound is claimed."""
    key = (graph.structural_hash, tuple(seg), inner_edges(graph, seg, conns), anchor)
    return memo("floor.serial_recipes", 20000).lookup(key, lambda: _make_serial_recipe(graph, seg, conns, anchor))


def _make_serial_recipe(graph: PrimGraph, seg: Sequence[str], conns: Mapping, anchor: str):
    members = set(seg)
    gemms = [s for s in seg if _gemm_like(graph.stage(s))]
    for s in seg:
        for n in E.walk(graph.stage(s).body):
            index = n.index if isinstance(n, E.Load) else (n.expr,) if isinstance(n, E.IndexVal) else ()
            if any(t in members for ix in index for t in ix.indirect_tensors()):
                return None
    cons = {s: [c for c in graph.consumers.get(s, ()) if c in members] for s in seg}
    outside = {s for s in seg if s in graph.outputs or any(c not in members for c in graph.consumers.get(s, ()))}
    inline = frozenset(s for s in seg if s != anchor and s not in outside
                       and all(conns.get((s, c)) == Conn.REGISTER for c in cons[s]))
    own = tuple((s, _element_steps(graph, s, inline)) for s in seg if s not in inline)
    completed = tuple((s, graph.stage(s).size, _element_steps(graph, s, members - {s}))
                      for s in seg if s != anchor and s in outside)
    if gemms and any(len(graph.stage(s).shape) == 4 for s in seg) and (
            completed or any(g in inline or _weighs(graph.stage(g)) for g in gemms)):
        return None  # a direct convolution's phase may stage its input window (ctarget.STAGE_STEPS)
    return own, completed, bool(gemms)


def _weighs(st: Stage) -> bool:
    """Whether a sum of products `st` of rank 4 may be a direct convolution (`codegen.conv.conv_of`): one
    factor reads no output position but the channel (a weight: free of i0, i2 and i3). A phase of its own
    then keeps these factors; inlined, or completed with others inlined, it takes its consumer's indices and
    `serial_for_sure` claims nothing (its caller's test)."""
    body = st.body
    while isinstance(body, E.Cast):
        body = body.x
    if len(st.shape) != 4 or not _is_product(body):
        return False
    return any(not (_index_vars(f) & {"i0", "i2", "i3"}) for f in (body.a, body.b))


def _index_vars(e: E.Expr) -> set:
    """Output and reduce variables the loads and index values of `e` read."""
    out: set = set()
    for n in E.walk(e):
        if isinstance(n, E.Load):
            for ix in n.index:
                out |= ix.vars()
        elif isinstance(n, E.IndexVal):
            out |= n.expr.vars()
    return out


def _element_steps(graph: PrimGraph, name: str, inline: frozenset) -> int:
    """Element-steps per element of stage `name`'s phase with the stages in `inline` expanded into its body,
    as `ctarget.segment_work` weighs a phase, each read of an inlined stage counted."""
    from engine.codegen.ctarget import element_steps, transcendental

    counted: dict[str, tuple[int, int]] = {}

    def stage_steps(stage: Stage) -> tuple[int, int]:  # (inlined reduction steps, transcendentals)
        seen: dict[int, tuple[int, int]] = {}

        def node(e: E.Expr) -> tuple[int, int]:
            hit = seen.get(id(e))
            if hit is None:
                red, exp = 0, int(transcendental(e))
                if isinstance(e, E.Load) and e.tensor in inline:
                    if e.tensor not in counted:
                        producer = graph.stage(e.tensor)
                        r, x = stage_steps(producer)
                        counted[e.tensor] = (r + (math.prod(producer.reduce) if producer.reduce else 0), x)
                    red, exp = red + counted[e.tensor][0], exp + counted[e.tensor][1]
                for c in E.children(e):
                    r, x = node(c)
                    red, exp = red + r, exp + x
                hit = seen[id(e)] = (red, exp)
            return hit
        try:
            return node(stage.body)
        finally:
            node = None  # noqa: F841 -- it refers to itself: no cycle left for the garbage collector

    stage = graph.stage(name)
    red, exp = stage_steps(stage)
    stage_steps = None  # noqa: F841 -- likewise
    return element_steps((math.prod(stage.reduce) if stage.reduce else 1) + red, exp)


def floor_regions(tile: Tile, k: int, local: dict | None) -> GroupRegions | None:
    """The regions `floor_us` propagated for the `k`-th segment's `tile` in this search (`local`), if any."""
    got = (local or {}).get(("floor-work", k, tile.stage, tile.shape, tile.blocks, tile.row_split))
    return got[4] if got is not None else None


def flops_floor(graph: PrimGraph, segment: Sequence[str], conns: Mapping, tile: Tile, k: int = 0,
                local: dict | None = None) -> float:
    """Flops the kernel IR counts at least over all blocks of `segment` (its `k`-th in the group) under
    `tile`: `work_floor`'s multiply-adds and other operations of one typical block times the blocks (0 for
    rows split across blocks). `local`: the tile search's memo, where `floor_us` keeps it per candidate."""
    got = (local or {}).get(("floor-work", k, tile.stage, tile.shape, tile.blocks, tile.row_split))
    if got is not None:
        return got[3]
    if tile.row_split != 1:
        return 0.0
    _, macs, other, _ = work_floor(graph, segment, conns, C.segment_regions(graph, segment, conns, tile))
    return (macs + other) * tile.blocks


def work_floor(graph: PrimGraph, segment: Sequence[str], conns: Mapping,
               regions: GroupRegions) -> tuple[float, float, float, float]:
    """(global bytes, contraction flops, other flops, the math ops' share of them) the kernel IR of one block
    of `segment` counts at least, from its regions. A stage not inlined is computed on every element of its
    region; an inlined one at least on what a consumer so computed reads of it through a box load (`dense`), or,
    where none does, on as many elements as a reader reading one of it per element of its own computes
    (`reads_distinct`: a reshape's div/mod index). Global bytes:
    every element a box load reads of a tensor from outside the segment is loaded at least once, and a
    tensor only one stage loads is loaded per evaluation of each of its load nodes (loads under a
    select's branches left out: the printer may load one of them); the anchor stores its tile. Flops: a
    contraction's multiply-add per term (a GEMM or convolution computes per factor), and each operation
    of another stage's body (outside selects) per evaluation — counting no operation another stage of
    the segment has too, indices aside (inlined, the printer may share one value). Math ops (`_math`: exp,
    div, ... as the kernel IR's `Work.op_flops` counts them) are a part of the other flops the IR counts at
    least as often. A contraction no phase computing it can tile (`_untiled`) counts among the other flops."""
    recipe = _recipe(graph, segment, conns, regions.anchor)
    dense: dict[str, Box | None] = {}
    count: dict[str, int] = {}  # an inlined stage no box load reaches: distinct elements computed at least
    for s, reads, through in recipe.order:  # consumers before their producers
        if reads is None:
            dense[s] = regions.stages.get(s)
            continue
        best = None
        for c, c_stage, index in reads:
            if dense.get(c) is not None:
                box = _project(c_stage, dense[c], index)
                if best is None or box_size(box) > box_size(best):
                    best = box
        dense[s] = best
        if best is None and through:
            # Read through a reshape, a roll by a modulo, ...: as many distinct elements as its reader computes.
            count[s] = max(box_size(dense[c]) if dense.get(c) is not None else count.get(c, 0) for c in through)
    most: dict[str, int] = {}
    macs = other = maths = 0.0
    for s, st, outside, mac, per_elem, ops, loads in recipe.stages:
        box = dense.get(s)
        if box is not None:
            elems = box_size(box)
            # A stage in a phase of its own evaluates every node once per element of its region (per term where
            # the node depends on the reduce variables), an inlined one once per binding of the node's free
            # variables at least: its consumer's loops may hoist it out of a loop that does not bind them.
            own = s in recipe.own

            def evaluations(v: frozenset, st=st, box=box, own=own) -> int:
                return _evaluations(st, box, v, own)

            def reads(index: tuple, st=st, box=box) -> int:
                return box_size(_project(st, box, index))
        elif count.get(s):
            # Computed (inlined) on that many distinct elements, no box known: a node free in every axis of the
            # stage longer than one is evaluated once per element at least, and a box load naming each such
            # axis reads that many distinct elements.
            elems, full = count[s], _full_axes(st)

            def evaluations(v: frozenset, st=st, n=elems, full=full) -> int:
                return n * _extent(st, (), frozenset(x for x in v if x[0] == "r")) if full <= v else 0

            def reads(index: tuple, n=elems, full=full) -> int:
                return n if full <= {d[0] for d in index if d is not None} else 0
        else:
            continue
        for t, index in outside:
            most[t] = max(most.get(t, 0), reads(index))
        if mac and _untiled(graph, recipe.hosts.get(s, ()), regions):
            other += elems * mac  # per-element flops: the per-element rate
        else:
            macs += elems * mac
        other += elems * per_elem
        for flops, v, math_op in ops:
            n = flops * evaluations(v)
            other += n
            maths += n if math_op else 0.0
        each: dict[str, int] = {}
        for t, v in loads:
            each[t] = each.get(t, 0) + evaluations(v)
        for t, n in each.items():
            most[t] = max(most.get(t, 0), n)
    loads = sum(n * graph.specs[t].dtype.itemsize for t, n in most.items())
    return (float(loads + box_size(regions.stages.get(regions.anchor)) * recipe.store_itemsize), float(macs),
            float(other), float(maths))


def _untiled(graph: PrimGraph, hosts: tuple, regions: GroupRegions) -> bool:
    """Whether every phase of `hosts` (`_Recipe.hosts`: a contraction's) computes it outside any tiled GEMM
    or direct convolution, whatever the block (`generate.may_tile` at the phase's region)."""
    from engine.codegen.generate import gemm_rows, may_tile

    table = memo("floor.may_tile", 20000)
    for c, body in hosts:
        box = regions.stages.get(c)
        if box is None:
            return False
        extent = tuple(hi - lo for lo, hi in box)
        # What of the region `may_tile` reads: its rank, the GEMM's rows, whether its batch axis is one wide.
        key = (graph.structural_hash, c, body, len(extent), gemm_rows(extent), bool(extent) and extent[0] == 1)
        if table.lookup(key, lambda c=c, body=body, extent=extent: may_tile(graph, c, body, extent)):
            return False
    return bool(hosts)


@dataclass(frozen=True)
class _Recipe:
    """What `work_floor` needs of a segment besides its regions, worked out once per segment."""

    order: tuple  # (stage, None when not inlined else ((consumer, its Stage, box load index), ...),
    #               consumers reading a distinct element of it per element of theirs: `reads_distinct`)
    stages: tuple  # (stage, Stage, ((outside tensor, box load index), ...), macs and flops per element,
    #                ((flops, free variables, math op) per distinct operation), ((outside tensor only it loads,
    #                free variables) per distinct load))
    store_itemsize: int
    own: frozenset  # stages computed in a phase of their own (not inlined)
    # Per contraction: ((phase stage, its resolved body), ...) of the phases computing it (its own, or those
    # of the stages it is inlined into, through inlined ones)
    hosts: Mapping[str, tuple]


def _recipe(graph: PrimGraph, segment: Sequence[str], conns: Mapping, anchor: str) -> _Recipe:
    members = set(segment)
    key = (graph.structural_hash, tuple(segment), inner_edges(graph, segment, conns), anchor)
    return memo("floor.recipes", 20000).lookup(key, lambda: _make_recipe(graph, segment, conns, anchor, members))


def _make_recipe(graph: PrimGraph, segment: Sequence[str], conns: Mapping, anchor: str, members: set) -> _Recipe:
    names = sorted(segment, key=stage_order(graph).__getitem__)
    cons = {s: [c for c in graph.consumers.get(s, ()) if c in members] for s in names}
    order = []
    for s in reversed(names):
        outside = s in graph.outputs or any(c not in members for c in graph.consumers.get(s, ()))
        inline = s != anchor and not outside and all(conns.get((s, c)) == Conn.REGISTER for c in cons[s])
        reads = tuple((c, graph.stage(c), index) for c in cons[s] for t, index in box_loads(graph.stage(c)) if t == s)
        through = tuple(c for c in cons[s] if inline and reads_distinct(graph, c, s))
        order.append((s, reads if inline else None, through))
    nodes = {s: body_nodes(graph.stage(s)) for s in names}
    # Inlined, a stage's loads and operations take its consumer's indices: two stages' nodes that differ
    # only in their indices may become one value. Only what no other stage has, indices aside, counts.
    seen = _op_counts(nodes)
    readers: dict[str, int] = {}
    for s in names:
        for t in {n.tensor for n in E.walk(graph.stage(s).body) if isinstance(n, E.Load)}:
            readers[t] = readers.get(t, 0) + 1
    stages = []
    for s in names:
        st = graph.stage(s)
        outside = tuple((t, index) for t, index in box_loads(st) if t not in members)
        if _gemm_like(st):
            # A GEMM or convolution loads and computes per factor: its multiply-adds (or, for a
            # reduction the printer may take for one, the combine) per term, nothing per node.
            mac = st.reduce_size * (2 if st.kind == StageKind.CONTRACTION and _is_product(st.body) else 1)
            stages.append((s, st, outside, mac if st.kind == StageKind.CONTRACTION else 0.0,
                           0.0 if st.kind == StageKind.CONTRACTION else mac, (), ()))
            continue
        ops = _own_ops(st, nodes[s], seen)
        loads = tuple((t, v) for t, v in nodes[s][1] if t not in members and readers.get(t) == 1)
        stages.append((s, st, outside, 0.0, 0.0, ops, loads))
    own = frozenset(s for s, reads, _ in order if reads is None)
    return _Recipe(tuple(order), tuple(stages), graph.stage(anchor).dtype.itemsize, own,
                   _hosts(graph, names, cons, own))


def _hosts(graph: PrimGraph, names: Sequence[str], cons: Mapping[str, list], own: frozenset) -> dict[str, tuple]:
    """`_Recipe.hosts`: per contraction of the segment, the phases generate computes it in, each with the
    body it resolves for that phase (the stages not in `own` inlined, the others with consumers in the
    segment kept in block buffers) — its stage's own body where nothing is inlined into it."""
    from engine.codegen.generate import resolved_body

    inline = set(names) - own
    buffered = [s for s in names if s in own and cons[s]]
    bodies: dict[str, E.Expr] = {}

    def body_of(c: str) -> E.Expr:
        # With nothing inlined into it, a phase computes its stage's own body (its loads renamed to buffers,
        # which changes no variable `may_tile` reads): no need to resolve it.
        if not any(t in inline for t in graph.stage(c).inputs):
            return graph.stage(c).body
        return resolved_body(graph, c, inline, buffered)

    out = {}
    for s in names:
        if graph.stage(s).kind != StageKind.CONTRACTION:
            continue
        found, todo, seen = [], [s], {s}
        while todo:
            x = todo.pop()
            if x in own:
                found.append(x)
                continue
            for c in cons[x]:
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
        for c in found:
            if c not in bodies:
                bodies[c] = body_of(c)
        out[s] = tuple((c, bodies[c]) for c in sorted(found))
    return out


def _op_counts(nodes: Mapping[str, tuple]) -> dict:
    """Index-erased operation -> how many of the stages (stage -> `body_nodes`) have it."""
    seen: dict = {}
    for ops, _ in nodes.values():
        for k in {op[0] for op in ops}:
            seen[k] = seen.get(k, 0) + 1
    return seen


def _own_ops(st: Stage, nodes: tuple, seen: Mapping) -> tuple:
    """(flops, free variables, math op) of each operation of `st` (its `body_nodes`) that no other stage has,
    indices aside (`seen`: `_op_counts`; inlined, the printer may share one value), and of a reduction's
    combine, once per term of every distinct row the body reads."""
    ops = tuple((flops, v, math_op) for k, flops, v, math_op in nodes[0] if seen[k] == 1)
    if st.reduce:
        used = frozenset().union(*(v for _, v in nodes[1]), *(v for _, _, v, _ in nodes[0]))
        ops += ((1, frozenset(f"r{k}" for k in range(len(st.reduce))) | {v for v in used if v[0] == "i"}, False),)
    return ops


def _erased(e: E.Expr) -> tuple:
    """`e` with every index left out (loads by tensor name alone)."""
    if isinstance(e, E.Load):
        return ("load", e.tensor)
    if isinstance(e, E.IndexVal):
        return ("index",)
    if isinstance(e, E.Imm):
        return ("imm", e.value, e.dtype)
    if isinstance(e, E.Cast):
        return ("cast", e.dtype, _erased(e.x))
    if isinstance(e, E.Unary):
        return (e.op, _erased(e.x))
    if isinstance(e, E.Binary):
        return (e.op, _erased(e.a), _erased(e.b))
    return ("select", _erased(e.cond), _erased(e.a), _erased(e.b))


def _gemm_like(st: Stage) -> bool:
    """A contraction, or a sum of products the printer may take for a GEMM."""
    return st.kind == StageKind.CONTRACTION or (st.kind == StageKind.REDUCE and st.combine.value == "sum"
                                                and _is_product(st.body))


def _is_product(body: E.Expr) -> bool:
    while isinstance(body, E.Cast):
        body = body.x
    return isinstance(body, E.Binary) and body.op == "mul"


def body_nodes(stage: Stage) -> tuple[tuple, tuple]:
    """(operations, loads) of `stage`'s body outside any select's branches (a select's condition
    included; operations on indices alone left out), each distinct node once with its free variables:
    operations as (index-erased key, flops, variables, whether the kernel IR counts it as a math op: `_math`),
    loads as (tensor, variables), padded loads left out (the kernel IR loads none of their out-of-range reads:
    a padded max pool's border tiles count fewer loads than its typical tile's).
    Memoised like `box_loads`."""
    key = ("nodes", id(stage.body), stage.name)
    table = memo("floor.box_loads", 50000)
    hit = table.get(key)
    if hit is None or hit[0] is not stage.body:
        ops: dict = {}
        loads: dict = {}
        _free(stage.body, ops, loads, {}, True)
        # An operation on indices alone (a concatenation's `i0 == 3` arm conditions) is index arithmetic
        # the printer may fold per tile or row: the kernel IR's count may hold none of it (zoo-like lstm's
        # 32-arm concatenation of steps, on a host whose figures made it a segment of its own).
        value = (tuple((_erased(n), E.op_flops(n), v, _math(n)) for n, v in ops.items()
                       if any(isinstance(x, E.Load) for x in E.walk(n))),
                 tuple((n.tensor, v) for n, v in loads.items()))
        hit = table.put(key, (stage.body, value))
    return hit[1]


def _math(n: E.Expr) -> bool:
    """Whether the kernel IR counts node `n`'s flops as a math op's (`count.Work.op_flops`), which the host
    model charges at its math rate."""
    return isinstance(n, (E.Unary, E.Binary)) and n.op in E.OP_FLOPS and not E.small_pow(n)


def _free(e: E.Expr, ops: dict, loads: dict, seen: dict, plain: bool) -> frozenset:
    """Free variables of `e`; collects operations and loads reached outside select branches (`plain`)."""
    hit = seen.get((id(e), plain))
    if hit is not None:
        return hit
    if isinstance(e, E.Load):
        out = frozenset().union(*(ix.vars() for ix in e.index)) if e.index else frozenset()
        if plain and e.pad is None:  # a padded load's out-of-range reads load nothing (zoo resnet's max pool)
            loads[e] = out
    elif isinstance(e, E.IndexVal):
        out = e.expr.vars()
    elif isinstance(e, E.Select):
        out = _free(e.cond, ops, loads, seen, plain) | _free(e.a, ops, loads, seen, False) | _free(e.b, ops, loads, seen, False)
    else:
        out = frozenset().union(*(_free(c, ops, loads, seen, plain) for c in _children(e)))
        if plain and isinstance(e, (E.Unary, E.Binary)):
            ops[e] = out
    seen[(id(e), plain)] = out
    return out


def _full_axes(stage: Stage) -> frozenset:
    """The output variables of `stage`'s axes longer than one: a binding of them is an element."""
    return frozenset(f"i{d}" for d, n in enumerate(stage.shape) if n > 1)


# Elements of a reader whose index map is checked point by point (its index grids: 8 bytes per element and axis;
# larger readers are not claimed).
DISTINCT_CHECK_LIMIT = 1 << 20


def reads_distinct(graph: PrimGraph, reader: str, tensor: str) -> bool:
    """Whether stage `reader` reads a distinct element of `tensor` for each element of its own: some load of
    it outside any select's branches, unpadded, indexed by the output variables alone through a one-to-one
    map of the reader's elements (a box load naming every axis longer than one, or — a reshape, a roll by a modulo —
    an index map checked point by point over the reader's whole shape, up to DISTINCT_CHECK_LIMIT
    elements). Memoised per graph."""
    key = (graph.structural_hash, reader, tensor)
    return memo("floor.reads_distinct", 50000).lookup(key, lambda: _reads_distinct(graph.stage(reader), tensor))


def _reads_distinct(st: Stage, tensor: str) -> bool:
    import numpy as np

    from engine.ir import index as I

    full = _full_axes(st)
    stack, loads = [st.body], []
    while stack:
        e = stack.pop()
        if isinstance(e, E.Select):
            stack.append(e.cond)
        elif isinstance(e, E.Load):
            if e.tensor == tensor and e.pad is None:
                loads.append(e)
        else:
            stack.extend(_children(e))
    for load in loads:
        used = frozenset().union(*(ix.vars() for ix in load.index)) if load.index else frozenset()
        if any(v[0] != "i" for v in used) or any(ix.indirect_tensors() for ix in load.index):
            continue
        index = _box_index(load)
        if index is not None and full <= {d[0] for d in index if d is not None}:
            return True
        if not full <= used or math.prod(st.shape) > DISTINCT_CHECK_LIMIT:
            continue
        grid = np.indices(st.shape, dtype=np.int64).reshape(len(st.shape), -1)
        env = {f"i{d}": grid[d] for d in range(len(st.shape))}
        values = [I.evaluate(ix, env) for ix in load.index]
        if any(v is None for v in values):
            continue
        flat = np.zeros(grid.shape[1], dtype=np.int64)
        span = 1
        for v in values:  # any mixed radix: the extents the index takes
            lo, hi = int(v.min()), int(v.max())
            flat = flat * (hi - lo + 1) + (v - lo)
            span *= hi - lo + 1
        # One element each: no value twice (counted where the values span little more than the elements).
        if span <= 4 * flat.size:
            if np.bincount(flat, minlength=span).max() <= 1:
                return True
        elif np.unique(flat).size == flat.size:
            return True
    return False


def _evaluations(stage: Stage, box: Box, variables: frozenset, own: bool) -> int:
    """Evaluations of a node with free `variables` of `stage` computed on `box`: in a phase of its own,
    per element (and per term of the reduction where it depends on the reduce variables); inlined, per
    binding of its variables."""
    if own:
        return box_size(box) * _extent(stage, (), frozenset(v for v in variables if v[0] == "r"))
    return _extent(stage, box, variables)


def _extent(stage: Stage, box: Box, variables: frozenset) -> int:
    """Distinct bindings of `variables` over `box` (output axes) and the whole reduction."""
    n = 1
    for v in variables:
        k = int(v[1:])
        n *= box[k][1] - box[k][0] if v[0] == "i" else stage.reduce[k]
    return n


def _project(stage: Stage, box: Box, index: tuple) -> Box:
    """The box a box load of `stage` reads when the stage is computed on `box` (whole reductions)."""
    out = []
    for d in index:
        if d is None:
            out.append((0, 1))
            continue
        name, off = d
        lo, hi = box[int(name[1:])] if name[0] == "i" else (0, stage.reduce[int(name[1:])])
        out.append((lo + off, hi + off))
    return tuple(out)


def box_loads(stage: Stage) -> tuple[BoxLoad, ...]:
    """The box loads of `stage`'s body outside any select's branches (memoised on the body object,
    kept beside its entry so its id stays its own)."""
    key = (id(stage.body), stage.name)
    table = memo("floor.box_loads", 50000)
    hit = table.get(key)
    if hit is None or hit[0] is not stage.body:
        hit = table.put(key, (stage.body, _box_loads(stage.body)))
    return hit[1]


def _box_loads(body: E.Expr) -> tuple[BoxLoad, ...]:
    out: list[BoxLoad] = []
    stack = [body]
    while stack:
        e = stack.pop()
        if isinstance(e, E.Select):
            stack.append(e.cond)
            continue
        if isinstance(e, E.Load):
            index = _box_index(e)
            if index is not None:
                out.append((e.tensor, index))
            continue
        stack.extend(_children(e))
    return tuple(dict.fromkeys(out))


def _box_index(load: E.Load) -> tuple | None:
    if load.pad is not None:
        return None
    dims, seen = [], set()
    for ix in load.index:
        if not ix.terms:
            dims.append(None)
            continue
        if len(ix.terms) != 1 or ix.terms[0][1] != 1 or not ix.is_affine:
            return None
        name = ix.terms[0][0].name
        if name in seen or name[:1] not in ("i", "r") or not name[1:].isdigit():
            return None
        seen.add(name)
        dims.append((name, ix.const))
    return tuple(dims)


def _children(e: E.Expr) -> tuple:
    if isinstance(e, (E.Unary, E.Cast)):
        return (e.x,)
    if isinstance(e, E.Binary):
        return (e.a, e.b)
    return ()
