"""AStitch building blocks: how a consumer reads a producer (one-to-one or broadcast), which stages
dominate (reductions; expensive elementwise feeding a broadcast), and the stitching schemes each
edge may take (local = REGISTER, regional = SHARED, global = GLOBAL_SYNC) with their reasons."""

from __future__ import annotations

from engine.ir import expr as E
from engine.ir.graph import PrimGraph, Stage, StageKind
from engine.schedule.cost import load_axes
from engine.schedule.plan import Conn

EXPENSIVE_FLOPS = 4  # per element: one transcendental (exp, erf, pow, tanh) makes a stage expensive
CHEAP = (StageKind.ELEMENTWISE, StageKind.LAYOUT)


def broadcast_axes(graph: PrimGraph, producer: str, consumer: str) -> frozenset[str]:
    """Consumer output axes (extent > 1) its loads of `producer` ignore: non-empty = one-to-many."""
    cons = graph.stage(consumer)
    used, _ = load_axes(cons, producer)
    return frozenset(f"i{k}" for k, d in enumerate(cons.shape) if d > 1 and f"i{k}" not in used)


def is_expensive(stage: Stage) -> bool:
    return stage.kind in CHEAP and E.count_flops(stage.body) >= EXPENSIVE_FLOPS


def is_dominant(graph: PrimGraph, name: str) -> bool:
    """AStitch's dominant ops: reductions, and expensive elementwise ops feeding a broadcast."""
    stage = graph.stage(name)
    if stage.kind == StageKind.REDUCE:
        return True
    return is_expensive(stage) and any(broadcast_axes(graph, name, c) for c in graph.consumers.get(name, ()))


def stitch_levels(graph: PrimGraph, edge: tuple[str, str]) -> list[tuple[Conn, str]]:
    """Schemes AStitch may use for one edge, each with why it is allowed; [] = never stitched."""
    p, c = edge
    ps, cs = graph.stage(p), graph.stage(c)
    if ps.kind == StageKind.CONTRACTION or cs.kind == StageKind.CONTRACTION:
        return []
    spread = broadcast_axes(graph, p, c)
    regional = (Conn.SHARED, "regional: dominant result staged in shared memory for the block")
    glob = (Conn.GLOBAL_SYNC, "global: grid barrier, grid packed into one resident wave")
    if ps.kind == StageKind.REDUCE:
        return [(Conn.REGISTER, "local: row reduction kept by the thread owning the row"), regional, glob]
    if not spread:
        return [(Conn.REGISTER, "local: one-to-one")]
    if is_expensive(ps):
        return [regional, glob, (Conn.REGISTER, "local: expensive producer recomputed per use")]
    return [(Conn.REGISTER, "local: cheap producer recomputed per use"), regional]
