"""Plan assembly and edge connecting: per-edge connections in, a Plan out (groups = components of
fused edges, tiles searched per group, costs, reasons); `can_connect` answers one edge at one level
with a Decision; `connect_greedy` is Welder's "first connect, then schedule" walk used by policies."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from engine.device import Device
from engine.ir.graph import PrimGraph, StageKind
from engine.schedule.plan import Conn, EdgePlan, Edit, Group, Plan, Tile, components, kernel_name
from engine.schedule.tiles import GroupSchedule, search_group
from engine.schedule.validate import Decision, find_group_cycle

Edge = tuple[str, str]


def assemble(
    graph: PrimGraph, device: Device, conns: Mapping[Edge, Conn], *, policy: str, mode: str,
    reasons: Mapping[Edge, str] | None = None, scores: Mapping[Edge, float | None] | None = None,
    decisions: Sequence[str] = (), fixed: Mapping[str, Tile] | None = None, base_policy: str = "",
    edits: Sequence[Edit] = (), sources: Mapping[Edge, str] | None = None, options: Mapping | None = None,
    started: float | None = None,
) -> Plan:
    """Freeze connections into a Plan: components → groups, a tile search per group, every cost."""
    started = time.perf_counter() if started is None else started
    reasons, scores, sources = reasons or {}, scores or {}, sources or {}
    full = {e: conns.get(e, Conn.KERNEL) for e in graph.edges}
    edges = tuple(EdgePlan(p, c, full[(p, c)], reasons.get((p, c), "default: separate kernels"),
                           scores.get((p, c)), sources.get((p, c), "policy")) for p, c in graph.edges)
    groups = []
    for k, comp in enumerate(components(graph, full)):
        sched = search_group(graph, comp, full, device, mode, fixed)
        groups.append(Group(k, kernel_name(k, graph, comp), tuple(comp), sched.tiles, _group_reason(comp, full, sched),
                            sched.cost.modeled_us if sched.cost else None, sched.candidates, sched.cost))
    return Plan(
        model_hash=graph.structural_hash, model_name=graph.name, policy=policy, device=device.name,
        edges=edges, groups=tuple(groups), base_policy=base_policy, edits=tuple(edits),
        decisions=tuple(decisions), schedule_seconds=round(time.perf_counter() - started, 4),
        options=tuple(sorted((options or {}).items())),
    )


def _group_reason(comp: Sequence[str], conns: Mapping[Edge, Conn], sched: GroupSchedule) -> str:
    if len(comp) == 1:
        text = "single stage"
    else:
        members = set(comp)
        count: dict[str, int] = {}
        for (p, c), conn in conns.items():
            if p in members and c in members:
                count[conn.value] = count.get(conn.value, 0) + 1
        text = f"{len(comp)} stages fused: " + ", ".join(f"{n} {lvl}" for lvl, n in sorted(count.items()))
    if sched.violations:
        text += f"; ILLEGAL: {sched.violations[0]}"
    return text


def group_of(comps: Sequence[Sequence[str]], stage: str) -> list[str]:
    return next(list(c) for c in comps if stage in c)


def trial_conns(graph: PrimGraph, conns: Mapping[Edge, Conn], edge: Edge, level: Conn) -> dict[Edge, Conn]:
    """`conns` with `edge` at `level`; any other edge that falls inside the merged group is fused too
    (a kernel edge inside a kernel is meaningless): at `level`, or shared from a reduction."""
    trial = dict(conns)
    trial[edge] = level
    if not level.fused:
        return trial
    comp = set(group_of(components(graph, trial), edge[0]))
    for p, c in graph.edges:
        if p in comp and c in comp and not trial.get((p, c), Conn.KERNEL).fused:
            heavy = graph.stage(p).kind in (StageKind.REDUCE, StageKind.CONTRACTION)
            trial[(p, c)] = Conn.SHARED if level == Conn.REGISTER and heavy else level
    return trial


def can_connect(
    graph: PrimGraph, conns: Mapping[Edge, Conn], edge: Edge, level: Conn, device: Device, mode: str,
) -> tuple[Decision, dict[Edge, Conn]]:
    """Is `edge` at `level` legal, and does it not make the modeled time worse? The Decision's
    score is the merged group's modeled µs; the trial connections come back for the caller to keep."""
    trial = trial_conns(graph, conns, edge, level)
    if not level.fused:
        return Decision(True, "separate kernels"), trial
    comps = components(graph, trial)
    merged = group_of(comps, edge[0])
    if find_group_cycle(graph, comps):
        return Decision(False, f"{level.value}: a stage outside the group lies between {edge[0]} and {edge[1]} "
                        "(group cycle)"), trial
    sched = search_group(graph, merged, trial, device, mode)
    if sched.violations:
        v = sched.violations[0]
        return Decision(False, f"{level.value}: rule {v.rule}: {v.message}"), trial
    old_comps = components(graph, conns)
    before_groups = {tuple(group_of(old_comps, s)) for s in merged}
    before = sum(_modeled(graph, list(g), conns, device, mode) for g in before_groups)
    after = sched.cost.modeled_us
    if after > before * (1 + 1e-6) + 1e-6:
        return Decision(False, f"{level.value}: modeled {after:.2f} us fused vs {before:.2f} us apart", after), trial
    return Decision(True, f"{level.value}: modeled {after:.2f} us fused vs {before:.2f} us apart", after), trial


def _modeled(graph, stages, conns, device, mode) -> float:
    sched = search_group(graph, stages, {e: conns.get(e, Conn.KERNEL) for e in graph.edges}, device, mode)
    return sched.cost.modeled_us if sched.cost else float("inf")


LevelChoice = Callable[[PrimGraph, Edge], Sequence[tuple[Conn, str]]]


def connect_greedy(graph: PrimGraph, device: Device, mode: str, levels: LevelChoice):
    """Walk edges in topological order; per edge try each allowed level (with why it is allowed),
    keep the legal one with the lowest modeled time (ties go to the closer level)."""
    conns: dict[Edge, Conn] = {e: Conn.KERNEL for e in graph.edges}
    reasons: dict[Edge, str] = {}
    scores: dict[Edge, float | None] = {}
    log: list[str] = []
    for edge in graph.edges:
        if conns[edge].fused:
            log.append(f"{edge[0]} -> {edge[1]}: {conns[edge].value} (kept: fused with its group)")
            continue
        options = levels(graph, edge)
        best = None
        noes: list[str] = []
        for level, why in options:
            decision, trial = can_connect(graph, conns, edge, level, device, mode)
            if not decision.ok:
                noes.append(decision.reason)
            elif best is None or decision.score < best[0].score - 1e-9:
                best = (decision, trial, why)
        if best is None:
            reasons[edge] = "; ".join(noes) if noes else "not fused by this policy"
            log.append(f"{edge[0]} -> {edge[1]}: kernel ({reasons[edge]})")
            continue
        decision, trial, why = best
        for e, conn in trial.items():
            if conn != conns[e] and e != edge:
                reasons[e] = f"fused along with {edge[0]} -> {edge[1]}"
        conns = trial
        reasons[edge] = f"{why}; {decision.reason}"
        scores[edge] = decision.score
        log.append(f"{edge[0]} -> {edge[1]}: {conns[edge].value} ({reasons[edge]})")
    return conns, reasons, scores, log
