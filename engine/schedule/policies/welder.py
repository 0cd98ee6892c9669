"""Welder policy: the tile-graph over all stages including contractions — first connect (each edge at
REGISTER or SHARED when the group's tile search finds a valid tile and the modeled time does not get
worse; failing both, GLOBAL_SYNC under the same test), then schedule (the tiles found on the way).
The subgraph cache makes repeated layers free."""

from __future__ import annotations

import dataclasses
import time

from engine.device import Device
from engine.ir.graph import PrimGraph, StageKind
from engine.schedule.build import assemble, connect_greedy
from engine.schedule.cost import estimate_group
from engine.schedule.plan import Conn, Plan
from engine.schedule.stitch import broadcast_axes
from engine.schedule.tiles import search_group


def welder_levels(graph: PrimGraph, edge: tuple[str, str]) -> list[tuple[Conn, str]]:
    p, c = edge
    ps, cs = graph.stage(p), graph.stage(c)
    if ps.kind == StageKind.CONTRACTION and cs.kind != StageKind.CONTRACTION and not broadcast_axes(graph, p, c):
        register = "register: contraction epilogue in the accumulator's registers"
    else:
        register = "register: value recomputed in the consuming thread"
    shared = ("shared: contraction operand tile staged in shared memory" if cs.kind == StageKind.CONTRACTION
              else "shared: producer tile staged in shared memory for the block")
    return [(Conn.REGISTER, register), (Conn.SHARED, shared)]


def welder_fallback(graph: PrimGraph, edge: tuple[str, str]) -> list[tuple[Conn, str]]:
    """Tried only when neither on-chip level is legal and faster (e.g. FFN1's output is too big for a
    block's shared memory): the producer stays in global memory — in L2 when it fits — and a grid
    barrier replaces the kernel boundary (AStitch's global level; the grid must fit one wave)."""
    return [(Conn.GLOBAL_SYNC, "global_sync: producer kept in global memory (L2 when it fits), grid barrier "
             "instead of a kernel boundary")]


WALK_MARGIN = 0.05  # how much faster the stitch plan must model to replace the walk's


def plan_welder(graph: PrimGraph, device: Device, options: dict, started: float) -> Plan:
    return at_least_stitch(graph, device, options, welder_walk(graph, device, options, started), started)


def welder_walk(graph: PrimGraph, device: Device, options: dict, started: float) -> Plan:
    """The walk's own plan: first connect (Welder's greedy pass over the edges), then schedule."""
    conns, reasons, scores, log, kept = connect_greedy(graph, device, "welder", welder_levels, welder_fallback)
    return assemble(graph, device, conns, policy="welder", mode="welder", reasons=reasons, scores=scores,
                    decisions=log, options=options, started=started, fixed=kept)


def stitch_floor(graph: PrimGraph, device: Device) -> float:
    """A floor under the stitch plan's modeled time on a GPU, without planning it (0 on a CPU, or where a
    contraction has no valid tile): the stitch policy leaves every contraction alone in its kernel (no level
    joins an edge that touches one), so its plan holds each contraction's own tile search — the one the walk
    made already for the contraction apart — costed at that search's tiles with every input another stage
    touches warm in L2 (the plan's L2 residency can only make fewer of them warm; an input no other kernel
    touches is cold). On a CPU the plan's coarsening may retile those kernels outside the search's pool, so no
    floor is claimed there. On a100 it rules the stitch plan out on 11 of 12 zoo models, all but lstm, where
    the plan was made only to be refused (benchmarks/NOTES.md stitchfloor)."""
    if device.kind == "cpu":
        return 0.0
    total = 0.0
    for stage in graph.stages:
        if stage.kind != StageKind.CONTRACTION:
            continue
        sched = search_group(graph, [stage.name], {}, device, "stitch", k=1)
        if sched.violations or sched.cost is None:
            return 0.0
        # Warm at best: an input another stage writes or reads too (a weight only this one reads is cold).
        warm = [t for t in stage.inputs if graph.is_stage(t) or len(graph.consumers.get(t, ())) > 1]
        total += estimate_group(graph, [stage.name], {}, sched.tiles, device, exact=True, warm=warm).modeled_us
    return total


def at_least_stitch(graph: PrimGraph, device: Device, options: dict, plan: Plan, started: float) -> Plan:
    """The walk's plan, or the stitch policy's plan where that models faster. The walk is greedy: one
    pass over the edges in topological order, each merge kept when it does not model slower there and
    then, before the plan-level terms (L2 residency across kernels on a GPU, the C target's coarsening on
    a host). So it can end slower than the stitch plan by its own model — zoo mobilevit on a one-thread
    host (tests/data/devices/host_epyc_1t.json) 999.9 against 664.8 us until the host's coarsening was held to
    the model (build.COARSEN_SLACK: 611.7 against 664.8 since); zoo gpt2 and bert on a100 did too until the walk
    costed a side at the tiles it kept (benchmarks/NOTES.md sched4) — while a policy should
    not be clearly worse than another one by the model it plans with. The stitch plan is taken only when
    it models faster by more than WALK_MARGIN: below that the two are a tie at the model's resolution, and
    the walk's plan (the welder fusion a user asked for) stays (at most WALK_MARGIN slower by the model). The choice and both figures open the
    decision log."""
    from engine.schedule.policies.stitch import plan_stitch

    least = stitch_floor(graph, device)
    if least >= plan.modeled_us * (1 - WALK_MARGIN):
        why = (f"welder: the walk's plan models {plan.modeled_us:.1f} us, the stitch policy's contraction kernels "
               f"alone at least {least:.1f} us: the walk's kept (the stitch plan, not {WALK_MARGIN:.0%} faster, "
               "not made)")
        return dataclasses.replace(plan, decisions=(why,) + plan.decisions,
                                   schedule_seconds=round(time.perf_counter() - started, 4))
    other = plan_stitch(graph, device, options, time.perf_counter())
    spent = round(time.perf_counter() - started, 4)
    if other.modeled_us >= plan.modeled_us * (1 - WALK_MARGIN):
        why = (f"welder: the walk's plan models {plan.modeled_us:.1f} us, the stitch policy's "
               f"{other.modeled_us:.1f} us: the walk's kept"
               + (f" (the stitch plan is not {WALK_MARGIN:.0%} faster)" if other.modeled_us < plan.modeled_us else ""))
        return dataclasses.replace(plan, decisions=(why,) + plan.decisions, schedule_seconds=spent)
    why = (f"welder: the stitch policy's plan models {other.modeled_us:.1f} us, under the {plan.modeled_us:.1f} us "
           "of the walk's (greedy, one pass in topological order): the stitch plan taken; its decisions follow")
    return dataclasses.replace(other, policy="welder", decisions=(why,) + other.decisions, schedule_seconds=spent)
