"""Welder policy: the tile-graph over all stages including contractions — first connect (each edge at
REGISTER or SHARED when the group's tile search finds a valid tile and the modeled time does not get
worse; failing both, GLOBAL_SYNC under the same test), then schedule (the tiles found on the way).
The subgraph cache makes repeated layers free."""

from __future__ import annotations

import dataclasses
import time

from engine.device import Device
from engine.flags import debug
from engine.ir.graph import PrimGraph, StageKind
from engine.schedule.build import assemble, connect_greedy
from engine.schedule.cost import estimate_group
from engine.schedule.plan import Conn, Plan, components
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
    split = _split_at(graph)
    beside = _beside(graph, device, options, split)
    try:
        walk = welder_walk(graph, device, options, started, beside, split)
        return at_least_stitch(graph, device, options, walk, started, beside)
    finally:
        if beside is not None:
            beside.close()


SPLIT_EDGES = 120  # a graph of this many edges or more may have its later half's searches warmed by the child
SPLIT_REPEATS = 0.6  # ... unless this share of the later half's stages repeat an earlier stage


def _split_at(graph: PrimGraph) -> int:
    """The edge from which a forked child warms the walk's searches (`_beside`), or 0 for none: the middle edge
    of a graph of SPLIT_EDGES or more whose later half is mostly stages unlike the earlier half's (kind, shape,
    reduction and body with the tensor names left out). Where the later layers repeat the earlier ones (bert12,
    lstm's steps: all of them; gpt2, vit: 0.9) the walk's own searches of the first layers answer theirs, and
    the child would only search them again (lstm planned 1.47 -> 1.72 s with it); where they do not (zoo swin
    0.23, mobilevit 0.37, efficientnet 0.16, convnext 0.44) the walk of the later half is mostly the child's
    searches (swin 9.5 -> 5.4 s)."""
    if len(graph.edges) < SPLIT_EDGES:
        return 0
    from engine.schedule.tiles import erased_body

    def alike(name: str) -> tuple:
        st = graph.stage(name)
        return st.kind, st.shape, st.reduce, erased_body(st)

    split = len(graph.edges) // 2
    before = {s for edge in graph.edges[:split] for s in edge}
    later = {s for edge in graph.edges[split:] for s in edge} - before
    earlier = {alike(s) for s in before}
    repeats = sum(alike(s) in earlier for s in later)
    return split if later and repeats < SPLIT_REPEATS * len(later) else 0


def _beside(graph: PrimGraph, device: Device, options: dict, split: int):
    """A forked child working beside the walk where a core is spare (engine/schedule/forked.py), or None. In
    turn it
    - with `split`, walks the graph from that edge on (the edges before it apart) and sends the tile searches
      that made, which the walk takes when it reaches that edge (it waits for them there, so the plan never
      depends on timing): away from the split the later part's groups are the walk's own and those searches
      are hits; without, searches each stage alone, in the walk's order, and shares each answer at once (the
      walk asks for every group apart before it merges it);
    - plans the stitch plan `at_least_stitch` may hold the walk's against, and sends that;
    and before each of its own edges and searches, before each candidate its searches cost (`tiles._search_pass`)
    and once done, answers the walk's requests: the search of an edge's second level, which the walk asks for
    before it tries the first (`build.SearchAhead`)."""
    from engine.schedule.build import serve_searches
    from engine.schedule.forked import MIN_STAGES, Forked, can_fork, serve_point, unserved
    from engine.schedule.policies.stitch import plan_stitch
    from engine.schedule.schedcache import TABLES
    from engine.schedule.tiles import SEARCH_TABLE_LIMIT

    if not can_fork() or len(graph.stages) < MIN_STAGES:  # can_fork reads the flag first: a bad value, its error
        return None

    def work(send) -> None:
        if split:
            from engine import flags

            level, flags.DEBUG = flags.DEBUG, 0  # its decisions are not the plan's: DEBUG=3 would print them too
            with unserved():  # the walk waits for these at the split
                connect_greedy(graph, device, "welder", welder_levels, welder_fallback, start=split)
            flags.DEBUG = level
            send(None)
        else:
            apart = {e: Conn.KERNEL for e in graph.edges}
            for name in dict.fromkeys(s for edge in graph.edges for s in edge):
                serve_point()
                search_group(graph, [name], apart, device, "welder", k=1)
                send.share()
        send(plan_stitch(graph, device, options, time.perf_counter()))

    return Forked(work, {name: SEARCH_TABLE_LIMIT for name in TABLES}, serve_searches(graph, device, "welder"),
                  answers_alike)


