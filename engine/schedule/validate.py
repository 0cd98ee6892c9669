"""Legality of a Plan: a Plan (or one group of it), the PrimGraph and a Device in, every broken rule
out as a Violation naming the edge or group and the rule — never an exception.

Rules: 1 footprint, 2 register_one_to_many, 3 shared_locality, 4 global_sync_wave, 5 group_cycle,
6 foreign_plan, 7 segment_sink, 8 stage_coverage, 9 recompute. Rules 2 and 9 read the kernel IR's
work count of the segment (engine/codegen/count.py): a value inlined at REGISTER is evaluated as often
as the printed code evaluates it — a reduction exactly once per element, anything else at most
`recompute_bound` times (a plan option, default 2)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from engine.codegen.count import CountBudgetError
from engine.codegen.mma import tensor_core_options, tf32_allowed
from engine.device import Device, resident_blocks_per_sm
from engine.errors import PlanError
from engine.ir.graph import PrimGraph, StageKind
from engine.memo import memo
from engine.schedule.cost import at_kernel_block, segment_use
from engine.schedule.plan import SCHEMA_VERSION, Conn, Plan, Tile, components
from engine.tilegraph.propagate import box_size
from engine.tilegraph.tilegraph import inner_edges, segment_sinks, segments_of, tile_counts

RULES = {
    "footprint": 1, "register_one_to_many": 2, "shared_locality": 3, "global_sync_wave": 4,
    "group_cycle": 5, "foreign_plan": 6, "segment_sink": 7, "stage_coverage": 8, "recompute": 9,
}
RECOMPUTE_BOUND = 2.0  # default: a value inlined at REGISTER may be evaluated at most twice per element
_BOUND: ContextVar[float] = ContextVar("recompute_bound", default=RECOMPUTE_BOUND)


def recompute_bound() -> float:
    """The bound in force: the plan option `recompute_bound` while a plan with it is made or checked."""
    return _BOUND.get()


@contextmanager
def bounded(options: Mapping | None):
    """Plan and validate under the plan's `recompute_bound` option (default RECOMPUTE_BOUND) and its
    `tf32` option (engine/codegen/mma.py: whether fp32 GEMMs may run on TF32 tensor cores)."""
    value = (options or {}).get("recompute_bound", RECOMPUTE_BOUND)
    token = _BOUND.set(float(value))
    try:
        with tensor_core_options(options):
            yield
    finally:
        _BOUND.reset(token)


@dataclass(frozen=True)
class Violation:
    rule: str  # a key of RULES
    subject: str  # "edge a -> b", "group k03_...", "stage x"
    message: str

    def __str__(self) -> str:
        return f"rule {RULES[self.rule]} ({self.rule}) broken by {self.subject}: {self.message}"


@dataclass(frozen=True)
class Decision:
    """Every no has a reason: `ok`, why, and the score (modeled µs) that drove it."""

    ok: bool
    reason: str
    score: float | None = None
    tiles: tuple = ()  # the merged group's tiles the verdict was reached with (one per segment)
    # The merged group evaluates every element of its stages once (GroupCost.extra_evaluations 0) and runs no
    # segment serially (GroupCost.serial_segments 0): `build.staging_saves_nothing` reads it.
    once: bool = False


def check_group(
    graph: PrimGraph, stages: Sequence[str], conns: Mapping, tiles: Sequence[Tile], device: Device,
    name: str = "", segs: Sequence[Sequence[str]] | None = None, local: dict | None = None,
) -> list[Violation]:
    """Rules 1, 2, 3, 4, 7 for one kernel group with one tile per segment (`segs`: the group's
    segments when the caller has them already)."""
    name = name or f"group of {stages[0]}"
    out: list[Violation] = []
    segs = segs if segs is not None else segments_of(graph, stages, conns)
    if len(tiles) != len(segs):
        return [Violation("segment_sink", f"group {name}",
                          f"{len(segs)} segments (split at grid barriers) but {len(tiles)} tiles")]
    seg_of = {s: k for k, seg in enumerate(segs) for s in seg}
    for seg, tile in zip(segs, at_kernel_block(tiles)):
        sinks = segment_sinks(graph, seg, conns)
        if len(sinks) != 1:
            out.append(Violation("segment_sink", f"group {name}",
                                 f"segment {seg[0]}.. has {len(sinks)} sinks ({', '.join(sinks)}); a segment "
                                 "needs exactly one (cut an edge to a separate kernel)"))
            continue
        if tile.stage != sinks[0]:
            out.append(Violation("segment_sink", f"group {name}",
                                 f"tile anchors '{tile.stage}' but the segment's sink is '{sinks[0]}'"))
            continue
        out.extend(_checked_tile(graph, seg, conns, tile, device, name, local))
    inner = [(p, c) for p in stages for c in graph.consumers.get(p, ()) if c in seg_of]
    out.extend(_edge_violations(conns, inner, seg_of))
    # The wave rule costs every segment's kernel: not where one is refused as unbuildable or too dear already
    # (a gather through indices its own segment computes: building it raises, zoo-like MoE routing on a100).
    if any(conns.get(e) == Conn.GLOBAL_SYNC for e in inner) and not any(
            v.rule in ("recompute", "segment_sink") for v in out):
        out.extend(_check_wave(graph, segs, conns, tiles, device, name, local))
    return out


def _edge_violations(conns: Mapping, inner: Sequence[tuple[str, str]], seg_of: Mapping[str, int]) -> list[Violation]:
    """`check_group`'s rules on the group's inner edges alone (no tile read)."""
    out = []
    for p, c in inner:
        if conns.get((p, c), Conn.KERNEL) == Conn.KERNEL:
            out.append(Violation("group_cycle", f"edge {p} -> {c}",
                                 "kernel edge inside one group: the consumer would wait for its own kernel to end "
                                 "(fuse this edge too, or cut the other path between them)"))
        if conns.get((p, c)) == Conn.GLOBAL_SYNC and seg_of[p] >= seg_of[c]:
            out.append(Violation("shared_locality", f"edge {p} -> {c}",
                                 "global_sync inside one segment: the consumer's block needs the whole producer, "
                                 "which other blocks compute (make every path between them global_sync)"))
    return out


def refused_whatever_tiles(graph: PrimGraph, stages: Sequence[str], conns: Mapping,
                           segs: Sequence[Sequence[str]]) -> bool:
    """True when `check_group(graph, stages, conns, tiles, device, segs=segs)` reports a violation for
    every choice of tiles: a segment without exactly one sink (rule 7), or an inner edge `check_group`
    refuses from the connections and segments alone (a kernel edge inside the group, a grid barrier
    inside one segment or back to an earlier one). The tile search then builds no candidate: each would
    be refused (tests/engine/schedule/test_search_structure.py)."""
    if any(len(segment_sinks(graph, seg, conns)) != 1 for seg in segs):
        return True
    seg_of = {s: k for k, seg in enumerate(segs) for s in seg}
    inner = [(p, c) for p in stages for c in graph.consumers.get(p, ()) if c in seg_of]
    return bool(_edge_violations(conns, inner, seg_of))


def refused_early(graph: PrimGraph, stages: Sequence[str], conns: Mapping, tiles: Sequence[Tile], device: Device,
                  segs: Sequence[Sequence[str]], j: int, local: dict | None = None) -> bool:
    """True when `check_group(graph, stages, conns, tiles, device, segs=segs)` certainly reports a
    violation, found from segment `j`'s tile and its regions alone — no kernel IR built (False: not
    known; `check_group` decides). The tile search skips such a candidate without costing it. Each test
    is one `_check_tile` / `_check_wave` makes, or a bound on it: rule 7 (the segment's one sink anchors
    the tile), rule 1's shape, thread and register limits (`cost.segment_registers`, the figure
    `segment_use` reports), rule 3 (a SHARED producer's region over a block's shared memory; rows split
    only for a reduction behind a grid barrier), rule 9 from `floor.flops_floor` (never above the kernel
    IR's count; only for tiles dividing the anchor evenly, where the typical tile's count alone decides),
    and rule 4 against the blocks an SM could hold were shared memory free and every segment's registers
    those of segment `j`. `local`: the tile search's memo (its connections and segments are fixed)."""
    own, kt = tiles[j], max(t.threads for t in tiles)
    local = {} if local is None else local
    key = ("early", j, own, kt, recompute_bound())
    regs = local.get(key)
    if regs is None:
        tile = own if own.threads == kt else dataclasses.replace(own, threads=kt)  # `at_kernel_block`
        regs = local[key] = _early_tile(graph, segs[j], conns, tile, own, device, j, local)
    if regs < 0:
        return True
    if device.kind != "cpu" and _has_sync(graph, stages, conns, local):
        most = resident_blocks_per_sm(device, kt, regs, 0)[0]
        if max(t.blocks for t in tiles) > most * device.sm_count:
            return True
    return False


