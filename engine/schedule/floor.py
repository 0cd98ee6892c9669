"""A floor under a kernel's modeled time from its tiles' regions alone, no kernel IR built: a group's
stages, connections and one candidate Tile per segment in, microseconds out (`floor_us`), never above
what `cost.estimate_group` models for the same tiles. The tile search costs candidates in floor order
and stops where the floor passes the modeled times it must beat."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from engine.device import Device, resident_blocks_per_sm
from engine.ir import expr as E
from engine.ir.graph import PrimGraph, Stage, StageKind
from engine.memo import memo
from engine.schedule import cost as C
from engine.schedule.plan import Conn, Tile
from engine.tilegraph.propagate import Box, box_size
from engine.tilegraph.tilegraph import GroupRegions, stage_order

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
    every residency the block size allows — plus the launch and the grid barriers. `local`: the tile
    search's memo (its connections and segments are fixed), for the per-segment bytes."""
    total = device.launch_overhead_s * 1e6 + (len(segs) - 1) * device.grid_barrier_s * 1e6
    in_llc = C._in_llc(graph, device)
    local = {} if local is None else local
    members = set(stages)
    seg_of = {s: k for k, seg in enumerate(segs) for s in seg}
    _, written = C._group_writes(graph, stages, conns, seg_of, device, in_llc, local)
    # Registers and shared memory only lower the blocks an SM holds: the thread count bounds them.
    most = max(1, resident_blocks_per_sm(device, max(t.threads for t in tiles), 0, 0)[0])
    elementwise = device.elementwise_flops or device.peak_fp32_flops
    for k, (seg, tile) in enumerate(zip(segs, tiles)):
        fkey = ("floor-work", k, tile.stage, tile.shape, tile.blocks, tile.row_split)
        got = local.get(fkey)
        if got is None:
            regions = C.segment_regions(graph, seg, conns, tile)
            per_block = tile.blocks / max(1, tile.row_split)
            dram = C._read_dram(graph, members, C._read_lines(graph, regions), per_block, device, in_llc)
            glob, macs, other = work_floor(graph, seg, conns, regions) if tile.row_split == 1 else (0.0, 0.0, 0.0)
            compute = macs / max(device.peak_fp32_flops, elementwise) + other / elementwise
            got = local[fkey] = (dram + written.get(k, 0), glob * per_block, compute * per_block)
        dram, glob, compute = got
        # From ceil(blocks / SMs) blocks per SM on, more residency changes nothing: no need to try those.
        fits = -(-max(1, tile.blocks) // device.sm_count)
        warps = max(1, -(-tile.threads // device.warp_size))
        best = math.inf
        for r in range(1, min(most, fits) + 1):
            memory, _, arith = C.latency_efficiency(device, min(r, fits) * warps)
            terms = [dram / device.dram_bw_bytes_per_s * 1e6 / memory, glob / device.l2_bw_bytes_per_s * 1e6 / memory,
                     0.0, compute * 1e6 / arith]
            best = min(best, C._bound(terms, device) * C.wave_quantisation(device, tile.blocks, r))
        total += best
    return total


def work_floor(graph: PrimGraph, segment: Sequence[str], conns: Mapping, regions: GroupRegions) -> tuple[float, float, float]:
    """(global bytes, contraction flops, other flops) the kernel IR of one block of `segment` counts at
    least, from its regions. A stage not inlined is computed on every element of its region, an inlined
    one at least on what a consumer so computed reads of it through a box load. Every element a box load
    reads of a tensor from outside the segment is loaded at least once (per tensor the largest such box;
    loads under a select's branches are left out: the printer may load one of them); the anchor stores
    its tile. Per element computed: a contraction's multiply-add per term, a reduction's combine per
    term (the rest of a reduction's body: each distinct operation once per term where it depends on the
    reduce variables, else once), and once each distinct operation of another stage's body — counting
    no operation that another stage of the segment has too (the printer may share one value)."""
    members = set(segment)
    names = sorted(segment, key=stage_order(graph).__getitem__)
    anchor = regions.anchor
    cons = {s: [c for c in graph.consumers.get(s, ()) if c in members] for s in names}
    dense: dict[str, Box | None] = {}
    for s in reversed(names):
        outside = s in graph.outputs or any(c not in members for c in graph.consumers.get(s, ()))
        inline = s != anchor and not outside and all(conns.get((s, c)) == Conn.REGISTER for c in cons[s])
        if not inline:
            dense[s] = regions.stages.get(s)
            continue
        best = None
        for c in cons[s]:
            if dense.get(c) is None:
                continue
            for t, index in box_loads(graph.stage(c)):
                if t == s:
                    box = _project(graph.stage(c), dense[c], index)
                    if best is None or box_size(box) > box_size(best):
                        best = box
        dense[s] = best
    most: dict[str, int] = {}
    ops = {s: body_ops(graph.stage(s)) for s in names}
    shared = {n for s in names for t in names if t != s for n in ops[s][0] if n in ops[t][0]}
    macs = other = 0.0
    for s in names:
        if dense.get(s) is None:
            continue
        st = graph.stage(s)
        elems = box_size(dense[s])
        for t, index in box_loads(st):
            if t not in members:
                most[t] = max(most.get(t, 0), box_size(_project(st, dense[s], index)))
        if st.kind == StageKind.CONTRACTION:
            macs += elems * st.reduce_size * (2 if _is_product(st.body) else 1)
        elif st.kind == StageKind.REDUCE and st.combine.value == "sum" and _is_product(st.body):
            other += elems * st.reduce_size  # the printer may take it for a GEMM's: its combine alone
        else:
            found, varying = ops[s]
            per_term = sum(E.op_flops(n) for n in varying if n not in shared)
            once = sum(E.op_flops(n) for n in found - varying if n not in shared)
            other += elems * (st.reduce_size * (per_term + (1 if st.reduce else 0)) + once)
    loads = sum(n * graph.specs[t].dtype.itemsize for t, n in most.items())
    store = box_size(regions.stages.get(anchor)) * graph.stage(anchor).dtype.itemsize
    return float(loads + store), float(macs), float(other)


def _is_product(body: E.Expr) -> bool:
    while isinstance(body, E.Cast):
        body = body.x
    return isinstance(body, E.Binary) and body.op == "mul"


def body_ops(stage: Stage) -> tuple[frozenset, frozenset]:
    """(the distinct arithmetic nodes — unary and binary operations — of `stage`'s body outside any
    select, those of them that depend on a reduce variable), memoised like `box_loads`."""
    key = ("ops", id(stage.body), stage.name)
    table = memo("floor.box_loads", 50000)
    hit = table.get(key)
    if hit is None or hit[0] is not stage.body:
        found, varying = set(), set()
        _reduce_dependent(stage.body, found, varying, {})
        hit = table.put(key, (stage.body, (frozenset(found), frozenset(varying))))
    return hit[1]


def _reduce_dependent(e: E.Expr, found: set, varying: set, seen: dict) -> bool:
    """Whether `e` depends on a reduce variable; collects the operations outside selects on the way."""
    hit = seen.get(id(e))
    if hit is not None:
        return hit
    if isinstance(e, E.Load):
        dep = any(v.startswith("r") for ix in e.index for v in ix.vars())
    elif isinstance(e, E.IndexVal):
        dep = any(v.startswith("r") for v in e.expr.vars())
    elif isinstance(e, E.Select):
        dep = any([_reduce_dependent(c, set(), set(), seen) for c in E.children(e)])
    else:
        dep = any([_reduce_dependent(c, found, varying, seen) for c in _children(e)])
        if isinstance(e, (E.Unary, E.Binary)):
            found.add(e)
            if dep:
                varying.add(e)
    seen[id(e)] = dep
    return dep


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
