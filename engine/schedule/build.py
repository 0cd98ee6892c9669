"""Plan assembly and edge connecting: per-edge connections in, a Plan out (groups = components of
fused edges, tiles searched per group, costs, reasons); `can_connect` answers one edge at one level
with a Decision; `connect_greedy` is Welder's "first connect, then schedule" walk used by policies."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence

from engine.device import Device
from engine.flags import debug
from engine.ir.graph import PrimGraph, StageKind
from engine.memo import memo
from engine.schedule.cost import estimate_group, whole_graph_facts
from engine.schedule.forked import serve_point
from engine.schedule.plan import Conn, EdgePlan, Edit, Group, Plan, Tile, components, kernel_name
from engine.schedule.residency import with_l2_residency
from engine.schedule.tiles import GroupSchedule, record_mappings, search_cached, search_group, under_tighter
from engine.schedule.validate import Decision
from engine.tilegraph.tilegraph import segment_sinks, segments_of, stage_order

Edge = tuple[str, str]


def assemble(
    graph: PrimGraph, device: Device, conns: Mapping[Edge, Conn], *, policy: str, mode: str,
    reasons: Mapping[Edge, str] | None = None, scores: Mapping[Edge, float | None] | None = None,
    decisions: Sequence[str] = (), fixed: Mapping[str, Tile] | None = None, base_policy: str = "",
    edits: Sequence[Edit] = (), sources: Mapping[Edge, str] | None = None, options: Mapping | None = None,
    started: float | None = None, keep: Sequence[Group] = (),
) -> Plan:
    """Freeze connections into a Plan: components → groups, a tile search per group, every cost.
    `keep`: groups of an earlier plan of the same graph, device and options whose stages and every edge
    touching them have the connections they had there (an edit elsewhere): where a component is one of
    them it is reused as it was (tiles, candidates, cost, measured time), renumbered, not searched again."""
    started = time.perf_counter() if started is None else started
    reasons, scores, sources = reasons or {}, scores or {}, sources or {}
    full = {e: conns.get(e, Conn.KERNEL) for e in graph.edges}
    edges = tuple(EdgePlan(p, c, full[(p, c)], reasons.get((p, c), "default: separate kernels"),
                           scores.get((p, c)), sources.get((p, c), "policy")) for p, c in graph.edges)
    kept = {frozenset(g.stages): g for g in keep}
    groups = []
    for k, comp in enumerate(components(graph, full)):
        old = kept.get(frozenset(comp))
        if old is not None:
            groups.append(dataclasses.replace(old, id=k, name=kernel_name(k, graph, comp)))
            continue
        sched = search_group(graph, comp, full, device, mode, fixed)
        groups.append(Group(k, kernel_name(k, graph, comp), tuple(comp), sched.tiles, _group_reason(comp, full, sched),
                            sched.cost.modeled_us if sched.cost else None, sched.candidates, sched.cost))
    plan = Plan(
        model_hash=graph.structural_hash, model_name=graph.name, policy=policy, device=device.name,
        edges=edges, groups=tuple(groups), base_policy=base_policy, edits=tuple(edits),
        decisions=tuple(decisions), schedule_seconds=0.0, options=tuple(sorted((options or {}).items())),
    )
    if device.kind == "cpu":  # kept groups were coarsened in their own plan
        anchors = {t.stage for g in groups if frozenset(g.stages) in kept for t in g.segments}
        plan = coarsen_plan(plan, graph, device, keep=(set(fixed or ()) if policy == "user" else set()) | anchors)
    # Inputs earlier kernels left in the L2 (a CPU's LLC): after the coarsening, which compares cold costs.
    plan = with_l2_residency(plan, graph, device)
    return dataclasses.replace(plan, schedule_seconds=round(time.perf_counter() - started, 4))


def coarsen_plan(plan: Plan, graph: PrimGraph, device: Device, keep: set[str] = frozenset()) -> Plan:
    """A plan for the host CPU runs the tiles the C target runs: fewer, larger blocks where a block is an
    OpenMP iteration (`codegen.coarsen.coarsen_for_c`), made here so the Plan shows them and the cost
    model costs them — and refuses those it prices past COARSEN_SLACK times the searched tiles (generate
    then takes the plan's tiles as they are). Segments anchored in `keep`
    (tiles a user set) stay as they are."""
    full = {e.key: e.conn for e in plan.edges}
    return dataclasses.replace(plan, groups=tuple(_coarsened(plan, g, graph, device, full, keep) for g in plan.groups))


# A coarsening (`codegen.coarsen.coarsen_for_c`: rules read from the kernel IR and tuned by measurement, blind to
# the cost) is kept where its exact cost models at most this times the searched tiles'. The rules' measured wins
# include coarsenings the model prices up to ~2x worse (convnext's 1.4-1.6x ones: its program 2.7 % slower
# without them; lstm's GEMV columns 1.99x, level); past that the model's verdict stands (mobilevit's expand +
# depthwise group widened from 1 to 16 channels per block: 6.6x modeled, 334 us measured against 31 at its searched tiles;
# benchmarks/NOTES.md coarsenguard).
COARSEN_SLACK = 2.0


def _coarsened(plan: Plan, old: Group, graph: PrimGraph, device: Device, full: Mapping, keep) -> Group:
    """One group of `coarsen_plan`, memoised under the group's structural signature with its stages
    named canonically (as the tile search's subgraph cache is): a deep model's repeated layers are the
    same kernels at the same tiles, and each would otherwise build its kernels and exact cost anew. The
    coarser tiles replace the group's only where they model at most COARSEN_SLACK times its cost."""
    from engine.codegen.coarsen import _with_tiles, coarsen_for_c
    from engine.codegen.mma import tf32_allowed
    from engine.schedule.tiles import canonical_names, group_signature
    from engine.schedule.validate import recompute_bound

    names = canonical_names(graph, old.stages)
    key = (group_signature(graph, old.stages, full), tuple(dataclasses.replace(t, stage=names[t.stage])
                                                          for t in old.segments),
           frozenset(names[a] for a in keep if a in names), device, recompute_bound(), tf32_allowed(),
           whole_graph_facts(graph, device))
    table = memo("build.coarsened", 20000)
    hit = table.get(key)
    if hit is None:
        new = coarsen_for_c(dataclasses.replace(plan, groups=(old,)), graph, device, keep=keep).groups[0]
        cost = None
        if new.segments != old.segments:
            segs = segments_of(graph, new.stages, full)
            tiles = tuple(record_mappings(graph, segs, full, new.segments, device))
            cost = estimate_group(graph, new.stages, full, tiles, device, exact=True)
        if cost is None or (old.cost is not None and cost.modeled_us > old.cost.modeled_us * COARSEN_SLACK):
            hit = table.put(key, ())
        else:
            hit = table.put(key, (tuple(dataclasses.replace(t, stage=names[t.stage]) for t in tiles), cost))
    if not hit:
        return old
    back = {v: k for k, v in names.items()}
    tiles = tuple(dataclasses.replace(t, stage=back[t.stage]) for t in hit[0])
    return dataclasses.replace(_with_tiles(old, list(tiles)), score=hit[1].modeled_us, cost=hit[1])


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


def component_of(graph: PrimGraph, conns: Mapping[Edge, Conn], stage: str) -> set[str]:
    """Stages joined to `stage` by fused edges (its kernel group), found by a local search."""
    seen, todo = {stage}, [stage]
    while todo:
        s = todo.pop()
        nbrs = [c for c in graph.consumers.get(s, ()) if conns.get((s, c), Conn.KERNEL).fused]
        nbrs += [p for p in graph.stage(s).inputs if graph.is_stage(p) and conns.get((p, s), Conn.KERNEL).fused]
        for n in nbrs:
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def creates_cycle(graph: PrimGraph, merged: set[str], group: Callable[[str], set[str]]) -> bool:
    """Would the kernel DAG get a cycle: can a path leave `merged`, run through other groups (a group
    runs as one kernel, so reaching any of its stages reaches all its outputs) and come back?"""
    order = stage_order(graph)
    last = max(order[s] for s in merged)  # a group wholly after the merged one cannot lead back
    todo = [c for s in merged for c in graph.consumers.get(s, ()) if c not in merged]
    done: set[str] = set()
    while todo:
        s = todo.pop()
        if s in done:
            continue
        g = group(s)
        done |= g
        if min(order[x] for x in g) > last:
            continue
        for x in g:
            for c in graph.consumers.get(x, ()):
                if c in merged:
                    return True
                if c not in done:
                    todo.append(c)
    return False


def trial_conns(graph: PrimGraph, conns: Mapping[Edge, Conn], edge: Edge, level: Conn,
                merged: set[str] | None = None) -> dict[Edge, Conn]:
    """`conns` with `edge` at `level`; any other edge that falls inside the merged group is fused too
    (a kernel edge inside a kernel is meaningless): at `level`, or shared from a reduction."""
    trial = dict(conns)
    trial[edge] = level
    if not level.fused:
        return trial
    comp = merged if merged is not None else component_of(graph, trial, edge[0])
    for p in comp:
        for c in graph.consumers.get(p, ()):
            if c in comp and not trial.get((p, c), Conn.KERNEL).fused:
                heavy = graph.stage(p).kind in (StageKind.REDUCE, StageKind.CONTRACTION)
                trial[(p, c)] = Conn.SHARED if level == Conn.REGISTER and heavy else level
    return trial


def can_connect(
    graph: PrimGraph, conns: Mapping[Edge, Conn], edge: Edge, level: Conn, device: Device, mode: str,
    groups: Callable[[str], set[str]] | None = None, keep_tiles: bool = False,
    kept: Mapping[str, Tile] | None = None, beat: float = math.inf, standing: dict | None = None,
    ahead=None,
) -> tuple[Decision, dict[Edge, Conn]]:
    """Is `edge` at `level` legal, and does it not make the modeled time worse? The Decision's
    score is the merged group's modeled µs; the trial connections come back for the caller to keep.
    `groups(stage)` gives the current group of a stage (default: searched in `conns`). With
    `keep_tiles` the merged group keeps the tiles each side has now (a GLOBAL_SYNC merge joins
    whole segments, so only the one-wave rule and the cost are new) instead of searching again.
    `kept`: segment anchor -> tile for groups whose last merge kept some segments' tiles
    (`connect_greedy`'s): such a side has those tiles now — the plan is assembled with them — so it is
    costed at them and keeps them, not searched afresh. `beat`: the score another level of this edge
    reached already (the walk keeps a level only when it models faster): the merged group's tile search
    is bounded by it and by the sides' figure (`search_group`'s `bound`), and a merge no tile brings under
    the bound is refused as such, without the figure of its best tile. `standing`: the walk's schedules of its
    groups as they stand (`_as_it_stands`), keyed by their stages, filled here."""
    prep = trial_search(graph, conns, edge, level, device, mode, groups, keep_tiles, kept, standing)
    if isinstance(prep[0], Decision):
        return prep
    stages, trial, fixed, before, limit = prep
    bound = min(limit, beat - 1e-9)
    sched = ahead.take(edge, level, bound) if ahead is not None else None
    if sched is None:
        sched = search_group(graph, stages, trial, device, mode, fixed, k=1, bound=bound)
    if sched.above:
        other = f"; another level models {beat:.2f} us" if beat - 1e-9 < limit else ""
        return Decision(False, f"{level.value}: no tile models under {bound:.2f} us fused vs {before:.2f} us apart"
                        f"{other} (the tile search stopped there)"), trial
    if sched.violations:
        v = sched.violations[0]
        return Decision(False, f"{level.value}: rule {v.rule}: {v.message}"), trial
    after = sched.cost.modeled_us
    verdict = f"{level.value}: modeled {after:.2f} us fused vs {before:.2f} us apart"
    return Decision(after <= limit, verdict, after, sched.tiles if fixed else (),
                    sched.cost.extra_evaluations == 0 and not sched.cost.serial_segments), trial


def trial_search(graph: PrimGraph, conns: Mapping[Edge, Conn], edge: Edge, level: Conn, device: Device, mode: str,
                 groups: Callable[[str], set[str]] | None = None, keep_tiles: bool = False,
                 kept: Mapping[str, Tile] | None = None, standing: dict | None = None) -> tuple:
    """What `can_connect`'s tile search of `edge` at `level` is asked with: (stages, trial connections, fixed
    tiles, the sides' modeled µs apart, the limit the merge must model at or under) — or (Decision, trial)
    where the answer needs no search (a level that does not fuse, a group cycle)."""
    groups = groups or (lambda s: component_of(graph, conns, s))
    if not level.fused:
        return Decision(True, "separate kernels"), trial_conns(graph, conns, edge, level)
    gp, gc = groups(edge[0]), groups(edge[1])
    merged = gp | gc
    trial = trial_conns(graph, conns, edge, level, merged)
    if gp is not gc and gp != gc and creates_cycle(graph, merged, groups):
        return Decision(False, f"{level.value}: a stage outside the group lies between {edge[0]} and {edge[1]} "
                        "(group cycle)"), trial
    order = stage_order(graph)
    stages = sorted(merged, key=order.__getitem__)
    fixed = None
    sides = [sorted(g, key=order.__getitem__) for g in ([gp] if gp == gc else [gp, gc])]
    now = [_standing(graph, g, conns, device, mode, kept, standing) for g in sides]
    if keep_tiles:
        fixed = {t.stage: t for sched in now for t in sched.tiles}
    else:
        # Segments the merge leaves as they were (behind grid barriers) keep their tiles: only the
        # segment the edge joins is searched again.
        trial_segs = segments_of(graph, stages, trial)
        if len(trial_segs) > 1:
            before_tiles = {frozenset(seg): t for g, sched in zip(sides, now)
                            for seg, t in zip(segments_of(graph, g, conns), sched.tiles)}
            fixed = {before_tiles[frozenset(seg)].stage: before_tiles[frozenset(seg)]
                     for seg in trial_segs if frozenset(seg) in before_tiles} or None
    before = sum(s.cost.modeled_us if s.cost else math.inf for s in now)
    limit = before * (1 + 1e-6) + 1e-6  # the merge is kept at or under it
    return stages, trial, fixed, before, limit


def _standing(graph, stages, conns, device, mode, kept: Mapping[str, Tile] | None, standing: dict | None) -> GroupSchedule:
    """`_as_it_stands`, answered again from `standing` (the walk's, keyed by the group's stages) without the
    search's keys: a group's stages, its inner connections and the tiles its last merge kept change only by a
    merge, which makes a new group (the subgraph cache answers too, but each ask builds its signature and
    renames its answer: 10 % of bert12's cold plan on host)."""
    key = frozenset(stages)
    if standing is not None and key in standing:
        return standing[key]
    sched = _as_it_stands(graph, stages, conns, device, mode, kept)
    if standing is not None:
        standing[key] = sched
    return sched


def _as_it_stands(graph, stages, conns, device, mode, kept: Mapping[str, Tile] | None) -> GroupSchedule:
    """A group's schedule as the walk has it: at the tiles its last merge kept where `kept` holds one
    for every segment (the plan is assembled with them), else its own search."""
    if kept:
        anchors = [segment_sinks(graph, seg, conns)[-1] for seg in segments_of(graph, stages, conns)]
        if all(a in kept for a in anchors):
            return search_group(graph, stages, conns, device, mode, {a: kept[a] for a in anchors}, k=1)
    return search_group(graph, stages, conns, device, mode, k=1)


class SearchAhead:
    """The tile search of an edge's second level (SHARED after REGISTER), asked of a forked child
    (`forked.Forked`, `welder._beside`) before the walk tries the first. The child searches it bounded by the
    sides' figure alone (the first level's score, which bounds it too, is not known yet); `take` gives the walk
    the answer its own search would give under the tighter bound, or None where it cannot tell or the child has
    not started on it (the walk searches itself):
    - where the walk's tables answer already, they do (its own search would hit them);
    - a found schedule: it where it models at or under the bound, else "nothing under the bound" — as a bounded
      search answers (its schedule is the unbounded one wherever that models under its bound);
    - nothing under the child's bound: nothing under the tighter one;
    - no valid tile: None (whether the tighter bound cuts a candidate decides how the search words it).
    The walk's decisions and their wording are the ones it makes alone, whoever searched and whenever."""

    def __init__(self, child):
        self.child = child
        self.rid = 0  # requests asked
        self.used = 0  # answers the walk took
        self.pending: tuple | None = None  # the edge's request: (edge, level, rid, what it searches)

    def before(self, graph, conns, edge: Edge, listed, device: Device, mode: str, group_of_stage, kept, standing):
        """Ask for `edge`'s second level's search (`listed`: its levels), unless the walk's tables have it."""
        listed = list(listed)
        self.pending = None
        if len(listed) < 2 or not listed[1][0].fused or listed[1][0] == Conn.GLOBAL_SYNC or not self.child.serving():
            return
        level = listed[1][0]
        prep = trial_search(graph, conns, edge, level, device, mode, group_of_stage.__getitem__, False, kept, standing)
        if isinstance(prep[0], Decision):
            return
        stages, trial, fixed, _, limit = prep
        if search_cached(graph, stages, trial, device, mode, fixed, 1, limit) is not None:
            return
        self.rid += 1
        index = _edge_index(graph)
        diff = [(index[e], c) for e, c in trial.items() if c != Conn.KERNEL]
        self.child.ask(self.rid, (stages, diff, fixed, limit))
        self.pending = (edge, level, self.rid, (graph, stages, trial, device, mode, fixed), limit)

    def take(self, edge: Edge, level: Conn, bound: float) -> GroupSchedule | None:
        """The search of `edge` at `level` under `bound` where the child's answer gives it, else None."""
        if self.pending is None or self.pending[:2] != (edge, level):
            return None
        _, _, rid, search, limit = self.pending
        self.pending = None
        hit = search_cached(*search, 1, bound)
        if hit is not None:
            self.child.drop(rid)
            return hit
        got = self.child.answer(rid)
        sched = under_tighter(got, limit, bound) if got is not None else None
        self.used += sched is not None
        return sched


def _edge_index(graph: PrimGraph) -> dict:
    return memo("build.edge_index", 64).lookup(graph.structural_hash, lambda: {e: i for i, e in enumerate(graph.edges)})


def serve_searches(graph: PrimGraph, device: Device, mode: str):
    """The child's side of `SearchAhead`: a request's search, bounded as asked."""
    def search(request):
        stages, diff, fixed, limit = request
        conns = {e: Conn.KERNEL for e in graph.edges}
        for i, c in diff:
            conns[graph.edges[i]] = c
        return search_group(graph, stages, conns, device, mode, fixed, k=1, bound=limit)
    return search


LevelChoice = Callable[[PrimGraph, Edge], Sequence[tuple[Conn, str]]]


def _try_level(graph, conns, edge: Edge, level: Conn, device: Device, mode: str, group_of_stage, kept=None,
               beat: float = math.inf, standing: dict | None = None, ahead=None):
    if level == Conn.GLOBAL_SYNC:
        merged = group_of_stage[edge[0]] | group_of_stage[edge[1]]
        segs = len(segments_of(graph, sorted(merged), trial_conns(graph, conns, edge, level, set(merged))))
        if segs > MAX_SEGMENTS:
            return Decision(False, f"global_sync: the kernel would have {segs} grid-barrier segments "
                            f"(the greedy walk stops at {MAX_SEGMENTS})"), conns
    return can_connect(graph, conns, edge, level, device, mode, group_of_stage.__getitem__,
                       keep_tiles=level == Conn.GLOBAL_SYNC, kept=kept, beat=beat, standing=standing, ahead=ahead)


MAX_SEGMENTS = 6  # grid-barrier segments per kernel a greedy walk may build (bounds the work of every
#                   later trial on that kernel, which costs and checks all of its segments)


STAGING_SAVES_NOTHING = ("shared: not tried (the register merge evaluates every element once, not serially: "
                         "staging would save nothing)")


def staging_saves_nothing(graph: PrimGraph, edge: Edge, kept: Decision, trial: Mapping[Edge, Conn]) -> bool:
    """Whether the walk skips `edge`'s SHARED trial given the merge it keeps so far (`kept`, at `trial`): a
    REGISTER merge whose group evaluates every element of its stages once (`GroupCost.extra_evaluations` 0)
    and runs no segment serially, into a per-element consumer. Staging the producer's tile in
    shared memory would compute the same elements and add their stores and loads: there is no recompute for it
    to save (cold welder plans of the zoo on host, a100, h100 and v100 kept every plan, benchmarks/NOTES.md
    sharedskip). A serial segment is left out because the staging's work can carry it over the C target's
    serial threshold (`ctarget.SERIAL_WORK`) onto every core: sample layernorm_residual's Div -> Mul on host
    models 101.6 us serial at REGISTER, 51.0 us at SHARED on two threads. Into a contraction, a reduction or a
    layout stage the two levels print different kernels (a contraction stages its operands either way, a pooling
    window is staged like a conv's, a layout stage reads the staged tile in its own order): on a100, zoo
    mobilenetv2's clip -> depthwise conv, mobilevit's conv -> transpose and sample conv_bn_relu's relu -> maxpool
    edges model faster at SHARED though REGISTER recomputes nothing, so those trials stay."""
    return (kept.once and trial.get(edge) == Conn.REGISTER
            and graph.stage(edge[1]).kind == StageKind.ELEMENTWISE)


def connect_greedy(graph: PrimGraph, device: Device, mode: str, levels: LevelChoice,
                   fallback: LevelChoice | None = None, start: int = 0,
                   pause: Mapping[int, Callable[[], object]] | None = None, ahead: SearchAhead | None = None):
    """Walk edges in topological order; per edge try each allowed level (with why it is allowed),
    keep the legal one with the lowest modeled time (ties go to the closer level). When none is
    kept, the `fallback` levels get the same test. Returns (conns, reasons, scores, log, kept): `kept`
    holds the tiles of groups whose last merge kept some segments' tiles instead of searching them
    again — pass them to `assemble` as `fixed` so the plan has the tiles the decision was made with.
    `start`: the walk begins at that edge, the ones before left apart (a forked child warming the tile
    searches of a graph's later part: `welder._beside`); `pause`: edge index -> a call made before that edge
    is tried (the walk takes the child's searches there)."""
    conns: dict[Edge, Conn] = {e: Conn.KERNEL for e in graph.edges}
    reasons: dict[Edge, str] = {}
    scores: dict[Edge, float | None] = {}
    log: list[str] = []
    group_of_stage: dict[str, set[str]] = {s.name: {s.name} for s in graph.stages}
    kept: dict[str, Tile] = {}  # segment anchor -> tile, for groups whose last merge kept tiles
    standing: dict = {}  # frozenset(group) -> its schedule as it stands (`_as_it_stands`)
    for index, edge in enumerate(graph.edges):
        if index < start:
            continue
        serve_point()
        if pause and index in pause:
            pause[index]()
        if conns[edge].fused:
            log.append(f"{edge[0]} -> {edge[1]}: {conns[edge].value} (kept: fused with its group)")
            continue
        best = None
        noes: list[str] = []
        if ahead is not None:
            ahead.before(graph, conns, edge, levels(graph, edge), device, mode, group_of_stage, kept, standing)
        for choose in (levels, fallback):
            if best is not None or choose is None:
                break
            for level, why in choose(graph, edge):
                if level == Conn.SHARED and best is not None and staging_saves_nothing(graph, edge, *best[:2]):
                    noes.append(STAGING_SAVES_NOTHING)
                    continue
                beat = best[0].score if best is not None else math.inf
                decision, trial = _try_level(graph, conns, edge, level, device, mode, group_of_stage, kept, beat,
                                             standing, ahead)
                if not decision.ok:
                    noes.append(decision.reason)
                elif best is None or decision.score < best[0].score - 1e-9:
                    best = (decision, trial, why)
        if best is None:
            reasons[edge] = "; ".join(noes) if noes else "not fused by this policy"
            log.append(f"{edge[0]} -> {edge[1]}: kernel ({reasons[edge]})")
            continue
        decision, trial, why = best
        refused = [n for n in noes if not n.startswith(f"{decision.reason.split(':')[0]}:")]
        merged = group_of_stage[edge[0]] | group_of_stage[edge[1]]
        for s in merged:
            group_of_stage[s] = merged
            kept.pop(s, None)
        kept.update((t.stage, t) for t in decision.tiles)
        for e, conn in trial.items():
            if conn != conns[e] and e != edge:
                reasons[e] = f"fused along with {edge[0]} -> {edge[1]}"
        conns = trial
        reasons[edge] = f"{why}; {decision.reason}" + (f" (refused: {'; '.join(refused)})" if refused else "")
        scores[edge] = decision.score
        log.append(f"{edge[0]} -> {edge[1]}: {conns[edge].value} ({reasons[edge]})")
    for line in log:
        debug(3, line)
    return conns, reasons, scores, log, kept