def others_refused(graph: PrimGraph, stages: Sequence[str], conns: Mapping, tiles: Sequence[Tile], device: Device,
                   segs: Sequence[Sequence[str]], j: int, local: dict | None = None) -> bool:
    """True when `check_group(graph, stages, conns, tiles, device, segs=segs, local=local)` reports a
    violation of a segment other than `j` — its own checks (`_checked_tile`, rule 7), which depend on
    segment `j`'s tile only through the kernel's block (`at_kernel_block`). The tile search asks this of
    a candidate of segment `j` before `check_group` builds the candidate's kernel IR: where another
    segment's tile is refused at that block, every candidate giving the kernel that block is refused
    (a multi-segment search starts every segment at its pool's first tile, which may be illegal), and
    the check of the other segments is the one `check_group` makes, from the same memo. Then rule 4 (a
    grid barrier's blocks all resident at once) at the residency the other segments' registers and shared
    memory and segment `j`'s registers allow (its shared memory taken as none, so never fewer blocks than
    `_check_wave` finds): the registers `refused_early` found for segment `j` in this search (`local`)."""
    name = f"group of {stages[0]}"
    at_block = at_kernel_block(tiles)
    for k, (seg, tile) in enumerate(zip(segs, at_block)):
        if k == j:
            continue
        sinks = segment_sinks(graph, seg, conns)
        if len(sinks) != 1 or tile.stage != sinks[0] or _checked_tile(graph, seg, conns, tile, device, name, local):
            return True
    if device.kind == "cpu" or local is None or not _has_sync(graph, stages, conns, local):
        return False
    kt = max(t.threads for t in tiles)
    own = local.get(("early", j, tiles[j], kt, recompute_bound()))
    if own is None or own < 0:
        return False
    uses = [segment_use(graph, seg, conns, t, local, device=device) for k, (seg, t) in enumerate(zip(segs, at_block))
            if k != j]
    regs = min(device.max_regs_per_thread, max([own] + [u.regs_per_thread for u in uses]))
    most, _ = resident_blocks_per_sm(device, kt, regs, max(u.shared_bytes for u in uses))
    return max(t.blocks for t in tiles) > most * device.sm_count


