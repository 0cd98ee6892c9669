"""Unfused policy: every edge KERNEL, one kernel per stage with its best searched tile (the
framework baseline)."""

from __future__ import annotations

from engine.device import Device
from engine.ir.graph import PrimGraph
from engine.schedule.build import assemble
from engine.schedule.plan import Conn, Plan


def plan_unfused(graph: PrimGraph, device: Device, options: dict, started: float) -> Plan:
    conns = {e: Conn.KERNEL for e in graph.edges}
    reasons = {e: "unfused policy: every stage is its own kernel" for e in graph.edges}
    return assemble(graph, device, conns, policy="unfused", mode="unfused", reasons=reasons,
                    options=options, started=started)
