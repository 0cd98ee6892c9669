"""Stitch policy (AStitch): memory-intensive subgraphs between contractions become one kernel where
legal — local (REGISTER) for one-to-one and thread-per-row reductions, regional (SHARED) for dominant
results the block can compute alone, global (GLOBAL_SYNC) with the grid packed into one wave."""

from __future__ import annotations

from engine.device import Device
from engine.ir.graph import PrimGraph
from engine.schedule.build import assemble, connect_greedy
from engine.schedule.plan import Plan
from engine.schedule.stitch import is_dominant, stitch_levels


def plan_stitch(graph: PrimGraph, device: Device, options: dict, started: float) -> Plan:
    conns, reasons, scores, log, _ = connect_greedy(graph, device, "stitch", stitch_levels)
    for e in graph.edges:
        if not stitch_levels(graph, e):
            reasons[e] = "a contraction: stitch leaves it to its own (library) kernel"
        elif is_dominant(graph, e[0]):
            reasons[e] = f"dominant {graph.stage(e[0]).op or graph.stage(e[0]).kind.value}: " + reasons.get(e, "")
    return assemble(graph, device, conns, policy="stitch", mode="stitch", reasons=reasons, scores=scores,
                    decisions=log, options=options, started=started)