def _has_sync(graph: PrimGraph, stages: Sequence[str], conns: Mapping, local: dict) -> bool:
    """Whether a grid barrier joins two stages of the group (`_check_wave` runs then)."""
    hit = local.get(("has-sync",))
    if hit is None:
        group = set(stages)
        hit = local[("has-sync",)] = any(conns.get((p, c)) == Conn.GLOBAL_SYNC for p in stages
                                         for c in graph.consumers.get(p, ()) if c in group)
    return hit


def _early_tile(graph: PrimGraph, seg: Sequence[str], conns: Mapping, tile: Tile, own: Tile, device: Device,
                j: int, local: dict) -> int:
    """-1 when `_check_tile` certainly reports a violation for `tile` (the kernel's block) on `seg`, else
    the registers per thread it would find (`own`: the candidate's tile at its own thread count)."""
    from engine.schedule.cost import segment_regions, segment_registers
    from engine.schedule.floor import floor_regions, flops_floor

    fixed = local.get(("early-seg", j))
    if fixed is None:  # what does not depend on the tile, once per segment of the search
        sinks = segment_sinks(graph, seg, conns)
        members = set(seg)
        staged = tuple((p, graph.stage(p).dtype.itemsize) for p in seg if any(
            c in members and conns.get((p, c)) == Conn.SHARED for c in graph.consumers.get(p, ())))
        once = sum(graph.stage(p).flops for p in seg) if len(seg) > 1 else 0
        fixed = local[("early-seg", j)] = (sinks[0] if len(sinks) == 1 else None, staged, once)
    sink, staged, once = fixed
    if tile.stage != sink:
        return -1
    anchor = graph.stage(tile.stage)
    if len(tile.shape) != len(anchor.shape) or any(t < 1 for t in tile.shape):
        return -1
    if not 1 <= tile.threads <= device.max_threads_per_block:
        return -1
    if tile.row_split > 1 and not (anchor.kind == StageKind.REDUCE and tile.stage not in graph.outputs and all(
            conns.get((tile.stage, c)) == Conn.GLOBAL_SYNC for c in graph.consumers.get(tile.stage, ()))):
        return -1
    regions = floor_regions(own, j, local) or segment_regions(graph, seg, conns, tile)
    regs = segment_registers(graph, seg, tile, regions)
    if regs > device.max_regs_per_thread:
        return -1
    for p, itemsize in staged:
        pbox = regions.stages.get(p)
        if pbox is not None and box_size(pbox) * itemsize > device.max_smem_per_block_bytes:
            return -1
    # Rule 9 (segments of two or more stages) where the typical tile's count alone decides: no ragged edge.
    if once and not any(n % t for n, t in zip(anchor.shape, tile.shape)):
        # The floor may exceed the count by float rounding (1e-6 relative at most, tests/…/test_floor.py).
        if flops_floor(graph, seg, conns, own, j, local) > once * recompute_bound() * (1 + 1e-9) * (1 + 1e-6):
            return -1
    return regs


