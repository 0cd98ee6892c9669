"""Program-level L2 residency: a Plan's kernels in launch order in, the tensors each kernel finds whole in
L2 (a GPU's L2, a CPU's last-level cache; left there by earlier kernels; LRU within its size) out, and the
plan re-costed with them (`GroupCost.l2_warm`): a warm input is read from L2, not DRAM.

Without it every kernel's reads are costed as if caches were cold (as Nsight Compute replays one kernel,
`--cache-control all`): the LSTM's 256 KB recurrent weight came from DRAM once per kernel over 32 steps
on a 40 MB L2. The model is unmeasured on a GPU: benchmarks/gpu_counters.py `--program` measures a whole
program's DRAM bytes with the cache left warm between kernels (`--cache-control none`) to check it."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from engine.device import Device
from engine.ir.graph import PrimGraph
from engine.memo import memo
from engine.schedule import cost as C
from engine.schedule.cost import LINE, estimate_group, nbytes, whole_graph_facts
from engine.schedule.plan import Conn, Group, GroupCost, Plan
from engine.tilegraph.tilegraph import segments_of


def kernel_touches(graph: PrimGraph, group: Group, conns: Mapping) -> tuple[dict[str, int], set[str]]:
    """(bytes a kernel reads of each tensor from outside it, capped at the tensor's size; tensors it stores
    to global memory, whole: read outside it, a model output, or behind one of its grid barriers)."""
    members = set(group.stages)
    segs = segments_of(graph, group.stages, conns)
    read: dict[str, int] = {}
    for seg, tile in zip(segs, group.segments):  # the regions `estimate_group` reads, without the kernel IR
        per_block = tile.blocks / max(1, tile.row_split)
        for t, lines in C._read_lines(graph, C.segment_regions(graph, seg, conns, tile), seg).items():
            if t not in members:
                read[t] = min(nbytes(graph, t), read.get(t, 0) + int(lines * LINE * per_block))
    written = {s for s in group.stages
               if s in graph.outputs or any(c not in members or conns.get((s, c)) == Conn.GLOBAL_SYNC
                                            for c in graph.consumers.get(s, ()))}
    return read, written


def warm_inputs(graph: PrimGraph, groups: Sequence[Group], conns: Mapping, device: Device) -> list[frozenset[str]]:
    """Per kernel in launch order: the tensors it reads that are whole in L2 when it starts. L2 starts cold
    (the floor's premise: inputs and weights come from DRAM once). After each kernel, the tensors it read
    and wrote are the most recently used (a tensor is whole only when the kernel read all of it — as the
    model charged it — or wrote it); least recently used ones are evicted past the L2's size, and a tensor
    larger than the L2 streams through it, evicting everything. Dirty lines are written back once: the
    writes stay in each kernel's DRAM bytes."""
    lru: OrderedDict[str, tuple[int, bool]] = OrderedDict()  # tensor -> (bytes held, whole), LRU first
    out = []
    for g in groups:
        read, written = kernel_touches(graph, g, conns)
        out.append(frozenset(t for t in read if lru.get(t, (0, False))[1]))
        for t, b in read.items():
            held, whole = lru.pop(t, (0, False))
            size = nbytes(graph, t)
            lru[t] = (max(held, b), whole or b >= size)
        for t in written:
            lru.pop(t, None)
            lru[t] = (nbytes(graph, t), True)
        total = sum(b for b, _ in lru.values())
        while lru and total > device.l2_bytes:
            _, (b, _) = lru.popitem(last=False)
            total -= b
    return out


def with_l2_residency(plan: Plan, graph: PrimGraph, device: Device) -> Plan:
    """`plan` with each kernel costed with the inputs earlier kernels left whole in L2 (a GPU's L2; a CPU's
    last-level cache, `device.l2_bytes`, where the model does not fit it whole — one that does is read from
    it throughout, `cost._in_llc`). Groups whose warm inputs are unchanged keep their cost."""
    if not plan.groups or C._in_llc(graph, device):
        return plan
    conns = {e.key: e.conn for e in plan.edges}
    groups = []
    for g, warm in zip(plan.groups, warm_inputs(graph, plan.groups, conns, device)):
        if g.cost is not None and tuple(sorted(warm)) != g.cost.l2_warm:
            regs = None if g.cost.registers_from == "formula" else (g.cost.footprint["register"], g.cost.registers_from)
            cost = _warm_cost(graph, g, conns, device, regs, warm)
            g = dataclasses.replace(g, cost=cost, score=cost.modeled_us)
        groups.append(g)
    return dataclasses.replace(plan, groups=tuple(groups))


def _warm_cost(graph: PrimGraph, g: Group, conns: Mapping, device: Device, regs, warm) -> GroupCost:
    """`estimate_group` of `g` at its tiles with `warm` inputs (exact), memoised under the group's
    structural signature with its stages and tensors named canonically, as the tile search's subgraph
    cache is: the layers of a deep model are the same kernels with the same warm inputs, and each
    would otherwise build its exact kernel IR anew (the search found their tiles in that cache)."""
    from engine.codegen.mma import tf32_allowed
    from engine.schedule.tiles import canonical_names, group_signature
    from engine.schedule.validate import recompute_bound

    names = canonical_names(graph, g.stages)
    key = (group_signature(graph, g.stages, conns), tuple(dataclasses.replace(t, stage=names[t.stage]) for t in g.segments),
           frozenset(names.get(t, t) for t in warm), device, regs, recompute_bound(), tf32_allowed(),
           whole_graph_facts(graph, device))
    table = memo("residency.warm_costs", 20000)
    hit = table.get(key)
    if hit is None:
        cost = estimate_group(graph, g.stages, conns, g.segments, device, exact=True, registers=regs, warm=warm)
        hit = table.put(key, dataclasses.replace(cost, l2_warm=tuple(names.get(t, t) for t in cost.l2_warm)))
    back = {v: k for k, v in names.items()}
    return dataclasses.replace(hit, l2_warm=tuple(sorted(back.get(t, t) for t in hit.l2_warm)))
