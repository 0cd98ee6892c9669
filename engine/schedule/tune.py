"""Measured tuning (Welder's method): a plan in, the same plan with every kernel picked by measurement on
the device out (`plan_model(..., tune=K)`, `--tune K`).

Each group's top-K tile candidates (the cost model's ranking) are compiled and timed on the device — the
host CPU through the C backend, a GPU through the cuda launch layer — and the fastest is kept. For the
welder policy the search also spans the other policies' groupings of the same graph: the stages are
split into blocks (the smallest sets that every policy's groups tile exactly; blocks on a cycle are
merged so any choice stays acyclic), and each block runs the groups of whichever policy's kernels,
measured, are fastest there. So the tuned welder plan is never slower, kernel by kernel, than the
unfused, elementwise or stitch plan: the greedy walk's path dependence is checked against measurement.

The work is a job (`prepare_tune`): the variants, and a list of independent measure tasks (compile a
variant's kernels, then time them) for the kernels the tuning database (engine/schedule/tunedb.py) does
not hold yet, keyed by subgraph signature (the group's canonical structure and tiles), device and code
version, so repeated layers and repeated runs are measured once. The tasks run here (`run_local`) or on
a Ray cluster (engine/schedule/farm.py); `finish_tune` chooses from the database.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from engine.device import Device
from engine.errors import PlanError
from engine.flags import debug
from engine.ir.graph import PrimGraph
from engine.schedule.measure import (
    REPEAT,
    Measure,
    ProgramMeasure,
    codegen_version,
    device_measure,
    host_program_measure,
)
from engine.schedule.plan import Conn, EdgePlan, Group, Plan, Tile, components, kernel_name
from engine.schedule.tunedb import TuneDB, new_rows
from engine.tilegraph.tilegraph import DisjointSets, stage_order

__all__ = ["check_tune", "tune_plan", "prepare_tune", "run_local", "finish_tune", "blocks_of", "device_measure",
           "codegen_version", "keep_fastest_program", "MeasureTask", "TuneJob"]

ALTERNATIVES = ("unfused", "elementwise", "stitch")  # what a tuned welder plan is checked against
PROGRAM_MARGIN = 0.03  # how much faster, whole, another program must measure to replace the untuned plan
MAX_TUNE = 8

Progress = Callable[[int, int], None]  # (tasks done, tasks in all)


def check_tune(k) -> int:
    """`k` as a candidate count, or a one-line PlanError."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TUNE:
        raise PlanError(f"--tune {k!r}: the number of tile candidates to measure per kernel must be 1..{MAX_TUNE}",
                        hint="e.g. --tune 3")
    return k


def tune_plan(graph: PrimGraph, plan: Plan, device: Device, k: int, *, measure: Measure | None = None,
              alternatives: Mapping[str, Plan] | None = None, repeat: int = REPEAT, db: TuneDB | None = None,
              progress: Progress | None = None, program_measure: ProgramMeasure | None = None) -> Plan:
    """`plan` (of `graph`, for `device`) with each kernel's tiles — and, for welder, each block's
    grouping among the policies' — chosen by measurement, in this process. `measure` times a plan's
    kernels (default: on the device itself, see `device_measure`); `alternatives` are the other policies'
    plans of `graph` (default: made here for welder, none for other policies); `db` is the tuning
    database measurements are read from and recorded in (default: `TuneDB()`).
    Then the whole programs: kernels timed one at a time, each launched again and again, do not add up to
    the program they make (the tuned plans of bert, resnet and swin measured 1.25-1.5x slower whole than
    the untuned welder plan, RESULTS.md tenth-table), so the tuned plan, the untuned one and the
    alternatives are timed whole (`program_measure`: plans by name -> µs; default on the host device with
    the default `measure`, `host_program_measure`; none elsewhere) and the fastest is kept
    (`keep_fastest_program`)."""
    check_tune(k)
    own = db is None
    db = TuneDB() if own else db
    try:
        job = prepare_tune(graph, plan, device, k, db=db, alternatives=alternatives, repeat=repeat)
        if job.tasks:
            run_local(job.tasks, {graph.structural_hash: measure or device_measure(graph, device, repeat)}, db, device,
                      repeat=repeat, progress=progress)
        tuned = finish_tune(job, db)
    finally:
        if own:
            db.close()
    if program_measure is None and measure is None and device.kind == "cpu":
        program_measure = host_program_measure(graph, device)
    return keep_fastest_program(tuned, job, program_measure) if program_measure else tuned