def _checked_tile(graph, seg, conns, tile: Tile, device: Device, name: str, local: dict | None = None) -> list[Violation]:
    """`_check_tile`, memoised: a tile search re-checks every segment's unchanged tile per candidate
    (`local`: the search's own memo, keyed on segment and tile alone — its connections are fixed)."""
    if local is not None:
        lkey = ("check", tuple(seg), tile, name, recompute_bound(), tf32_allowed())
        if lkey not in local:
            local[lkey] = _checked_tile(graph, seg, conns, tile, device, name)
        return list(local[lkey])
    # The segment's own edges, and the anchor's edges out of it (the row-split rule reads whether they are
    # all grid barriers).
    out = tuple(str(conns.get((tile.stage, c), Conn.KERNEL)) for c in graph.consumers.get(tile.stage, ()))
    key = (graph.structural_hash, tuple(seg), inner_edges(graph, seg, conns), out, tile, device, name,
           recompute_bound(), tf32_allowed())
    return list(memo("validate.tile_checks", 50000).lookup(
        key, lambda: tuple(_check_tile(graph, seg, conns, tile, device, name))))


def _check_tile(graph, seg, conns, tile: Tile, device: Device, name: str) -> list[Violation]:
    out: list[Violation] = []
    anchor = graph.stage(tile.stage)
    subject = f"group {name}"
    if len(tile.shape) != len(anchor.shape) or any(t < 1 for t in tile.shape):
        return [Violation("footprint", subject, f"tile {list(tile.shape)} does not fit the rank-"
                          f"{len(anchor.shape)} output of '{tile.stage}'")]
    want = tile_counts(anchor.shape, tile.shape) * tile.row_split
    if tile.blocks != want:
        out.append(Violation("footprint", subject, f"tile says {tile.blocks} blocks but {list(tile.shape)} "
                             f"(row_split {tile.row_split}) over {list(anchor.shape)} needs {want}"))
    if not 1 <= tile.threads <= device.max_threads_per_block:
        return out + [Violation("footprint", subject, f"{tile.threads} threads per block (limit "
                                f"{device.max_threads_per_block})")]
    try:
        use = segment_use(graph, seg, conns, tile, device=device)
    except CountBudgetError as err:
        return out + [Violation("recompute", subject, str(err))]
    except PlanError as err:
        return out + [Violation("segment_sink", subject, str(err))]
    if use.shared_bytes > device.max_smem_per_block_bytes:
        out.append(Violation("footprint", subject, f"needs {use.shared_bytes} B of shared memory per block, "
                             f"device has {device.max_smem_per_block_bytes} B (use a smaller tile)"))
    if use.regs_per_thread > device.max_regs_per_thread:
        out.append(Violation("footprint", subject, f"needs ~{use.regs_per_thread} registers per thread, limit "
                             f"{device.max_regs_per_thread} (use more threads or a smaller tile)"))
    members = set(seg)
    for p in seg:
        for c in graph.consumers.get(p, ()):
            conn = conns.get((p, c))
            if c not in members or conn != Conn.SHARED:
                continue
            pbox = use.regions.stages.get(p)
            if pbox is not None:
                size = box_size(pbox) * graph.stage(p).dtype.itemsize
                if size > device.max_smem_per_block_bytes:
                    out.append(Violation("shared_locality", f"edge {p} -> {c}",
                                         f"the block needs {size} B of '{p}', more than fits in shared memory "
                                         f"({device.max_smem_per_block_bytes} B)"))
    if tile.thread_shape and tuple(set(use.gemm_maps)) != (tile.thread_shape,):
        out.append(Violation("footprint", subject, mapping_refusal(tile, use.gemm_maps)))
    found = _recompute(graph, seg, conns, tile, use)
    ragged = any(n % t for n, t in zip(anchor.shape, tile.shape))
    if ragged and any(v.rule == "recompute" for v in found):
        # One typical tile stood for every tile: edge tiles are smaller. Count them as they print.
        found = _recompute(graph, seg, conns, tile, segment_use(graph, seg, conns, tile, exact=True, device=device))
    out.extend(found)
    if tile.row_split > 1:
        ok_split = anchor.kind == StageKind.REDUCE and tile.stage not in graph.outputs and all(
            conns.get((tile.stage, c)) == Conn.GLOBAL_SYNC for c in graph.consumers.get(tile.stage, ()))
        if not ok_split:
            out.append(Violation("shared_locality", subject,
                                 f"row_split {tile.row_split} splits rows of '{tile.stage}' across blocks; only a "
                                 "reduction whose every consumer is behind a grid barrier may do that"))
    return out


