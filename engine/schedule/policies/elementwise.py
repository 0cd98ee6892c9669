"""Elementwise policy (XLA/TVM-style): REGISTER chains of elementwise/layout stages only; a reduce
or contraction on either side, or a broadcast after an expensive op, ends the chain."""

from __future__ import annotations

from engine.device import Device
from engine.ir.graph import PrimGraph
from engine.schedule.build import assemble, component_of, creates_cycle, trial_conns
from engine.schedule.plan import Conn, Plan
from engine.schedule.stitch import CHEAP, broadcast_axes, is_expensive
from engine.schedule.tiles import search_group
from engine.tilegraph.tilegraph import segment_sinks, stage_order


def plan_elementwise(graph: PrimGraph, device: Device, options: dict, started: float) -> Plan:
    conns = {e: Conn.KERNEL for e in graph.edges}
    reasons: dict = {}
    log: list[str] = []
    for p, c in graph.edges:
        ps, cs = graph.stage(p), graph.stage(c)
        if ps.kind not in CHEAP:
            reasons[(p, c)] = f"producer is a {ps.kind.value}: chains hold elementwise/layout stages only"
        elif cs.kind not in CHEAP:
            reasons[(p, c)] = f"consumer is a {cs.kind.value}: ends the elementwise chain"
        elif broadcast_axes(graph, p, c) and is_expensive(ps):
            reasons[(p, c)] = "broadcast after an expensive op ends the chain (no recompute per use)"
        else:
            trial = trial_conns(graph, conns, (p, c), Conn.REGISTER)
            merged = component_of(graph, trial, p)
            if creates_cycle(graph, merged, lambda s, old=conns: component_of(graph, old, s)):
                reasons[(p, c)] = "fusing would put a stage outside the kernel between two of its stages"
            elif len(segment_sinks(graph, sorted(merged, key=stage_order(graph).__getitem__), trial)) != 1:
                reasons[(p, c)] = "fusing would give the kernel two sinks"
            elif (bad := search_group(graph, sorted(merged, key=stage_order(graph).__getitem__), trial, device,
                                      "elementwise", k=1).violations):
                reasons[(p, c)] = f"register: rule {bad[0].rule}: {bad[0].message}"
            else:
                conns = trial
                reasons[(p, c)] = "register: elementwise chain"
        log.append(f"{p} -> {c}: {conns[(p, c)].value} ({reasons[(p, c)]})")
    return assemble(graph, device, conns, policy="elementwise", mode="elementwise", reasons=reasons,
                    decisions=log, options=options, started=started)