def keep_fastest_program(tuned: Plan, job: TuneJob, program_measure: ProgramMeasure) -> Plan:
    """Of `tuned` and the job's untuned plans (the tuned policy's own and, for welder, the alternatives;
    their kernels' measured times filled in from the job), the one whose whole program `program_measure`
    times fastest — the tuned policy's untuned plan unless another is faster by more than PROGRAM_MARGIN —
    as a plan of the tuned policy with the tune's options and its decisions, plus one naming every
    program's time and which was kept."""
    candidates = {"tuned": tuned}
    for policy, j, variant, keys in job.variants:
        if j == 0:
            groups = tuple(dataclasses.replace(g, measured_us=round(job.times[keys[g.name]], 3))
                           if keys[g.name] in job.times else g for g in variant.groups)
            candidates[f"{policy} untuned"] = dataclasses.replace(variant, groups=groups)
    times = program_measure(candidates)
    # The untuned plan of the tuned policy (the model's choice) stays unless another program measured
    # faster by more than the rounds' noise: one run picked stitch's plan for convnext at 0.99x welder's,
    # and it measured 1.6x slower in the next (benchmarks/NOTES.md tenth-entry-ranking).
    own = f"{tuned.policy} untuned"
    best = min(candidates, key=lambda n: times[n] / (1.0 + PROGRAM_MARGIN if n == own else 1.0))
    line = ("tune: whole programs measured (median of interleaved rounds): "
            + ", ".join(f"{n} {times[n]:.1f} us" for n in candidates) + f"; kept the {best} plan")
    if best == "tuned":
        return dataclasses.replace(tuned, decisions=tuned.decisions + (line,))
    head = tuple(d for d in tuned.decisions if d.startswith("tune: "))
    return dataclasses.replace(candidates[best], policy=tuned.policy, options=tuned.options,
                               decisions=candidates[best].decisions + head + (line,),
                               schedule_seconds=tuned.schedule_seconds)


# ---- jobs and tasks ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MeasureTask:
    """One plan variant to compile and time: its kernels' subgraph signatures by kernel name. `task_id`
    is fixed before the task runs, so a retried task's rows are recorded once."""

    task_id: str
    model: str
    graph_hash: str  # the graph the plan is of (runners look it up by this)
    policy: str
    variant: int
    plan: Plan
    signatures: tuple[tuple[str, str], ...]


@dataclasses.dataclass
class TuneJob:
    """Everything a tune of one plan needs: the policies' plans and their variants with each kernel's
    signature, the tasks still to measure, and what the database already knew when it was prepared."""

    graph: PrimGraph
    plan: Plan
    device: Device
    k: int
    repeat: int
    model: str
    plans: dict[str, Plan]
    variants: list[tuple[str, int, Plan, dict[str, str]]]  # (policy, j, variant, kernel -> signature)
    tasks: list[MeasureTask]
    known: dict[str, float]  # signature -> us, served from the database
    code_version: str
    started: float
    times: dict[str, float] = dataclasses.field(default_factory=dict)  # after finish_tune: every signature's us

    def candidates(self) -> list[dict]:
        """Per variant and kernel: its tiles and measured time, and whether the database already had it
        (after `finish_tune`)."""
        rows = []
        for policy, j, variant, keys in self.variants:
            for g in variant.groups:
                sig = keys[g.name]
                rows.append({"model": self.model, "policy": policy, "candidate": j, "kernel": g.name,
                             "tiles": " ".join("x".join(map(str, t.shape)) for t in g.segments),
                             "measured_us": self.times.get(sig), "from_db": sig in self.known, "signature": sig})
        return rows