def mapping_refusal(tile: Tile, built: Sequence[tuple[int, int]]) -> str:
    """Why a tile's recorded thread mapping is not what codegen prints (one line naming what fits)."""
    ty_tx = "x".join(map(str, tile.thread_shape))
    if not built:
        return (f"thread_shape {ty_tx} of '{tile.stage}': its segment runs no tiled GEMM (with this tile and "
                f"{tile.threads} threads), so there is no mapping to choose (leave thread_shape empty)")
    return (f"thread_shape {ty_tx} of '{tile.stage}' is not printable on the kernel's {tile.threads} threads "
            f"(codegen runs {' / '.join('x'.join(map(str, m)) for m in sorted(set(built)))})")


def inlined_stages(graph: PrimGraph, seg: Sequence[str], conns: Mapping, anchor: str) -> list[str]:
    """Stages of a segment codegen inlines into their consumers: every in-segment consumer connected at
    REGISTER, nothing outside the segment reading them (engine/codegen/generate.py)."""
    members = set(seg)
    out = []
    for p in seg:
        cons = graph.consumers.get(p, ())
        if p == anchor or p in graph.outputs or any(c not in members for c in cons):
            continue
        if all(conns.get((p, c)) == Conn.REGISTER for c in cons):
            out.append(p)
    return out


