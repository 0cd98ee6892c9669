"""Welder policy: the tile-graph over all stages including contractions — first connect (each edge at
REGISTER or SHARED when the group's tile search finds a valid tile and the modeled time does not get
worse; failing both, GLOBAL_SYNC under the same test), then schedule (the tiles found on the way).
The subgraph cache makes repeated layers free."""

from __future__ import annotations

from engine.device import Device
from engine.ir.graph import PrimGraph, StageKind
from engine.schedule.build import assemble, connect_greedy
from engine.schedule.plan import Conn, Plan
from engine.schedule.stitch import broadcast_axes


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


def plan_welder(graph: PrimGraph, device: Device, options: dict, started: float) -> Plan:
    conns, reasons, scores, log, kept = connect_greedy(graph, device, "welder", welder_levels, welder_fallback)
    return assemble(graph, device, conns, policy="welder", mode="welder", reasons=reasons, scores=scores,
                    decisions=log, options=options, started=started, fixed=kept)