def answers_alike(table: str, value) -> bool:
    """Whether a search table's entry made elsewhere answers every later search as the walk's own search would,
    whenever it arrives: a found schedule (a bounded search answers it where it models under the bound and
    "nothing under it" elsewhere, as the unbounded one would) and a "nothing under this bound" — not a refusal
    (which a bounded search words by whether its bound cut a candidate, `tiles.search_group`)."""
    return table == "tiles.above" or not value.violations


def welder_walk(graph: PrimGraph, device: Device, options: dict, started: float, beside=None,
                split: int = 0) -> Plan:
    """The walk's own plan: first connect (Welder's greedy pass over the edges), then schedule. `beside`: a
    child warming the searches from edge `split` on (`_beside`), whose searches the walk takes there."""
    from engine.schedule.build import SearchAhead

    pause = {split: beside.result} if beside is not None and split else None
    ahead = SearchAhead(beside) if beside is not None else None
    conns, reasons, scores, log, kept = connect_greedy(graph, device, "welder", welder_levels, welder_fallback,
                                                       pause=pause, ahead=ahead)
    if ahead is not None:
        debug(1, f"welder: {ahead.used} of the {ahead.rid} second-level searches asked of the forked child came from it")
    return assemble(graph, device, conns, policy="welder", mode="welder", reasons=reasons, scores=scores,
                    decisions=log, options=options, started=started, fixed=kept)


def stitch_floor(graph: PrimGraph, device: Device) -> float:
    """A floor under the stitch plan's modeled time, without planning it (0 where a contraction has no valid
    tile). The stitch policy leaves every contraction alone in its kernel (no level joins an edge that
    touches one), so its plan holds each contraction's own tile search — the one the walk made already for
    the contraction apart — and on a CPU that search's tiles as the plan's coarsening leaves them
    (`build._coarsened`, memoised under the same key the plan asks with): on a GPU costed with every input
    another stage touches warm in L2 (the plan's L2 residency can only make fewer of them warm; an input no
    other kernel touches is cold), on a CPU exactly as the plan costs it (no residency there). Its other
    kernels are each at least a launch, one per connected part of the stages between contractions at least,
    and together store every such stage a contraction reads or the model outputs and compute what those
    stores need (`_between_floor`). On a100 it rules the stitch plan out on 13 of 14 zoo models, all but lstm;
    on the host (two threads) on 11 of 14, all but resnet, swin and unet, and on bert12 (benchmarks/NOTES.md
    stitchfloor, hoststitchfloor, betweencompute)."""
    from engine.schedule.build import _coarsened
    from engine.schedule.plan import Group

    total = 0.0
    for stage in graph.stages:
        if stage.kind != StageKind.CONTRACTION:
            continue
        sched = search_group(graph, [stage.name], {}, device, "stitch", k=1)
        if sched.violations or sched.cost is None:
            return 0.0
        if device.kind == "cpu":
            alone = Group(0, stage.name, (stage.name,), sched.tiles, "", sched.cost.modeled_us, sched.candidates,
                          sched.cost)
            plan = Plan(model_hash=graph.structural_hash, model_name=graph.name, policy="stitch",
                        device=device.name, edges=(), groups=(alone,))
            full = {e: Conn.KERNEL for e in graph.edges if stage.name in e}
            total += _coarsened(plan, alone, graph, device, full, set()).cost.modeled_us
            continue
        # Warm at best: an input another stage writes or reads too (a weight only this one reads is cold).
        warm = [t for t in stage.inputs if graph.is_stage(t) or len(graph.consumers.get(t, ())) > 1]
        total += estimate_group(graph, [stage.name], {}, sched.tiles, device, exact=True, warm=warm).modeled_us
    return total + _between_floor(graph, device)


