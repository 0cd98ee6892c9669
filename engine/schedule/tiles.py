"""Tile search: a kernel group (stages + edge connections) and a Device in, one Tile per segment out,
with the top-k candidates, the GroupCost and the violations of the chosen tiles.

Candidates are aligned to warps (32 threads) and transactions (32 floats), pruned by footprint and the
group rules, ranked best-first by (traffic + 1) × waves; the best modeled time among the top k wins.
A subgraph cache keyed on the group's canonical structure makes repeated layers schedule once."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from engine.codegen.count import CountBudgetError
from engine.codegen.generate import gemm_split, thread_splits
from engine.codegen.micro import micro_budget
from engine.codegen.mma import tf32_allowed
from engine.device import Device
from engine.errors import PlanError
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import PrimGraph, Stage, StageKind
from engine.memo import memo
from engine.schedule.cost import estimate_group, whole_graph_facts
from engine.schedule.floor import floor_us, score_floor
from engine.schedule.forked import serve_point
from engine.schedule.plan import Candidate, GroupCost, Tile
from engine.schedule.validate import (
    Violation,
    check_group,
    others_refused,
    recompute_bound,
    refused_early,
    refused_whatever_tiles,
)
from engine.tilegraph.tilegraph import _per_graph, segment_sinks, segments_of, tile_counts

TOP_K = 6
_POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class GroupSchedule:
    tiles: tuple[Tile, ...]
    candidates: tuple[Candidate, ...]
    cost: GroupCost | None
    violations: tuple[Violation, ...]
    k: int = TOP_K  # the candidates a search kept: a search asking for more cannot use this one
    above: float = 0.0  # a bounded search that found no tile modeling at or under this (µs): no tiles

    @property
    def ok(self) -> bool:
        return not self.violations


def _r32(n: int) -> int:
    return max(32, -(-int(n) // 32) * 32)


def make_tile(stage: Stage, shape: Sequence[int], threads: int, reduce_step: Sequence[int] = (),
              threads_per_row: int | None = None, row_split: int = 1, thread_shape: Sequence[int] = ()) -> Tile:
    """A Tile for `stage` with blocks and the row mapping derived from the shape and thread count."""
    shape = tuple(int(t) for t in shape)
    if stage.kind == StageKind.REDUCE:
        rows = math.prod(shape)  # each output element is one reduced row
    elif stage.kind == StageKind.CONTRACTION:
        rows = shape[-2] if len(shape) >= 2 else 1
    else:
        rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    if threads_per_row is None:
        limit = stage.reduce_size if stage.kind == StageKind.REDUCE else (shape[-1] if shape else 1)
        threads_per_row = max(1, min(limit, threads // max(1, rows)))
    if stage.kind == StageKind.CONTRACTION and not reduce_step:
        reduce_step = tuple(min(32, r) for r in stage.reduce)
    blocks = tile_counts(stage.shape, shape) * row_split
    return Tile(stage.name, shape, int(threads), blocks, tuple(reduce_step), max(1, rows), int(threads_per_row),
                int(row_split), tuple(int(t) for t in thread_shape))


def _spread(shape: Sequence[int], count: int) -> tuple[int, ...]:
    """Tile covering `count` elements of `shape`, filled from the innermost axis outwards."""
    out, rem = [1] * len(shape), count
    for k in range(len(shape) - 1, -1, -1):
        if rem <= 1:
            break
        out[k] = min(shape[k], rem)
        rem = -(-rem // out[k])
    return tuple(out)


# ---- the tile space beyond powers of two ---------------------------------------------------------
PAD_CUT = 0.2  # a non-power-of-two extent joins the space where it cuts the padded extent by this much
_INNER_ALIGN = 8  # innermost-axis extents stay whole 32-byte sectors of fp32
_STEPS = (8, 16, 32)  # k steps searched beside the whole reduction; 32: the default (the first candidate)
_WHOLE_K = 256  # the whole reduction is one step up to this many


def _extents(n: int, base: set[int], align: int = 1) -> list[int]:
    """`base` (extents of one axis of `n`) plus, for each extent t < n in it, the extent covering `n` in
    as many tiles as t does with the least padding, aligned up to `align`, where that cuts the padded
    extent ceil(n / t) * t by PAD_CUT or more (197 tokens: 128 pads to 256, 99 to 198; 50 for 64; 65 tokens:
    33 for 64, 22 for 32, not 13 for 16: 80 to 65 is under a fifth)."""
    out = set(base)
    for t in base:
        if t < n:
            count = -(-n // t)
            even = -(-n // count)
            b = -(-even // align) * align
            if b < t and -(-n // b) * b <= (1 - PAD_CUT) * count * t:
                out.add(b)
    return sorted(out)


def reduce_steps(graph: PrimGraph, segment: Sequence[str], stage: Stage, shape: Sequence[int], threads: int,
                 device: Device) -> list[tuple[int, ...]]:
    """k steps for the one contraction of a segment anchored at `stage`, tiled `shape` on `threads`: the
    default first (min(32, r) per reduce axis of a contraction anchor; none for another anchor: codegen's
    32), then each step of _STEPS and the whole reduction (up to _WHOLE_K) that pads k less than every
    smaller one and the default (ceil(k / s) * s: k = 197 steps by 8 or 197, not 32; k = 768 by 32 alone)
    and whose staging fits the device's budget (codegen prints it as recorded, not halved). An anchor
    inlining the contraction records its step as (s,). A segment with no or several contractions, or one
    reducing more than one axis (a direct convolution: its k step is the channel loop's), keeps the
    default. The count tells steps apart by padding and by staging bytes (blocks per SM); a smaller step
    for fewer staging bytes alone never entered a zoo plan (a100 and host, benchmarks/NOTES.md), so only
    the padding is searched."""
    default = tuple(min(32, r) for r in stage.reduce) if stage.kind == StageKind.CONTRACTION else ()
    found = [graph.stage(s) for s in segment if graph.stage(s).kind == StageKind.CONTRACTION]
    wide = [d for d, r in enumerate(found[0].reduce) if r > 1] if len(found) == 1 else []
    if len(wide) != 1 or len(shape) < 2 or found[0].reduce[wide[0]] % 32 == 0:
        return [default]
    k = found[0].reduce[wide[0]]
    limit = staging_limit(shape, threads, device)
    first = min(32, k)
    out, least = [default], -(-k // first) * first
    for s in sorted({min(s, k) for s in _STEPS} | ({k} if k <= _WHOLE_K else set())):
        if -(-k // s) * s < least and s <= limit:
            out.append(tuple(s if d == wide[0] else r for d, r in enumerate(stage.reduce))
                       if stage.name == found[0].name else (s,))
            least = -(-k // s) * s
    return out


def staging_limit(shape: Sequence[int], threads: int, device: Device, thread_shape: Sequence[int] = ()) -> int:
    """The largest k step whose GEMM staging (A and B panels of a tile `shape` on `threads` mapped as
    `thread_shape`, fp32) fits the device's budget: codegen halves a larger step (`generate._gemm_of`), so
    the plan would not say what runs."""
    tm, tn, tx, ty = gemm_split(math.prod(shape[:-1]), shape[-1], threads, tuple(thread_shape))
    return micro_budget(device).stage_bytes // (4 * (ty * tm + tx * tn))


def other_mappings(graph: PrimGraph, segment: Sequence[str], stage: Stage, shape: Sequence[int], threads: int,
                   step: Sequence[int], device: Device) -> list[tuple[int, int]]:
    """Thread mappings (ty, tx) beside the default for a GEMM tile `shape` on `threads`: those of
    `generate.thread_splits` (accumulators within the device's budget, none beaten on every term the
    model charges), where the segment's one contraction reduces one axis (a GEMM, as `reduce_steps`
    asks) and the recorded k step still fits the staging budget under the mapping. The default is the
    candidate without a mapping (`search_group` records it on the tile it chooses). None on a CPU device:
    the C target runs its own register-blocked micro-kernel whatever the mapping, so only the count's
    padded micro-tiles would differ, not the code (vit on the host preset chose 16x16 for that alone)."""
    if device.kind == "cpu":
        return []
    found = [graph.stage(s) for s in segment if graph.stage(s).kind == StageKind.CONTRACTION]
    if len(found) != 1 or len(shape) < 2 or sum(r > 1 for r in found[0].reduce) != 1 or any(
            t != 1 for t in shape[:-2]):
        return []
    budget = micro_budget(device)
    k = min(math.prod(step) if step else 32, math.prod(found[0].reduce))
    return [m for m in thread_splits(math.prod(shape[:-1]), shape[-1], threads, budget.accumulators)[1:]
            if k <= max(4, staging_limit(shape, threads, device, m))]


def record_mappings(graph: PrimGraph, segs: Sequence[Sequence[str]], conns: Mapping, tiles: Sequence[Tile],
                    device: Device) -> list[Tile]:
    """`tiles` with each GEMM segment's thread mapping written as its kernel runs it (the default where the
    tile had none), so the Plan says it; a segment without a GEMM, or run on another segment's larger
    block, records none (its block's threads are not its tile's)."""
    from engine.schedule.cost import segment_use

    block = max(t.threads for t in tiles)
    out = []
    for seg, tile in zip(segs, tiles):
        maps: set = set()
        if tile.threads == block and len(tile.shape) >= 2:
            try:
                maps = set(segment_use(graph, seg, conns, tile, device=device).gemm_maps)
            except (CountBudgetError, PlanError):
                maps = set()
        shape = next(iter(maps)) if len(maps) == 1 else ()
        out.append(tile if shape == tile.thread_shape else replace(tile, thread_shape=shape))
    return out


def candidate_tiles(graph: PrimGraph, segment: Sequence[str], anchor: str, device: Device, mode: str) -> list[Tile]:
    """The tiles a segment's search tries, in the order it ranks ties (`_tile_pool`); on a CPU device one per
    C kernel they print (`_one_per_code`)."""
    kinds = {graph.stage(s).kind for s in segment}
    pool = _tile_pool(graph, segment, anchor, device, mode, kinds)
    return _one_per_code(pool) if device.kind == "cpu" and StageKind.CONTRACTION not in kinds else pool


def _one_per_code(pool: list[Tile]) -> list[Tile]:
    """The first tile of each shape (with its k step, row split and mapping) in `pool`. On a CPU a segment
    without a contraction prints the same C whatever its tile's threads and lanes per row (its block is one
    loop nest over the tile: ctarget's printer leaves both out), so the others are the same kernel costed
    again — 29 % of the kernels zoo swin's cold welder plan built (benchmarks/RESULTS.md onepercode). The
    first is the one with the fewest lanes per row (the pool lists those first), whose kernel IR counts the
    loop the C code runs. A contraction's threads pick its C GEMM's micro-tiling (`ctarget.block_gemms`),
    so its pool is left whole."""
    seen: set = set()
    out = []
    for t in pool:
        key = (t.shape, t.reduce_step, t.row_split, t.thread_shape)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def splits_rows(stage: Stage, device: Device) -> bool:
    """Whether the stitch policy's pool for a reduction anchored at `stage` adds tiles that split its rows
    across blocks (fewer rows than SMs, long rows): the one way its pool differs from the other modes'."""
    return stage.kind == StageKind.REDUCE and stage.size < device.sm_count and stage.reduce_size >= 2048