def prepare_tune(graph: PrimGraph, plan: Plan, device: Device, k: int, *, db: TuneDB,
                 alternatives: Mapping[str, Plan] | None = None, repeat: int = REPEAT, model: str = "",
                 job_id: str | None = None, pending: set[str] | None = None) -> TuneJob:
    """The tune of `plan` as a job: its variants and the measure tasks the database cannot serve. A
    variant is measured when one of its kernels is neither in the database nor measured by an earlier
    task (of this job, or of any job sharing `pending`)."""
    check_tune(k)
    if alternatives is None:
        alternatives = _alternatives(graph, plan, device) if plan.policy == "welder" else {}
    plans = {plan.policy: plan, **{p: a for p, a in alternatives.items() if p != plan.policy}}
    conns_of = {p: {e.key: e.conn for e in pl.edges} for p, pl in plans.items()}
    version = codegen_version()
    model = model or graph.name
    job_id = job_id or uuid.uuid4().hex
    pending = set() if pending is None else pending
    variants = [(policy, j, variant, {g.name: _key(graph, g, conns_of[policy]) for g in variant.groups})
                for policy, base in plans.items() for j, variant in enumerate(_variants(graph, base, device, k))]
    known = db.lookup({sig for *_, keys in variants for sig in keys.values()}, device, version)
    tasks = []
    for policy, j, variant, keys in variants:
        if any(sig not in known and sig not in pending for sig in keys.values()):
            task_id = hashlib.sha256(f"{job_id}/{model}/{plan.policy}/{policy}/{j}".encode()).hexdigest()[:24]
            tasks.append(MeasureTask(task_id, model, graph.structural_hash, policy, j, variant,
                                     tuple(sorted(keys.items()))))
            pending.update(keys.values())
    return TuneJob(graph, plan, device, k, repeat, model, plans, variants, tasks, known, version,
                   time.perf_counter())


def task_rows(task: MeasureTask, times: Mapping[str, float], device: Device, repeat: int, worker: str):
    """The database rows of one task's result."""
    return new_rows(task.task_id, dict(task.signatures), times, device, codegen_version(), repeat,
                    model=task.model, policy=task.policy, worker=worker)


def run_local(tasks: Sequence[MeasureTask], measures: Mapping[str, Measure], db: TuneDB, device: Device, *,
              repeat: int = REPEAT, progress: Progress | None = None) -> None:
    """Measure `tasks` one after another in this process (`measures`: the measure function per graph
    hash), recording each result as it comes."""
    worker = f"{socket.gethostname()}:{os.getpid()}"
    for n, task in enumerate(tasks, 1):
        db.record(task_rows(task, measures[task.graph_hash](task.plan), device, repeat, worker))
        if progress:
            progress(n, len(tasks))


def finish_tune(job: TuneJob, db: TuneDB) -> Plan:
    """The tuned plan of a prepared job whose tasks have all run: per kernel the fastest candidate in the
    database, per block (welder) the fastest policy's kernels."""
    from engine.schedule.validate import validate

    graph, plan, device = job.graph, job.plan, job.device
    job.times = db.lookup({sig for *_, keys in job.variants for sig in keys.values()}, device, job.code_version)
    best: dict[tuple[str, str], tuple[float, tuple[Tile, ...]]] = {}  # (policy, group name) -> (us, tiles)
    for policy, _, variant, keys in job.variants:
        for g in variant.groups:
            us = job.times.get(keys[g.name])
            if us is not None and (best.get((policy, g.name)) is None or us < best[(policy, g.name)][0]):
                best[(policy, g.name)] = (us, g.segments)
    tuned, log = _choose(graph, plan, job.plans, best, device)
    problems = validate(tuned, graph, device)
    if problems:  # cannot happen by construction (blocks are acyclic, tiles were valid): say so loudly
        raise PlanError(f"tuned plan refused: {problems[0]}", hint="re-plan without --tune and report this")
    seconds = time.perf_counter() - job.started
    served = len({sig for *_, keys in job.variants for sig in keys.values()} & job.known.keys())
    head = (f"tune: {job.k} tile candidate(s) per kernel measured on {device.name} ({len(job.tasks)} program(s) run, "
            f"{served} kernel(s) served from the tuning database, median of {job.repeat} launches each; {seconds:.1f} s)")
    debug(1, head + f": {sum(g.measured_us or 0 for g in tuned.groups):.1f} us measured over {tuned.kernels} kernels")
    options = dict(tuned.options) | {"tune": job.k}
    return dataclasses.replace(tuned, decisions=tuned.decisions + (head,) + tuple(log),
                               options=tuple(sorted(options.items())),
                               schedule_seconds=round(plan.schedule_seconds + seconds, 4))