def _between_floor(graph: PrimGraph, device: Device) -> float:
    """µs the stitch plan's kernels of the stages between contractions model at least: a launch per connected
    part of those stages (a kernel never spans two: it would hold an edge that touches a contraction), and the
    larger of two floors over all of them — the stores of every such stage a contraction reads or the model
    outputs (`cost._write_dram` stores each once, whatever the kernel: over DRAM's bandwidth unless a CPU's
    last-level cache holds the model; on a CPU, whose memory terms add up, over L2's as well, as every global
    store is counted there) and the arithmetic any kernels computing them count at least
    (`floor.whole_work_floor`) at the model's rates. Each kernel segment models at least the larger of its
    memory and arithmetic terms (a CPU adds its memory levels, a GPU takes the busiest), so the kernels
    together at least the larger of the sums. The arithmetic floor is what rules the stitch plan out on the
    host where its elementwise and normalisation kernels are most of what it adds (zoo swin: 14.6 us of
    stores against 198.0 modeled between its contractions; benchmarks/NOTES.md betweencompute)."""
    from engine.schedule.cost import _in_llc, nbytes
    from engine.schedule.floor import compute_seconds, whole_work_floor

    between = {s.name for s in graph.stages if s.kind != StageKind.CONTRACTION}
    if not between:
        return 0.0
    joined = {(p, c): Conn.REGISTER for p, c in graph.edges if p in between and c in between}
    parts = [comp for comp in components(graph, joined) if comp[0] in between]
    stored = sum(nbytes(graph, s) for s in between
                 if s in graph.outputs or any(c not in between for c in graph.consumers.get(s, ())))
    memory = 0.0 if _in_llc(graph, device) else stored / device.dram_bw_bytes_per_s
    if device.kind == "cpu":
        memory += stored / device.l2_bw_bytes_per_s
    work = [whole_work_floor(graph, comp) for comp in parts]
    compute = compute_seconds(device, 0.0, sum(w[0] for w in work), sum(w[1] for w in work))
    # Less 1e-4 us a part: the plan rounds each kernel's figure to 1e-4 us, and where the arithmetic floor is the
    # whole of a kernel's time (sample gelu_chain on the host) the rounding may take it under the floor's sum.
    return len(parts) * (device.launch_overhead_s * 1e6 - 1e-4) + max(memory, compute) * 1e6


def at_least_stitch(graph: PrimGraph, device: Device, options: dict, plan: Plan, started: float,
                    beside=None) -> Plan:
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
    decision log. `beside`: the forked child making the stitch plan (`_beside`), taken from it where needed
    (else planned here)."""
    from engine.schedule.policies.stitch import plan_stitch

    least = stitch_floor(graph, device)
    if least >= plan.modeled_us * (1 - WALK_MARGIN):
        if beside is not None:
            beside.close()
        why = (f"welder: the walk's plan models {plan.modeled_us:.1f} us, the stitch policy's at least {least:.1f} us "
               f"(its contraction kernels, the launches, stores and arithmetic between them): the walk's kept (the "
               f"stitch plan, not {WALK_MARGIN:.0%} faster, not made)")
        return dataclasses.replace(plan, decisions=(why,) + plan.decisions,
                                   schedule_seconds=round(time.perf_counter() - started, 4))
    other = beside.result() if beside is not None else None
    if other is None:
        other = plan_stitch(graph, device, options, time.perf_counter())
    else:
        debug(1, f"welder: the stitch plan from a forked child (planned in {other.schedule_seconds:.2f} s beside the walk)")
    spent = round(time.perf_counter() - started, 4)
    if other.modeled_us >= plan.modeled_us * (1 - WALK_MARGIN):
        why = (f"welder: the walk's plan models {plan.modeled_us:.1f} us, the stitch policy's "
               f"{other.modeled_us:.1f} us: the walk's kept"
               + (f" (the stitch plan is not {WALK_MARGIN:.0%} faster)" if other.modeled_us < plan.modeled_us else ""))
        return dataclasses.replace(plan, decisions=(why,) + plan.decisions, schedule_seconds=spent)
    why = (f"welder: the stitch policy's plan models {other.modeled_us:.1f} us, under the {plan.modeled_us:.1f} us "
           "of the walk's (greedy, one pass in topological order): the stitch plan taken; its decisions follow")
    return dataclasses.replace(other, policy="welder", decisions=(why,) + other.decisions, schedule_seconds=spent)