def _tile_pool(graph: PrimGraph, segment: Sequence[str], anchor: str, device: Device, mode: str,
               kinds: set) -> list[Tile]:
    stage = graph.stage(anchor)
    out: list[Tile] = []
    if stage.kind == StageKind.REDUCE:
        length, rows = stage.reduce_size, stage.size
        for tpr in (1, 32, 128, 256, 512, 1024):
            if tpr > 1 and tpr > _r32(length):
                continue
            for rpb in _POW2:
                if rpb > rows or rpb * tpr > device.max_threads_per_block or (tpr > 1 and rpb * tpr < 32):
                    continue
                out.append(make_tile(stage, _spread(stage.shape, rpb), _r32(rpb * tpr), threads_per_row=tpr))
        if mode == "stitch" and splits_rows(stage, device):
            for split in (2, 4, 8):
                out.append(make_tile(stage, _spread(stage.shape, 1), 1024 if length >= 8192 else 256,
                                     threads_per_row=1024 if length >= 8192 else 256, row_split=split))
        return out
    rank = len(stage.shape)
    n = stage.shape[-1] if rank else 1
    m = stage.shape[-2] if rank >= 2 else 1
    gemm = StageKind.CONTRACTION in kinds
    full_row = n <= 4096 if not gemm else (n <= 1024 and StageKind.REDUCE in kinds) or n <= 256
    inner = _extents(n, {min(n, x) for x in (32, 64, 128, 256)} | ({n} if full_row else set()), _INNER_ALIGN)
    # A rank-4 (NCHW) anchor of a segment holding a contraction (a convolution) also tiles its
    # channels when the spatial tile is small: late stages of a CNN are a few pixels wide, and one
    # channel of 2x2 pixels would leave most of a block's threads without work.
    channels = stage.shape[1] if rank == 4 and gemm else 1
    # Whole rows of a segment that reduces them and computes a row vector they all read (a bias computed from
    # the columns alone, ALiBi-style): each block computes that vector again, so blocks of more rows amortise
    # it — up to half the device's per-block memory of rows (a row reduction's staged input holds them).
    wide = (not gemm and full_row and rank >= 2 and StageKind.REDUCE in kinds and m > 1
            and any(_one_row(graph.stage(s).shape, n) for s in segment if s != anchor))
    most = max(8192, device.max_smem_per_block_bytes // (2 * stage.dtype.itemsize)) if wide else 8192
    for bn in inner:
        for bm in _extents(m, {x for x in _POW2 if x <= m} | {m}):
            for bc in (c for c in _POW2 if c <= channels and (c == 1 or bm * bn * c // 2 < 256)):
                elems = bm * bn * bc
                full = bm == m and bn == n
                if elems > (16384 if gemm else most if bn == n else 8192) or (elems < 256 and not full) or (
                        bc > 1 and elems < 256 and bc < channels):
                    continue
                shape = (1,) * max(0, rank - 2) + ((bm, bn) if rank >= 2 else (bn,) if rank else ())
                if bc > 1:
                    shape = (1, bc, bm, bn)
                options = (min(256, _r32(elems // 8)),) if gemm else sorted({min(256, _r32(elems)), min(1024, _r32(elems // 4))})
                for threads in options:
                    for step in reduce_steps(graph, segment, stage, shape, threads, device):
                        out.append(make_tile(stage, shape, threads, step))
                        out.extend(make_tile(stage, shape, threads, step, thread_shape=m)
                                   for m in other_mappings(graph, segment, stage, shape, threads, step, device))
                if StageKind.REDUCE in kinds and bm <= 256 and bc == 1:
                    out.append(make_tile(stage, shape, _r32(bm), threads_per_row=1))  # thread per row
    return out


def _one_row(shape: Sequence[int], n: int) -> bool:
    """A stage of one row of `n` (any leading axes of extent 1)."""
    return len(shape) >= 2 and shape[-1] == n and math.prod(shape[:-1]) == 1


SEARCH_TABLE_LIMIT = 50000  # entries of "tiles.subgraph" and "tiles.above" (also kept on disk: schedcache.py)
# Their keys: (signature key, candidate pool, device[, bound]) — schedcache.py splits its files by the device.


def search_group(
    graph: PrimGraph, stages: Sequence[str], conns: Mapping, device: Device, mode: str,
    fixed: Mapping[str, Tile] | None = None, k: int = TOP_K, bound: float = math.inf,
) -> GroupSchedule:
    """Best valid tile per segment (fixed anchors keep their tile); violations when none is valid.
    `k`: how many of the last segment's best candidates to keep (1 when only the winner is wanted:
    a connection trial; the winner is the same for any k, and fewer candidates need costing).
    `bound` (µs; with k 1, a group with one segment with a choice of tiles): the caller has no use for a
    schedule modeling above it (a merge trial: the group apart, or another level's figure). Candidates
    whose floor, scaled by the share of their tile grid inside the anchor (`_fill`), passes the bound
    are not tried. The answer is the unbounded search's schedule where that models at or under the
    bound, or where no tile is valid and the bound cut no candidate (its violations name the rule), else
    no tiles and `above` set (the walk refuses either way; a group refused by every tile found in the
    unbounded cache keeps its rule even where the bound would have cut candidates: the wording, never
    the verdict, may depend on which search ran first). The pass ranks by the
    typical tile's modeled time (over which the floor is a floor), the schedule reports the exact cost,
    which counts edge tiles as they are: every candidate whose exact cost could be under the bound is
    still tried where the floor times `_fill` stays under the exact cost, and where the best tried is
    over the bound by the typical tile but not by its exact cost, the unbounded search decides. An
    unbounded search of the group made before answers from its cache."""
    fixed = fixed or {}
    names = list(stages)
    key, pools_of = _search_key(graph, stages, conns, device, mode, fixed)
    cache = memo("tiles.subgraph", SEARCH_TABLE_LIMIT)
    bounded = k == 1 and bound < math.inf
    hit = _cached(key, pools_of, device, names, k, bound)
    if hit is not None:
        return hit
    segs = segments_of(graph, stages, conns)
    chosen: list[Tile] = []
    pools: list[list[Tile]] = []
    for seg in segs:
        sinks = segment_sinks(graph, seg, conns)
        anchor = sinks[-1]
        if anchor in fixed:
            pool = [fixed[anchor]]
        else:
            pool = candidate_tiles(graph, seg, anchor, device, mode) or [make_tile(graph.stage(anchor), (1,) * len(graph.stage(anchor).shape), 32)]
        pools.append(pool)
        chosen.append(pool[0])
    local: dict = {}  # this search's memo: its connections are fixed
    # Where the connections alone break a rule, every candidate would be built and refused: the passes
    # skip the segments with a choice (a lone candidate is still costed, as a pass costs it).
    hopeless = refused_whatever_tiles(graph, stages, conns, segs)
    if bounded and (hopeless or sum(len(pool) > 1 for pool in pools) != 1 or border_lighter(graph, stages)):
        return _under(search_group(graph, stages, conns, device, mode, fixed, k), bound)  # nothing (safe) to cut
    best_cands, violations, best_us = _search_pass(graph, stages, conns, device, k, segs, pools, chosen, local,
                                                   hopeless, bound if bounded else math.inf)
    if bounded and best_us > bound and local.get(("bound-cut",)):
        # The pass ranks by the typical tile; the schedule reports the exact cost, which may be the lower.
        # Where the best tried is under the bound that way, the unbounded search decides.
        if best_us < math.inf and _exact_under(graph, stages, conns, chosen, device, segs, local, bound):
            return _under(search_group(graph, stages, conns, device, mode, fixed, k), bound)
        return memo("tiles.above", SEARCH_TABLE_LIMIT).put((key, pools_of, device, bound), _above(bound))
    if violations and len(segs) > 1:
        # Segments are searched one at a time against the others' current tiles; behind grid barriers
        # the one-wave rule couples them, so start again from each segment's smallest grid.
        chosen[:] = [min(pool, key=lambda t: (t.blocks, -t.threads)) for pool in pools]
        best_cands, violations, _ = _search_pass(graph, stages, conns, device, k, segs, pools, chosen, local,
                                                 hopeless)
    if not violations:
        chosen[:] = record_mappings(graph, segs, conns, chosen, device)
    try:
        cost = estimate_group(graph, stages, conns, chosen, device, segs=segs, local=local, exact=True)
    except (CountBudgetError, PlanError):
        if not violations:
            raise
        cost = None  # refused already (the violations say why): nothing to cost
    out = GroupSchedule(tuple(chosen), best_cands, cost, violations, k)
    canonical = _rename(out, list(stages), [f"s{j}" for j in range(len(stages))])
    cache.put((key, pools_of, device), canonical)
    return _under(out, bound) if bounded else out


def search_cached(graph: PrimGraph, stages: Sequence[str], conns: Mapping, device: Device, mode: str,
                  fixed: Mapping[str, Tile] | None = None, k: int = TOP_K, bound: float = math.inf) -> GroupSchedule | None:
    """`search_group`'s answer where its tables hold it already (nothing searched), else None."""
    key, pools_of = _search_key(graph, stages, conns, device, mode, fixed or {})
    return _cached(key, pools_of, device, list(stages), k, bound)


def _search_key(graph: PrimGraph, stages: Sequence[str], conns: Mapping, device: Device, mode: str,
                fixed: Mapping[str, Tile]) -> tuple:
    """(key, pool kind) a group's search is kept under in the subgraph cache."""
    canon = {s: f"s{j}" for j, s in enumerate(stages)}
    # Fixed tiles join the key with their anchors renamed (a GLOBAL_SYNC trial keeps each side's
    # tiles: the same structure one layer on hits the cache too).
    pinned = tuple(sorted((canon[s], replace(fixed[s], stage=canon[s])) for s in stages if s in fixed))
    key = (group_signature(graph, stages, conns), pinned, recompute_bound(), tf32_allowed(),
           whole_graph_facts(graph, device))
    # Only stitch's candidate pool differs, and only where a reduction may split its rows, so the other
    # modes share their searches, and stitch shares the rest: the Compare page's unfused plan finds the
    # one-stage searches the welder plan made before it, and welder's stitch plan (`at_least_stitch`)
    # the walk's searches of the groups both build.
    split = mode == "stitch" and any(splits_rows(graph.stage(s), device) for s in stages)
    pools_of = "stitch" if split else "tiles"
    return key, pools_of


def _cached(key, pools_of: str, device: Device, names: list, k: int, bound: float) -> GroupSchedule | None:
    bounded = k == 1 and bound < math.inf
    named, cache = memo("tiles.named", 20000), memo("tiles.subgraph", SEARCH_TABLE_LIMIT)
    hit = named.get((key, pools_of, device, tuple(names)))
    if hit is not None and hit.k >= k:
        return _under(hit, bound) if bounded else hit
    hit = cache.get((key, pools_of, device))
    if hit is not None and hit.k >= k:
        hit = named.put((key, pools_of, device, tuple(names)), _rename(hit, [f"s{j}" for j in range(len(names))], names))
        return _under(hit, bound) if bounded else hit
    if bounded:  # bounded searches that found nothing under their bound
        return memo("tiles.above", SEARCH_TABLE_LIMIT).get((key, pools_of, device, bound))
    return None


def border_lighter(graph: PrimGraph, stages: Sequence[str]) -> bool:
    """Whether a group's border tiles may do less than its typical (interior) tile — a stage selecting
    between loads (a concatenation: the typical tile's regions read every arm) or padding one (a border tile
    loads none of its out-of-range taps) — so its exact cost may model under the typical tile's floor times
    `_fill` (zoo lstm's concatenation of the steps' outputs on host: 0.70 µs exact against a floor of 1.10).
    Its bounded searches cut nothing by the floor: the unbounded search decides (a cut there refused zoo
    lstm's SHARED merge into the input projection, which the exhaustive search keeps)."""
    table = memo("tiles.border_lighter", 50000)
    return any(table.lookup((graph.structural_hash, s), lambda s=s: any(
        isinstance(n, E.Select) or (isinstance(n, E.Load) and n.pad is not None) for n in E.walk(graph.stage(s).body)))
        for s in stages)


def _above(bound: float) -> GroupSchedule:
    return GroupSchedule((), (), None, (), 1, above=bound)


def _under(sched: GroupSchedule, bound: float) -> GroupSchedule:
    """A bounded search's answer from the unbounded search's schedule: it, where it is refused (its
    violations say why) or models at or under `bound`; else no tiles, `above` set."""
    if sched.violations:
        return sched
    if sched.cost is None or sched.cost.modeled_us > bound:
        return _above(bound)
    return sched


def under_tighter(sched: GroupSchedule, wider: float, bound: float) -> GroupSchedule | None:
    """A bounded search's answer under `bound` from its answer `sched` under `wider` (≥ `bound`), as
    `search_group` gives it (a forked child's search for the walk, `build.SearchAhead`): a found schedule is the
    unbounded one wherever it models under its bound, so `_under` it; nothing under `wider` is nothing under
    `bound`; a refusal: None (under `bound` the search may cut a candidate the wider bound did not, and then
    words it as nothing under the bound)."""
    if sched.violations:
        return None
    if bound >= wider:
        return sched
    return _above(bound) if sched.above else _under(sched, bound)


def _exact_under(graph, stages, conns, chosen: list[Tile], device: Device, segs, local: dict, bound: float) -> bool:
    """Whether `chosen` (the best a bounded pass tried) is valid and its exact cost, as `search_group`
    reports it, models at or under `bound`."""
    if check_group(graph, stages, conns, chosen, device, segs=segs, local=local):
        return False
    tiles = record_mappings(graph, segs, conns, chosen, device)
    try:
        return estimate_group(graph, stages, conns, tiles, device, segs=segs, local=local, exact=True).modeled_us <= bound
    except CountBudgetError:
        return False


def _search_pass(graph, stages, conns, device: Device, k: int, segs, pools, chosen: list[Tile], local: dict,
                 hopeless: bool = False, bound: float = math.inf):
    """One pass over the segments, each taking its best valid tile given the others' (in `chosen`,
    updated in place); the last segment's top-k candidates, the group's violations and the best modeled
    time of the last segment with a choice of tiles (inf where it had no valid candidate) come back.
    `bound`: no candidate whose floor times `_fill` passes it is tried (`search_group`; the search's
    `local` then records the cut), and where one was cut and the last segment has no valid candidate at or
    under the bound nothing more is checked (no violations come back).
    `hopeless`: `check_group` refuses every choice of tiles (`refused_whatever_tiles`), so a segment
    with several candidates keeps its tile without any being tried (each would be skipped as invalid)."""
    best_cands: tuple[Candidate, ...] = ()
    best_us = math.inf
    for j, pool in enumerate(pools):
        if len(pool) > 1:
            best_us = math.inf
        if hopeless and len(pool) > 1:
            continue
        if len(pool) == 1 and j < len(pools) - 1:
            # A lone candidate keeps its tile whatever it costs; only the last segment's top k come back,
            # so costing the group here would build and count the other segments' current tiles for
            # nothing (zoo mobilevit on host: 3,754 of the 7,019 candidates its passes costed).
            continue
        trials = [chosen[:j] + [t] + chosen[j + 1:] for t in pool]
        # Candidates in order of their floor (regions only, no kernel built): once the floor passes the
        # k-th best modeled time found, no candidate left can enter the top k, valid or not.
        floors = [floor_us(graph, stages, conns, trial, device, segs, local) for trial in trials] if len(pool) > 1 else [0.0]
        # Among equal floors, the least score floor first: where the floor is exact, the best is then
        # costed first and the candidates that could at most tie it are skipped (`_cannot_enter`).
        scores = [score_floor(trial, device, local) for trial in trials] if len(pool) > 1 else [0.0]
        scored = []
        for i in sorted(range(len(pool)), key=lambda i: (floors[i], scores[i])):
            serve_point()
            if floors[i] > _kth_best(scored, k) + _FLOOR_SLACK:
                break
            if floors[i] * _fill(graph, pool[i]) > bound + _FLOOR_SLACK:
                local[("bound-cut",)] = True
                continue  # over the bound by its exact cost too (`search_group`)
            if _cannot_enter(scored, k, floors[i], scores[i]):
                continue
            t, trial = pool[i], trials[i]
            if len(pool) > 1 and (refused_early(graph, stages, conns, trial, device, segs, j, local) or (
                    len(segs) > 1 and others_refused(graph, stages, conns, trial, device, segs, j, local))):
                continue  # check_group would refuse it: skipped without building its kernel
            bad = check_group(graph, stages, conns, trial, device, segs=segs, local=local)
            if bad and len(pool) > 1:
                continue
            try:
                cost = estimate_group(graph, stages, conns, trial, device, segs=segs, local=local)
            except CountBudgetError:
                continue  # refused by check_group (rule 9) already; a lone candidate is kept below anyway
            except PlanError:
                if not bad:
                    raise
                continue  # a kernel codegen cannot build, refused by check_group (its segment_sink rule) already
            traffic = cost.traffic_bytes["dram"] + cost.traffic_bytes["l2"]
            scored.append(((traffic + 1) * cost.waves, cost.modeled_us, t, cost, traffic, i))
        if not scored:
            continue  # no valid tile: keep the default and report its violations below
        scored.sort(key=_rank)
        top = _distinct(scored)[:k]
        best = min(top, key=lambda x: x[1])
        chosen[j] = best[2]
        if len(pool) > 1:
            best_us = best[1]
        if len(segs) == 1 or j == len(pools) - 1:
            best_cands = tuple(Candidate(t, round(s, 1), int(tr), c.waves) for s, _, t, c, tr, _ in top)
    if best_us > bound and local.get(("bound-cut",)):
        return best_cands, (), best_us
    return best_cands, tuple(check_group(graph, stages, conns, chosen, device, segs=segs, local=local)), best_us


def _fill(graph: PrimGraph, tile: Tile) -> float:
    """The share of a tile grid's elements inside its anchor (1 where the tiles divide it): the floor is
    one under the typical tile's modeled time, which stands for every tile, and the exact cost counts
    the edge tiles as they are — down to this share of it (zoo vit on host: 65 rows in tiles of 64, the
    exact cost half the typical tile's figure)."""
    shape = graph.stage(tile.stage).shape
    padded = math.prod(-(-n // t) * t for n, t in zip(shape, tile.shape))
    return math.prod(shape) / padded if padded else 1.0


_FLOOR_SLACK = 1e-3  # µs: modeled times are rounded to 1e-4, a floor sums its terms in another order


def _rank(item: tuple) -> tuple:
    """Best first by modeled time, then score; ties keep the pool's order."""
    return item[1], item[0], item[5]


def _kth_best(scored: list, k: int) -> float:
    """The modeled time a candidate must not exceed to enter the top k of `scored` (inf while fewer)."""
    if len(scored) < k:
        return math.inf
    top = _distinct(sorted(scored, key=_rank))
    return top[k - 1][1] if len(top) >= k else math.inf


# How far under the exact sum a floor's float sum of its terms (in another order) may fall: relative.
_FLOAT_ERROR = 1e-12


def _models_at_least(floor: float, time: float) -> bool:
    """Whether a candidate whose floor is `floor` models (rounded to 1e-4 µs, as `estimate_group` reports) no
    less than `time`: its own time is at least its floor less float error, and rounding keeps that order.
    A floor exact to the last digit may sit half a unit under the time it rounds to (bert12 on host: a GEMM
    floored at 122.54325000071 µs and modeled at 122.5433, as every tile of it ties)."""
    return round(floor - abs(floor) * _FLOAT_ERROR - _FLOAT_ERROR, 4) >= time


def _cannot_enter(scored: list, k: int, floor: float, score: float) -> bool:
    """Whether a candidate whose floor is `floor` and score floor `score` (`floor.score_floor`) cannot enter
    the top k of `scored`: it models no less than the k-th best (`_models_at_least`), so it could only tie
    that one's time, and its score is above that one's, which breaks the tie
    (`_rank`). Many candidates tie on a CPU: the same flops, the same bytes, serial or compute-bound
    whatever the tiling (bert12 on host: 68 % of those costed, benchmarks/NOTES.md tiecount); costing them
    built a kernel each to lose the tie-break."""
    if len(scored) < k:
        return False
    top = _distinct(sorted(scored, key=_rank))
    if len(top) < k:
        return False
    kth = top[k - 1]
    return score > kth[0] and _models_at_least(floor, kth[1])


def _distinct(scored: list) -> list:
    """Drop candidates indistinguishable from a better-ranked one (same tile shape, same score and
    modeled time — e.g. one tile under two thread mappings that cost the same), so the top k holds k
    different tilings rather than crowding a better one out."""
    seen: set[tuple] = set()
    out = []
    for item in scored:
        key = (item[2].shape, item[2].row_split, item[0], item[1])
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


# ---- subgraph cache -------------------------------------------------------------------------
# The session's "tiles.subgraph" table holds each searched group under its signature with canonical
# stage names (s0, s1, ...); "tiles.named" holds hits already renamed to a group's own stage names.


def group_signature(graph: PrimGraph, stages: Sequence[str], conns: Mapping) -> str:
    """`_group_signature`, memoised on the stage names and their internal connections (the walk asks
    for the same groups' signatures over and over)."""
    members = set(stages)
    inner = tuple(str(conns.get((p, c), "kernel")) for p in stages for c in graph.consumers.get(p, ()) if c in members)
    key = (graph.structural_hash, tuple(stages), inner)
    return memo("tiles.signature", 50000).lookup(key, lambda: _group_signature(graph, stages, conns))


def canonical_names(graph: PrimGraph, stages: Sequence[str]) -> dict[str, str]:
    """The names `_group_signature` gives a group's stages (s0, s1, ... in order) and the tensors they
    read from outside it (x<n>, in order of first read): two groups with one signature map alike."""
    names: dict[str, str] = {s: f"s{j}" for j, s in enumerate(stages)}
    for s in stages:
        for t in graph.stage(s).inputs:
            if t not in names:
                names[t] = f"x{len(names)}"
    return names


def _group_signature(graph: PrimGraph, stages: Sequence[str], conns: Mapping) -> str:
    """Structural hash of a group: stage kinds, shapes and bodies with tensor names canonicalised,
    its internal connections, and which stages are also read outside (their writes cost traffic)."""
    names = canonical_names(graph, stages)
    members = set(stages)
    texts = _per_graph("tiles.signature_texts", graph, dict)  # what each stage's part is made of, once a graph
    parts: list[str] = []
    read: set[str] = set()
    for s in stages:
        got = texts.get(s)
        if got is None:
            got = texts[s] = _stage_text(graph, s)
        inputs, fixed, pieces, is_output, consumers = got
        for t in inputs:
            if t not in members and t not in read:
                read.add(t)
                spec = texts.get(("spec", t))
                if spec is None:
                    spec = texts[("spec", t)] = _spec_text(graph, t)
                parts.append(names[t] + spec)
        outside = is_output or any(c not in members for c in consumers)
        body = "".join([p if k % 2 == 0 else names.get(p, p) for k, p in enumerate(pieces)])
        parts.append(f"{names[s]}{fixed}{outside}|{body}")
    for p in stages:
        for c in texts[p][4]:
            if c in members:
                parts.append(f"{names[p]}>{names[c]}={conns.get((p, c), 'kernel')}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def _stage_text(graph: PrimGraph, name: str) -> tuple:
    """What `_group_signature` makes a stage's part of: its inputs, the text naming no tensor
    ("|kind|shape|dtype|reduce|combine|"), its body template split at the markers (text, tensor, text, ...:
    `_MARK.split`, filled with a group's naming instead of running the pattern over the body), whether the model
    outputs it and its consumers."""
    st = graph.stage(name)
    fixed = f"|{st.kind.value}|{st.shape}|{st.dtype.value}|{st.reduce}|{st.combine}|"
    return (st.inputs, fixed, tuple(_MARK.split(_body_template(st))), name in graph.outputs,
            tuple(graph.consumers.get(name, ())))


def _spec_text(graph: PrimGraph, tensor: str) -> str:
    spec = graph.specs[tensor]
    return f":{spec.shape}:{spec.dtype.value}"


_MARK = re.compile("\x00([^\x01]*)\x01")


class _Marked(dict):
    """A naming that leaves a marker for every tensor (`_body_template`)."""

    def get(self, key, default=None):
        return f"\x00{key}\x01"


def _body_template(stage: Stage) -> str:
    """`_canon(stage.body, names)` with a marker in place of every tensor name, memoised on the body (kept
    beside its entry so its id stays its own): a group's signature fills the markers with its naming."""
    key = (id(stage.body), stage.name)
    table = memo("tiles.body_templates", 50000)
    hit = table.get(key)
    if hit is None or hit[0] is not stage.body:
        hit = table.put(key, (stage.body, _canon(stage.body, _Marked())))
    return hit[1]


def erased_body(stage: Stage) -> str:
    """`stage`'s body as a group's signature writes it, with every tensor name left out: two stages that compute
    alike from different tensors (one layer's and the next's) have the same text."""
    return _MARK.sub("t", _body_template(stage))


def _canon(e: E.Expr, names: Mapping[str, str]) -> str:
    if isinstance(e, E.Load):
        return f"{names.get(e.tensor, e.tensor)}[{', '.join(_canon_index(ix, names) for ix in e.index)}]{e.pad}"
    if isinstance(e, E.IndexVal):
        return f"index:{e.dtype.value}({_canon_index(e.expr, names)})"
    if isinstance(e, (E.Unary, E.Cast)):
        return f"{getattr(e, 'op', 'cast')}:{e.dtype.value}({_canon(e.x, names)})"
    if isinstance(e, E.Binary):
        return f"{e.op}({_canon(e.a, names)},{_canon(e.b, names)})"
    if isinstance(e, E.Select):
        return f"sel({_canon(e.cond, names)},{_canon(e.a, names)},{_canon(e.b, names)})"
    return E.format_expr(e)


def _canon_index(ix: I.Lin, names: Mapping[str, str]) -> str:
    """An index's text with the tensors it gathers through (Gather's indices) renamed as the group's
    loads are: two layers gathering through different index tensors of one shape sign alike."""
    gathered = ix.indirect_tensors()
    if not gathered:
        return str(ix)
    for k, t in enumerate(gathered):  # through placeholders, so a new name never meets an old one
        ix = I.rename_tensor(ix, t, f"\0{k}")
    for k, t in enumerate(gathered):
        ix = I.rename_tensor(ix, f"\0{k}", names.get(t, t))
    return str(ix)


def _rename(s: GroupSchedule, old: list[str], new: list[str]) -> GroupSchedule:
    m = dict(zip(old, new))
    tiles = tuple(replace(t, stage=m.get(t.stage, t.stage)) for t in s.tiles)
    cands = tuple(replace(c, tile=replace(c.tile, stage=m.get(c.tile.stage, c.tile.stage))) for c in s.candidates)
    return GroupSchedule(tiles, cands, s.cost, s.violations if not s.violations else tuple(
        replace(v, subject=_sub(v.subject, m), message=_sub(v.message, m)) for v in s.violations), s.k, s.above)


def _sub(text: str, m: Mapping[str, str]) -> str:
    """`text` with each name in `m` renamed, one followed by ".." too (rule 7 names a segment "first.."): left
    as it was, the cached message of one layer's group named a stage of the layer that was searched first."""
    def one(t: re.Match) -> str:
        word = t.group(0)
        if word not in m and word.endswith("..") and word[:-2] in m:
            return m[word[:-2]] + ".."
        return m.get(word, word)

    return re.sub(r"[^\s',()]+", one, text)