def _recompute(graph: PrimGraph, seg: Sequence[str], conns: Mapping, tile: Tile, use) -> list[Violation]:
    """Rules 2 and 9 from the kernel IR's count of the segment. Rule 2: a reduction inlined at REGISTER
    is evaluated once per element its block needs — never again inside a consumer's per-element loop
    (however far the value holding it is inlined). Rule 9: a fused segment's printed code does at most
    recompute_bound() times the flops of its stages computed once (the kernel IR's count): inlined uses,
    overlapping tiles (halos, broadcasts, rows split across blocks) and partly filled micro-tiles count
    alike. The edge named is the one out of the stage whose recomputed work costs the most."""
    inlined = set(inlined_stages(graph, seg, conns, tile.stage))
    members = set(seg)
    blocks = tile.blocks / max(1, tile.row_split)
    out, done, once, worst = [], 0.0, 0.0, None
    for p in seg:
        st = graph.stage(p)
        evals = use.evaluations.get(p, 0.0)
        weight = max(1, st.point_flops) * st.reduce_size
        once += st.size * weight
        done += evals * blocks * weight
        cons = [c for c in graph.consumers.get(p, ()) if c in members]
        c = next((c for c in cons if conns.get((p, c)) == Conn.REGISTER), cons[0] if cons else None)
        if c is None:
            continue
        box = use.regions.stages.get(p)
        if p in inlined and st.reduce and box is not None and box_size(box):
            per_tile = evals / box_size(box)
            if per_tile > 1 + 1e-9:
                via = next((d for d in graph.consumers.get(c, ()) if c in inlined and d in members), None)
                where = f"'{c}'" + (f" (inlined into '{via}')" if via else "")
                out.append(Violation("register_one_to_many", f"edge {p} -> {c}",
                                     f"recompute {_times(per_tile)} > 1x: '{p}' is a reduction, and {where} would "
                                     f"evaluate each of its elements {_times(per_tile)} (a reduction is computed "
                                     "once: connect it, or the value that spreads it, at shared)"))
        extra = (evals * blocks - st.size) * weight
        if worst is None or extra > worst[0]:
            worst = (extra, p, c, evals * blocks / max(1, st.size))
    bound = recompute_bound()
    counted = use.flops_fp32 * blocks + use.flops_tc * blocks
    flops_once = sum(graph.stage(p).flops for p in seg)
    factor = counted / flops_once if flops_once else 1.0
    if len(seg) > 1 and factor > bound * (1 + 1e-9):
        if worst is not None and worst[0] > 0.05 * (done - once) and worst[3] > 1 + 1e-9:
            _, p, c, own = worst
            how = ("inlined at every use" if p in inlined else
                   "on the overlapping regions of its blocks (halos, broadcasts, rows split across blocks)")
            out.append(Violation("recompute", f"edge {p} -> {c}",
                                 f"recompute {_times(factor)} > {bound:g}x: the segment's printed code would do "
                                 f"{_times(factor)} the flops of its stages computed once, most of the excess "
                                 f"'{p}' computed {_times(own)} its size, {how} (connect at shared, use a larger "
                                 "tile, cut the edge, or raise the plan's recompute_bound)"))
        else:
            out.append(Violation("recompute", f"group of {tile.stage}",
                                 f"recompute {_times(factor)} > {bound:g}x: the segment's printed code would do "
                                 f"{_times(factor)} the flops of its stages computed once, in micro-tiles its tile "
                                 f"fills only in part ({list(tile.shape)} on {tile.threads} threads; use a tile "
                                 "that fits its threads, or raise the plan's recompute_bound)"))
    return out


def _times(f: float) -> str:
    return f"{f:,.0f}x" if f >= 10 else f"{f:.2g}x"