# ---- candidates -------------------------------------------------------------------------------


def _alternatives(graph: PrimGraph, plan: Plan, device: Device) -> dict[str, Plan]:
    from engine.schedule.policies import make_plan

    options = {k: v for k, v in plan.options if k != "tune"}
    return {p: make_plan(graph, p, device, options=options) for p in ALTERNATIVES}


def _variants(graph: PrimGraph, plan: Plan, device: Device, k: int) -> list[Plan]:
    """The plan itself, then variant j = every single-segment group on its j-th candidate tile (as the
    device runs it: coarsened on the host), for j < k; variants that change nothing are dropped. Tiles a
    user set (set_tile edits) are kept."""
    from engine.schedule.build import coarsen_plan
    from engine.schedule.cost import estimate_group

    out = [plan]
    conns = {e.key: e.conn for e in plan.edges}
    pinned = {str(e.arg.get("stage")) for e in plan.edits if e.kind == "set_tile"}  # a user's tiles stay
    for j in range(1, k):
        groups, changed = [], False
        for g in plan.groups:
            if g.segments[0].stage in pinned:
                pass
            elif len(g.segments) == 1 and len(g.candidates) > j and g.candidates[j].tile != g.segments[0]:
                tiles = (g.candidates[j].tile,)
                warm = g.cost.l2_warm if g.cost else ()
                cost = estimate_group(graph, g.stages, conns, tiles, device, exact=True, warm=warm)
                g = dataclasses.replace(g, segments=tiles, score=cost.modeled_us, cost=cost)
                changed = True
            groups.append(g)
        if not changed:
            break
        variant = dataclasses.replace(plan, groups=tuple(groups))
        if device.kind == "cpu":
            variant = coarsen_plan(variant, graph, device, keep=pinned)
        out.append(variant)
    return out


# ---- choosing ---------------------------------------------------------------------------------


def blocks_of(graph: PrimGraph, plans: Sequence[Plan]) -> list[list[str]]:
    """The smallest stage sets that every plan's groups tile exactly (unions of overlapping groups), with
    blocks that lie on a cycle of the block graph merged, in a topological order: choosing any plan's
    groups per block then gives an acyclic kernel graph (a cycle would need one inside a block, hence
    inside one plan)."""
    names = [s.name for s in graph.stages]
    sets = DisjointSets(names)
    for plan in plans:
        for g in plan.groups:
            for s in g.stages[1:]:
                sets.union(s, g.stages[0])
    while cycle := _block_cycle(graph, {s: sets.find(s) for s in names}):
        for r in cycle[1:]:
            sets.union(r, cycle[0])
    return _topological(sets.groups(graph, names), graph)


def _block_cycle(graph: PrimGraph, root: Mapping[str, str]) -> list[str]:
    """Block roots on one cycle of the block graph (empty when acyclic)."""
    succ: dict[str, set[str]] = {r: set() for r in set(root.values())}
    for p, c in graph.edges:
        if root[p] != root[c]:
            succ[root[p]].add(root[c])
    state: dict[str, int] = {}
    for start in sorted(succ):
        if state.get(start):
            continue
        stack, path = [(start, iter(sorted(succ[start])))], [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(succ[nxt]))))
                path.append(nxt)
    return []


