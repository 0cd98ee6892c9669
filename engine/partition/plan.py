"""Planned model + N devices + a link in, a Partition out (Wolong): the plan's kernels in launch order cut
into N contiguous pipeline stages by dynamic programming, each stage within a device's memory, and
contractions too large for one device (or dominating the time) split along their output axis over all
devices (tensor parallel). The reported makespan comes from an event simulation of the assignment."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from engine.codegen.generate import launch_order
from engine.device import Device, get_device
from engine.errors import PartitionError, PlanError
from engine.ir.graph import PrimGraph
from engine.partition.links import DEFAULT_LINK, Link, get_link
from engine.partition.model import DeviceStage, KernelSlot, Partition, Transfer
from engine.partition.split import slice_names, split_axis, split_contraction
from engine.runtime.memory import plan_memory
from engine.schedule.plan import Edit, Plan

MAX_DEVICES = 64
# Tensor parallelism is tried for a contraction whose weight takes more than this share of a device's memory
# (pipelining alone would leave little room beside it), or whose kernel takes more than 1/N of the time.
TP_WEIGHT_SHARE = 0.5
INPUT_DEVICE = 0  # a request's inputs arrive on device 0; outputs are read where they are produced


@dataclass(frozen=True)
class KernelFacts:
    """What the partitioner needs of one kernel: its modeled time and the tensors it touches."""

    name: str
    us: float
    weights: Mapping[str, int]  # constant -> bytes
    reads: tuple[str, ...]  # tensors made outside the kernel (graph inputs, other kernels' outputs)
    writes: tuple[str, ...]  # tensors it makes that other kernels or the graph's outputs read
    scratch: Mapping[str, int]  # tensors made and used inside the kernel in device memory (grid-barrier)


def kernel_facts(graph: PrimGraph, plan: Plan) -> list[KernelFacts]:
    """Per kernel in launch order: modeled µs (the plan's cost), weights, reads, writes and scratch."""
    consumers = graph.consumers
    outputs = set(graph.outputs)
    facts = []
    for g in launch_order(plan, graph):
        members = set(g.stages)
        reads = dict.fromkeys(t for s in g.stages for t in graph.stage(s).inputs
                              if t not in members and t not in graph.weights)
        weights = {t: graph.specs[t].nbytes for s in g.stages for t in graph.stage(s).inputs if t in graph.weights}
        writes = tuple(s for s in g.stages if s in outputs or any(c not in members for c in consumers.get(s, ())))
        global_edges = {p for p, c in graph.edges if p in members and c in members
                        and plan.edge(p, c).conn.value == "global_sync"}
        scratch = {t: graph.specs[t].nbytes for t in global_edges if t not in writes}
        facts.append(KernelFacts(g.name, g.cost.modeled_us if g.cost else 0.0, weights, tuple(reads), writes, scratch))
    return facts


def device_peak(facts: list[KernelFacts], graph: PrimGraph, keep: set[str]) -> tuple[int, int]:
    """(weights, weights + activation peak) of one device running `facts` in order: every tensor it reads,
    makes or keeps is live from its first to its last use there (to the end when in `keep`: graph
    outputs), placed by the same static memory planner as a program's arena."""
    span: dict[str, list[int]] = {}
    for p, k in enumerate(facts):
        for t in (*k.reads, *k.writes, *k.scratch):
            span.setdefault(t, [p, p])[1] = p
    end = max(len(facts) - 1, 0)
    arena = plan_memory([(t, graph.specs[t].nbytes, a, end if t in keep else b) for t, (a, b) in span.items()])
    weights = sum({w: b for k in facts for w, b in k.weights.items()}.values())
    return weights, weights + arena.arena_bytes


# ---- one assignment: transfers, simulation ---------------------------------------------------------


def plan_transfers(facts: list[KernelFacts], where: list[int], graph: PrimGraph, link: Link) -> list[Transfer]:
    """One transfer per (tensor, device that reads it but did not make it), in the order tensors are made."""
    home = {t.name: INPUT_DEVICE for t in graph.inputs}
    out: list[Transfer] = []
    sent: set[tuple[str, int]] = set()
    for k, d in zip(facts, where):
        for t in k.reads:
            src = home.get(t)
            if src is not None and src != d and (t, d) not in sent:
                sent.add((t, d))
                nbytes = graph.specs[t].nbytes
                out.append(Transfer(t, src, d, nbytes, link.transfer_us(nbytes)))
        home.update(dict.fromkeys(k.writes, d))
    return out


def simulate(facts: list[KernelFacts], where: list[int], transfers: list[Transfer],
             pinned: set[str]) -> tuple[list[KernelSlot], list[Transfer], float, float]:
    """(kernel slots, timed transfers, makespan, period) of one request: each device runs its kernels in
    launch order, a kernel starts when its device is free and its inputs are there; a transfer starts
    when its tensor is made and its (src, dst) link is free. Period: the busiest device or link."""
    devices = max(where) + 1
    free = [0.0] * devices
    link_free: dict[tuple[int, int], float] = {}
    ready: dict[tuple[str, int], float] = {}  # (tensor, device) -> when it is there
    made: dict[str, float] = {}
    by_tensor: dict[str, list[Transfer]] = {}
    for t in transfers:
        by_tensor.setdefault(t.tensor, []).append(t)
    timed: list[Transfer] = []
    slots: list[KernelSlot] = []

    def send(tensor: str, at: float, src: int) -> None:
        ready[(tensor, src)] = at
        for t in by_tensor.get(tensor, ()):
            start = max(at, link_free.get((t.src, t.dst), 0.0))
            link_free[(t.src, t.dst)] = start + t.us
            ready[(tensor, t.dst)] = start + t.us
            timed.append(dataclasses.replace(t, start_us=start, end_us=start + t.us))

    for name in dict.fromkeys(t.tensor for t in transfers if t.tensor not in {w for k in facts for w in k.writes}):
        send(name, 0.0, INPUT_DEVICE)  # graph inputs leave device 0 at time 0
    for k, d in zip(facts, where):
        start = max([free[d], *(ready.get((t, d), made.get(t, 0.0)) for t in k.reads)])
        end = start + k.us
        free[d] = end
        slots.append(KernelSlot(k.name, d, start, end, sum(k.weights.values()), k.name in pinned))
        for t in k.writes:
            made[t] = end
            send(t, end, d)
    makespan = max([*free, *(t.end_us for t in timed)], default=0.0)
    busy = [sum(k.us for k, d in zip(facts, where) if d == dev) for dev in range(devices)]
    links: dict[tuple[int, int], float] = {}
    for t in timed:
        links[(t.src, t.dst)] = links.get((t.src, t.dst), 0.0) + t.us
    timed.sort(key=lambda t: (t.start_us, t.src, t.dst))
    return slots, timed, makespan, max([*busy, *links.values()], default=0.0)


# ---- pipeline stages by dynamic programming -------------------------------------------------------


def pipeline_stages(facts: list[KernelFacts], pinned: Mapping[str, int], devices: int, graph: PrimGraph,
                    link: Link, budget: int) -> list[int]:
    """Device of every kernel: the unpinned kernels cut into `devices` contiguous non-empty stages
    (stage s on device s) minimising the one-request time, sum over stages of their kernels and the
    transfers into them, ties going to the cut with the least loaded busiest stage; every device's
    weights and activation peak within `budget`. PartitionError when no cut fits."""
    free = [p for p, k in enumerate(facts) if k.name not in pinned]
    if len(free) < devices:
        raise PartitionError(f"the plan has {len(free)} kernel(s) to place, fewer than --devices {devices}",
                             hint="use a policy with more kernels (--policy stitch or unfused) or fewer devices")
    producer = {t: p for p, k in enumerate(facts) for t in k.writes}
    pinned_at = {facts.index(k): d for k in facts for n, d in pinned.items() if k.name == n}
    outputs = set(graph.outputs)
    cost: dict[tuple[int, int, int], tuple[float, float] | None] = {}

    def stage_cost(s: int, i: int, j: int) -> tuple[float, float] | None:
        key = (s, i, j)
        if key in cost:
            return cost[key]
        members = set(free[i:j])
        mine = sorted(members | {p for p, d in pinned_at.items() if d == s})
        got: set[str] = set()
        us = sum(facts[p].us for p in members)
        for p in members:
            for t in facts[p].reads:
                src = producer.get(t)
                local = src in members or pinned_at.get(src) == s if src is not None else s == INPUT_DEVICE
                if not local and t not in got:
                    got.add(t)
                    us += link.transfer_us(graph.specs[t].nbytes)
        for p, d in pinned_at.items():
            if d != s:
                us += sum(link.transfer_us(graph.specs[t].nbytes) for t in facts[p].reads
                          if producer.get(t) in members)
        _, peak = device_peak([facts[p] for p in mine], graph, outputs)
        pinned_us = sum(facts[p].us for p, d in pinned_at.items() if d == s)
        cost[key] = (us, us + pinned_us) if peak <= budget else None
        return cost[key]

    n = len(free)
    inf = (float("inf"), float("inf"))
    best: list[list[tuple[float, float]]] = [[inf] * (n + 1) for _ in range(devices + 1)]
    cut: list[list[int]] = [[-1] * (n + 1) for _ in range(devices + 1)]
    best[0][0] = (0.0, 0.0)
    for s in range(1, devices + 1):
        for j in range(s, n - (devices - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == inf:
                    continue
                c = stage_cost(s - 1, i, j)
                if c is None:
                    continue
                cand = (best[s - 1][i][0] + c[0], max(best[s - 1][i][1], c[1]))
                if (round(cand[0], 6), cand[1]) < (round(best[s][j][0], 6), best[s][j][1]):
                    best[s][j], cut[s][j] = cand, i
    if best[devices][n] == inf:
        heaviest = max(facts, key=lambda k: sum(k.weights.values()))
        raise PartitionError(f"no split of {n} kernels into {devices} stages fits {budget:,} B per device "
                             f"(kernel {heaviest.name} alone holds {sum(heaviest.weights.values()):,} B of weights)",
                             hint="add devices, raise the device's memory_bytes, or use a policy with smaller kernels")
    where = [0] * len(facts)
    j = n
    for s in range(devices, 0, -1):
        i = cut[s][j]
        for p in free[i:j]:
            where[p] = s - 1
        j = i
    for p, d in pinned_at.items():
        where[p] = d
    return where


def assign(graph: PrimGraph, plan: Plan, device: Device, devices: int, link: Link,
           pinned_stages: Mapping[str, int]) -> tuple[list[KernelFacts], list[int], set[str]]:
    """(facts, device per kernel, pinned kernel names) for `plan` with the groups holding
    `pinned_stages` (a TP slice -> its device) fixed there."""
    facts = kernel_facts(graph, plan)
    pinned = {plan.group_of(s).name: d for s, d in pinned_stages.items()}
    where = pipeline_stages(facts, pinned, devices, graph, link, device.memory_bytes)
    return facts, where, set(pinned)


def build_partition(graph: PrimGraph, plan: Plan, device: Device, devices: int, link: Link,
                    pinned_stages: Mapping[str, int], single: tuple[float, int], tp: tuple[str, ...],
                    decisions: tuple[str, ...]) -> Partition:
    facts, where, pinned = assign(graph, plan, device, devices, link, pinned_stages)
    transfers = plan_transfers(facts, where, graph, link)
    slots, timed, makespan, period = simulate(facts, where, transfers, pinned)
    outputs = set(graph.outputs)
    stages = []
    for d in range(devices):
        mine = [k for k, w in zip(facts, where) if w == d]
        weights, peak = device_peak(mine, graph, outputs)
        stages.append(DeviceStage(d, tuple(k.name for k in mine), weights, peak, sum(k.us for k in mine)))
    return Partition(graph.name, plan.policy, device.name, devices, link, device.memory_bytes, tuple(stages),
                     tuple(timed), tuple(slots), makespan, period, single[0], single[1], tp, decisions)


# ---- tensor parallel and the entry point ----------------------------------------------------------


def split_plan(graph: PrimGraph, plan: Plan, device: Device, stages: list[str],
               devices: int) -> tuple[PrimGraph, Plan, dict[str, int]]:
    """`graph` with each of `stages` split over `devices` and its plan: `plan` itself on the new graph,
    every edge into or out of a slice cut (a slice is a kernel of its own, pinned to its device). The
    plan's other connections hold (the user's edits with them) and its kernels that hold no split stage
    keep their tiles; only the kernels the split breaks up are searched again. (Re-planning the split
    graph with the base policy took 9-18 s on bert and vit, the Partition page's whole time.)"""
    from engine.schedule.build import assemble
    from engine.schedule.plan import Conn
    from engine.schedule.validate import validate

    for name in stages:
        graph = split_contraction(graph, split_axis(graph, graph.stage(name)), devices)
    pinned = {s: j for name in stages for j, s in enumerate(slice_names(name, devices))}
    base = plan.base_policy or plan.policy
    old = {e.key: e for e in plan.edges}
    conns, reasons, sources = {}, {}, {}
    for edge in graph.edges:
        if edge[0] in pinned or edge[1] in pinned or edge not in old:
            conns[edge], reasons[edge] = Conn.KERNEL, "partition: a tensor-parallel slice is a kernel of its own"
            sources[edge] = "partition"
        else:
            conns[edge], reasons[edge], sources[edge] = old[edge].conn, old[edge].reason, old[edge].source
    broken = _break_cycles(graph, conns, reasons, sources)
    cuts = tuple(Edit.make("split", producer=p, consumer=c) for p, c in graph.edges
                 if p in pinned or c in pinned or (p, c) in broken)
    split = set(stages)
    new = assemble(graph, device, conns, policy="user", mode=base if base != "user" else "welder",
                   reasons=reasons, sources=sources, decisions=plan.decisions, base_policy=base,
                   edits=plan.edits + cuts, options=dict(plan.options) | {"batching": False},
                   keep=[g for g in plan.groups if split.isdisjoint(g.stages)])
    problems = validate(new, graph, device)
    if problems:
        raise PlanError(f"cutting the slices of {', '.join(stages)} out of their kernels is illegal: {problems[0]}")
    return graph, new, pinned


def _break_cycles(graph: PrimGraph, conns: dict, reasons: dict, sources: dict) -> set:
    """With the slices cut out, a kernel that fused stages on both sides of a slice (a welder kernel
    holding a layer's attention around its projections) would wait on the slice that waits on it: every
    kernel on a cycle of the kernel DAG is broken up into one kernel per stage (its edges set to KERNEL in
    `conns`, the reason and source saying so) until none is. The edges broken come back."""
    from engine.schedule.plan import Conn, components
    from engine.schedule.validate import find_group_cycle

    broken: set = set()
    while True:
        groups = components(graph, conns)
        cyclic = [set(groups[k]) for k in find_group_cycle(graph, groups) if len(groups[k]) > 1]
        if not cyclic:
            return broken
        for members in cyclic:
            for p in members:
                for c in graph.consumers.get(p, ()):
                    if c in members and conns.get((p, c), Conn.KERNEL).fused:
                        conns[(p, c)] = Conn.KERNEL
                        reasons[(p, c)] = ("partition: the kernel held stages on both sides of a tensor-parallel "
                                           "slice (a cycle once the slice is cut out): broken up")
                        sources[(p, c)] = "partition"
                        broken.add((p, c))


def tp_candidates(graph: PrimGraph, plan: Plan, device: Device, devices: int) -> tuple[list[str], list[str], list[str]]:
    """Splittable contractions: (those whose weight takes more than half a device's memory, those in
    kernels taking over 1/N of the modeled time, all of them by weight, largest first)."""
    cuts = {s.name: c for s in graph.stages if (c := split_axis(graph, s)) and s.shape[c.axis] >= devices}
    big = [n for n, c in cuts.items() if c.weight_bytes > TP_WEIGHT_SHARE * device.memory_bytes]
    total = plan.modeled_us
    slow = [n for g in plan.groups if g.cost and total and g.cost.modeled_us > total / devices
            for n in g.stages if n in cuts]
    return big, slow, sorted(cuts, key=lambda n: -cuts[n].weight_bytes)


def check_devices(devices) -> None:
    if isinstance(devices, bool) or not isinstance(devices, int) or not 1 <= devices <= MAX_DEVICES:
        raise PartitionError(f"--devices must be an integer from 1 to {MAX_DEVICES}, got {devices!r}")


def partition_model(graph: PrimGraph, plan: Plan, device: Device | str, devices: int,
                    link: Link | str = DEFAULT_LINK) -> tuple[PrimGraph, Plan, Partition]:
    """(graph, plan, partition) of a planned model over `devices` copies of `device`: the pipeline cut of
    `plan`; or, when a contraction's weight takes over half a device or its kernel over 1/N of the time,
    also the cut with those contractions split over all devices; and when nothing fits yet, the cut with
    the largest-weight contractions split, one more at a time until one fits. The lowest modeled
    makespan wins. Run the returned graph and plan (they carry the splits)."""
    check_devices(devices)
    device = get_device(device) if isinstance(device, str) else device
    link = get_link(link)
    single = (plan.modeled_us, device_peak(kernel_facts(graph, plan), graph, set(graph.outputs))[1])
    found: list[tuple[PrimGraph, Plan, Partition]] = []
    notes: list[str] = []

    def attempt(stages: list[str], why: str) -> None:
        what = f"tensor parallel over {', '.join(stages)} ({why})" if stages else "pipeline only"
        try:
            g, p, pinned = split_plan(graph, plan, device, stages, devices) if stages else (graph, plan, {})
            part = build_partition(g, p, device, devices, link, pinned, single, tuple(stages), (what,))
        except (PartitionError, PlanError) as err:
            notes.append(f"{what}: refused, {err}")
            return
        notes.append(f"{what}: modeled makespan {part.makespan_us:.1f} µs")
        found.append((g, p, part))

    attempt([], "")
    if devices > 1:
        big, slow, by_weight = tp_candidates(graph, plan, device, devices)
        if big:
            attempt(big, f"weights over {TP_WEIGHT_SHARE:.0%} of a device's {device.memory_bytes:,} B")
        if slow and set(slow) - set(big):
            attempt(list(dict.fromkeys(big + slow)), f"kernels over 1/{devices} of the modeled {plan.modeled_us:.1f} µs")
        for k in range(1, len(by_weight) + 1):
            if found:
                break
            attempt(by_weight[:k], "nothing smaller fits: the largest weights")
    if not found:
        raise PartitionError(notes[0].split(": refused, ", 1)[1] if len(notes) == 1 else
                             f"{notes[-1].split(': refused, ', 1)[1]} (also with no contraction split)")
    g, p, part = min(found, key=lambda f: f[2].makespan_us)
    return g, p, dataclasses.replace(part, decisions=tuple(notes))