def _check_wave(graph, segs, conns, tiles, device: Device, name: str, local: dict | None = None) -> list[Violation]:
    if device.kind == "cpu":
        return []  # the C target runs a grid barrier's segments in turn, each an OpenMP loop over all its tiles
    threads = max(t.threads for t in tiles)
    uses = [segment_use(graph, s, conns, t, local, device=device) for s, t in zip(segs, at_kernel_block(tiles))]
    regs = min(device.max_regs_per_thread, max(u.regs_per_thread for u in uses))
    resident, _ = resident_blocks_per_sm(device, threads, regs, max(u.shared_bytes for u in uses))
    wave = resident * device.sm_count
    blocks = max(t.blocks for t in tiles)
    if blocks > wave:
        return [Violation("global_sync_wave", f"group {name}",
                          f"grid barrier with {blocks} blocks but only {wave} are resident at once "
                          f"({resident}/SM x {device.sm_count} SMs): blocks would wait forever (pack rows)")]
    return []


def find_group_cycle(graph: PrimGraph, groups: Sequence[Sequence[str]]) -> list[int]:
    """Indices of groups on some cycle of the group DAG (empty when acyclic)."""
    of = {s: k for k, g in enumerate(groups) for s in g}
    succ: dict[int, set[int]] = {k: set() for k in range(len(groups))}
    for p, c in graph.edges:
        if p in of and c in of and of[p] != of[c]:
            succ[of[p]].add(of[c])
    indeg = {k: 0 for k in succ}
    for k in succ:
        for j in succ[k]:
            indeg[j] += 1
    ready = [k for k, d in indeg.items() if d == 0]
    while ready:
        k = ready.pop()
        for j in succ[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return sorted(k for k, d in indeg.items() if d > 0)


def validate(plan: Plan, graph: PrimGraph, device: Device) -> list[Violation]:
    """Every violation of the nine rules (empty list: the plan is legal), under the plan's own
    recompute bound."""
    with bounded(dict(plan.options)):
        return _validate(plan, graph, device)


def _validate(plan: Plan, graph: PrimGraph, device: Device) -> list[Violation]:
    out: list[Violation] = []
    if plan.schema != SCHEMA_VERSION:
        out.append(Violation("foreign_plan", "plan", f"schema {plan.schema}, this tileweave reads {SCHEMA_VERSION}"))
    if plan.model_hash != graph.structural_hash:
        out.append(Violation("foreign_plan", "plan", f"made for model '{plan.model_name}' ({plan.model_hash}), "
                             f"not this one ({graph.structural_hash})"))
        return out
    conns = {e.key: e.conn for e in plan.edges}
    missing = [e for e in graph.edges if e not in conns]
    extra = [k for k in conns if k not in set(graph.edges)]
    for p, c in missing + extra:
        out.append(Violation("stage_coverage", f"edge {p} -> {c}",
                             "missing from the plan" if (p, c) in missing else "not an edge of this model"))
    seen: dict[str, int] = {}
    for g in plan.groups:
        for s in g.stages:
            seen[s] = seen.get(s, 0) + 1
    for s in graph.stages:
        if seen.get(s.name, 0) != 1:
            out.append(Violation("stage_coverage", f"stage {s.name}", f"in {seen.get(s.name, 0)} groups, must be in 1"))
    unknown = sorted(set(seen) - set(graph.stage_map))
    for s in unknown:
        out.append(Violation("stage_coverage", f"stage {s}", "not a stage of this model"))
    if out:
        return out
    want = [tuple(c) for c in components(graph, conns)]
    if sorted(want) != sorted(tuple(g.stages) for g in plan.groups):
        out.append(Violation("stage_coverage", "plan", "groups are not the connected components of the fused edges"))
        return out
    for k in find_group_cycle(graph, [g.stages for g in plan.groups]):
        out.append(Violation("group_cycle", f"group {plan.groups[k].name}",
                             "on a cycle of the kernel DAG: a stage outside the group sits between two of its "
                             "stages (split one of the fused edges)"))
    for g in plan.groups:
        out.extend(check_group(graph, g.stages, conns, g.segments, device, g.name))
    return out