def _topological(blocks: list[list[str]], graph: PrimGraph) -> list[list[str]]:
    of = {s: k for k, b in enumerate(blocks) for s in b}
    deps = {k: {of[p] for p, c in graph.edges if of[c] == k and of[p] != k} for k in range(len(blocks))}
    order = stage_order(graph)
    out, done = [], set()
    while len(out) < len(blocks):
        ready = min((k for k in deps if k not in done and deps[k] <= done), key=lambda k: order[blocks[k][0]])
        out.append(blocks[ready])
        done.add(ready)
    return out


Pick = tuple[str, Group, float]  # (policy, group, measured us)


def _choose(graph: PrimGraph, plan: Plan, plans: Mapping[str, Plan],
            best: Mapping[tuple[str, str], tuple[float, tuple[Tile, ...]]], device: Device) -> tuple[Plan, list[str]]:
    """The faster of two covers of the stages by measured groups — per block the policy whose groups
    there are fastest (`_by_blocks`), or any policy's fused groups where each saves time against its
    stages run apart (`_by_savings`) — reassembled into a plan with its edges, reasons and costs."""
    blocks, log = _by_blocks(graph, plan, plans, best)
    picks = blocks
    if len(plans) > 1:
        savings = _by_savings(graph, plans, best)
        if savings is not None:
            t_blocks, t_savings = sum(p[2] for p in blocks), sum(p[2] for p in savings)
            use = t_savings < t_blocks
            log.append(f"tune: kernels picked {'one by one' if use else 'per block'}: one by one {t_savings:.1f} us, "
                       f"per block {t_blocks:.1f} us")
            picks = savings if use else blocks
    return _assemble(graph, plan, plans, picks, best, device), log


def _by_blocks(graph: PrimGraph, plan: Plan, plans: Mapping[str, Plan],
               best: Mapping[tuple[str, str], tuple[float, tuple[Tile, ...]]]) -> tuple[list[Pick], list[str]]:
    """Per block (see `blocks_of`), every group of the policy whose groups there measured fastest in total
    (ties keep `plan`'s): never slower than any one policy's plan, kernel time summed."""
    picks: list[Pick] = []
    log = []
    for block in blocks_of(graph, list(plans.values())):
        members = set(block)
        totals = {}
        for policy, pl in plans.items():
            groups = [g for g in pl.groups if g.stages[0] in members]
            times = [best.get((policy, g.name), (None,))[0] for g in groups]
            if all(t is not None for t in times):
                totals[policy] = (sum(times), groups)
        if not totals:
            raise PlanError(f"tune: no measurement for the kernels of {block[0]}", hint="re-plan without --tune")
        pick = min(totals, key=lambda p: (totals[p][0], p != plan.policy))
        picks += [(pick, g, best[(pick, g.name)][0]) for g in totals[pick][1]]
        if len(plans) > 1 and (len(block) > 1 or pick != plan.policy):
            shown = ", ".join(f"{p} {t:.1f} us" for p, (t, _) in sorted(totals.items(), key=lambda x: x[1][0]))
            log.append(f"tune: block {block[0]} .. {block[-1]} ({len(block)} stages): {shown} -> {pick}")
    return picks, log


def _by_savings(graph: PrimGraph, plans: Mapping[str, Plan],
                best: Mapping[tuple[str, str], tuple[float, tuple[Tile, ...]]]) -> list[Pick] | None:
    """Fused groups of any policy, taken greedily by the time each saves against its stages as single
    kernels (their fastest single-stage kernels, measured), skipping a group that overlaps one taken or
    would close a cycle of kernels; every other stage runs as its own kernel. None without a measured
    single-stage kernel for every stage."""
    from engine.schedule.build import creates_cycle

    singles: dict[str, Pick] = {}
    for policy, pl in plans.items():
        for g in pl.groups:
            hit = best.get((policy, g.name))
            if len(g.stages) == 1 and hit and (g.stages[0] not in singles or hit[0] < singles[g.stages[0]][2]):
                singles[g.stages[0]] = (policy, g, hit[0])
    if len(singles) < len(graph.stages):
        return None
    fused = []
    for policy, pl in plans.items():
        for g in pl.groups:
            hit = best.get((policy, g.name))
            if len(g.stages) > 1 and hit:
                saving = sum(singles[s][2] for s in g.stages) - hit[0]
                if saving > 0:
                    fused.append((saving, policy, g, hit[0]))
    fused.sort(key=lambda x: (-x[0], x[1], x[2].name))
    group_of = {s.name: {s.name} for s in graph.stages}
    picks: list[Pick] = []
    for _, policy, g, us in fused:
        merged = set(g.stages)
        if any(len(group_of[s]) > 1 for s in merged) or creates_cycle(graph, merged, group_of.__getitem__):
            continue
        for s in merged:
            group_of[s] = merged
        picks.append((policy, g, us))
    return picks + [singles[s] for s, grp in group_of.items() if len(grp) == 1]


def _assemble(graph: PrimGraph, plan: Plan, plans: Mapping[str, Plan], picks: Sequence[Pick],
              best: Mapping[tuple[str, str], tuple[float, tuple[Tile, ...]]], device: Device) -> Plan:
    """`plan` rebuilt from `picks` (a cover of the stages): each group's own edges from its policy's
    plan, KERNEL between groups, each group on its fastest tiles, costed there."""
    from engine.schedule.cost import estimate_group

    of = {s: (policy, g) for policy, g, _ in picks for s in g.stages}
    own = {policy: {e.key: e for e in pl.edges} for policy, pl in plans.items()}
    edges = []
    for p, c in graph.edges:
        (pp, gp), (pc, gc) = of[p], of[c]
        if gp is gc:
            e = own[pp][(p, c)]
            if pp != plan.policy:
                e = dataclasses.replace(e, reason=f"tune: {pp}'s kernel measured fastest here; {e.reason}")
        else:
            e = EdgePlan(p, c, Conn.KERNEL, f"tune: separate kernels ({pc if pc != plan.policy else 'its own'} "
                                             f"kernel for {c}, measured fastest)")
        edges.append(e)
    conns = {e.key: e.conn for e in edges}
    by_first = {g.stages[0]: (policy, g, us) for policy, g, us in picks}
    groups = []
    for k, comp in enumerate(components(graph, conns)):
        policy, g, us = by_first[comp[0]]
        if tuple(g.stages) != tuple(comp):
            raise PlanError(f"tune: group {g.name} does not match its edges", hint="re-plan without --tune")
        tiles = best[(policy, g.name)][1]
        cost = g.cost
        if tiles != g.segments or cost is None:
            cost = estimate_group(graph, g.stages, conns, tiles, device, exact=True)
        reason = g.reason + f"; measured {us:.1f} us on {device.name}" + (f" ({policy}'s kernel)" if policy != plan.policy else "")
        groups.append(dataclasses.replace(g, id=k, name=kernel_name(k, graph, comp), segments=tiles, reason=reason,
                                          score=cost.modeled_us, cost=cost, measured_us=round(us, 3)))
    from engine.schedule.residency import with_l2_residency

    return with_l2_residency(dataclasses.replace(plan, edges=tuple(edges), groups=tuple(groups)), graph, device)


# ---- signatures -------------------------------------------------------------------------------


def _key(graph: PrimGraph, group: Group, conns: Mapping) -> str:
    """Subgraph signature of a group on its tiles: its canonical structure (tensor names renamed, so a
    repeated layer has the same key) and the tiles with their anchors renamed alike. The device and the
    code version are the database's other key columns."""
    from engine.schedule.tiles import group_signature

    pos = {s: f"s{j}" for j, s in enumerate(group.stages)}
    tiles = [dataclasses.replace(t, stage=pos.get(t.stage, t.stage)) for t in group.segments]
    text = json.dumps([group_signature(graph, group.stages, conns), [dataclasses.astuple(t) for t in tiles]])
    return hashlib.sha256(text.encode()).hexdigest()[:24]
