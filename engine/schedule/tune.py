"""Measured tuning (Welder's method): a plan in, the same plan with every kernel picked by measurement on
the device out (`plan_model(..., tune=K)`, `--tune K`).

Each group's top-K tile candidates (the cost model's ranking) are compiled and timed on the device — the
host CPU through the C backend, a GPU through the cuda launch layer — and the fastest is kept. For the
welder policy the search also spans the other policies' groupings of the same graph: the stages are
split into blocks (the smallest sets that every policy's groups tile exactly; blocks on a cycle are
merged so any choice stays acyclic), and each block runs the groups of whichever policy's kernels,
measured, are fastest there. So the tuned welder plan is never slower, kernel by kernel, than the
unfused, elementwise or stitch plan: the greedy walk's path dependence is checked against measurement.

Measurements are cached by subgraph signature (the group's canonical structure and tiles, the device's
figures and the code generator's sources), in this process and on disk, so repeated layers and repeated
runs are measured once.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from engine.device import Device
from engine.errors import BackendError, PlanError
from engine.files import write_atomic
from engine.flags import debug
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Conn, EdgePlan, Group, Plan, Tile, components, kernel_name
from engine.tilegraph.tilegraph import DisjointSets, stage_order

ALTERNATIVES = ("unfused", "elementwise", "stitch")  # what a tuned welder plan is checked against
REPEAT = 7  # launches per kernel per measurement (the median is kept)
MAX_TUNE = 8

Measure = Callable[[Plan], Mapping[str, float]]  # a plan -> microseconds per kernel (group) name


def check_tune(k) -> int:
    """`k` as a candidate count, or a one-line PlanError."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TUNE:
        raise PlanError(f"--tune {k!r}: the number of tile candidates to measure per kernel must be 1..{MAX_TUNE}",
                        hint="e.g. --tune 3")
    return k


def tune_plan(graph: PrimGraph, plan: Plan, device: Device, k: int, *, measure: Measure | None = None,
              alternatives: Mapping[str, Plan] | None = None, repeat: int = REPEAT) -> Plan:
    """`plan` (of `graph`, for `device`) with each kernel's tiles — and, for welder, each block's
    grouping among the policies' — chosen by measurement. `measure` times a plan's kernels (default: on
    the device itself, see `device_measure`); `alternatives` are the other policies' plans of `graph`
    (default: made here for welder, none for other policies)."""
    from engine.schedule.validate import validate

    check_tune(k)
    started = time.perf_counter()
    measure = measure or device_measure(graph, device, repeat)
    if alternatives is None:
        alternatives = _alternatives(graph, plan, device) if plan.policy == "welder" else {}
    plans = {plan.policy: plan, **{p: a for p, a in alternatives.items() if p != plan.policy}}
    conns_of = {p: {e.key: e.conn for e in pl.edges} for p, pl in plans.items()}
    cache = _Cache(device)
    best: dict[tuple[str, str], tuple[float, tuple[Tile, ...]]] = {}  # (policy, group name) -> (us, tiles)
    measured = 0
    for policy, base in plans.items():
        for variant in _variants(graph, base, device, k):
            keys = {g.name: _key(graph, g, conns_of[policy], cache.salt) for g in variant.groups}
            if any(cache.get(key) is None for key in keys.values()):
                for name, us in measure(variant).items():
                    cache.add(keys[name], us)
                measured += 1
            for g in variant.groups:
                us = cache.get(keys[g.name])
                if us is not None and (best.get((policy, g.name)) is None or us < best[(policy, g.name)][0]):
                    best[(policy, g.name)] = (us, g.segments)
    cache.save()
    tuned, log = _choose(graph, plan, plans, best, device)
    problems = validate(tuned, graph, device)
    if problems:  # cannot happen by construction (blocks are acyclic, tiles were valid): say so loudly
        raise PlanError(f"tuned plan refused: {problems[0]}", hint="re-plan without --tune and report this")
    seconds = time.perf_counter() - started
    head = (f"tune: {k} tile candidate(s) per kernel measured on {device.name} ({measured} program(s) run, "
            f"median of {repeat} launches each; {seconds:.1f} s)")
    debug(1, head + f": {sum(g.measured_us or 0 for g in tuned.groups):.1f} us measured over {tuned.kernels} kernels")
    options = dict(tuned.options) | {"tune": k}
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
                cost = estimate_group(graph, g.stages, conns, tiles, device, exact=True)
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
    return dataclasses.replace(plan, edges=tuple(edges), groups=tuple(groups))


# ---- measuring --------------------------------------------------------------------------------


def device_measure(graph: PrimGraph, device: Device, repeat: int = REPEAT, *, gpu=None) -> Measure:
    """Time a plan's kernels on `device`: the host through the C backend, a GPU through the cuda launch
    layer (`gpu`: an opened Gpu, else the attached one; a one-line BackendError without one). Inputs are
    fixed-seed random values."""
    from engine.runtime.inputs import make_inputs

    inputs = make_inputs(graph, seed=0)
    if device.kind != "cpu" and gpu is None:
        from engine.runtime.cuda_driver import require_cuda

        try:
            require_cuda()
        except BackendError as err:
            raise BackendError(f"--tune measures on the device and no GPU is attached ({err})",
                               hint="tune for this CPU with --device host, or drop --tune") from None

    def measure(plan: Plan) -> dict[str, float]:
        from engine.codegen.generate import generate

        program = generate(plan, graph, device, target="c" if device.kind == "cpu" else "cuda")
        if device.kind == "cpu":
            from engine.runtime.cpu import compile_program_c, run_cpu

            _, profile = run_cpu(compile_program_c(program), graph.specs, inputs, graph.weights, repeat=repeat)
        else:
            from engine.runtime.cuda import run_cuda

            _, profile = run_cuda(program, graph.specs, inputs, graph.weights, device=device.name, repeat=repeat,
                                  gpu=gpu)
        return {t.kernel: t.us for t in profile.kernels}
    return measure


def _key(graph: PrimGraph, group: Group, conns: Mapping, salt: str) -> str:
    """Subgraph signature of a group on its tiles: its canonical structure (tensor names renamed, so a
    repeated layer has the same key), the tiles with their anchors renamed alike, and `salt`."""
    from engine.schedule.tiles import group_signature

    pos = {s: f"s{j}" for j, s in enumerate(group.stages)}
    tiles = [dataclasses.replace(t, stage=pos.get(t.stage, t.stage)) for t in group.segments]
    text = json.dumps([group_signature(graph, group.stages, conns), [dataclasses.astuple(t) for t in tiles], salt])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@functools.cache
def codegen_version() -> str:
    """A hash of the sources that decide what a kernel compiles to and how it is timed: a change to any
    of them makes earlier measurements stale."""
    import engine

    root = Path(engine.__file__).parent
    h = hashlib.sha256()
    for path in sorted([*root.glob("codegen/*.py"), root / "runtime" / "cpu.py", root / "runtime" / "cuda.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class _Cache:
    """Microseconds per subgraph key: the samples this process measured and those on disk for the device
    (`cache_dir()/tune/`), median over every sample."""

    _memory: dict[str, dict[str, list[float]]] = {}

    def __init__(self, device: Device):
        from engine.flags import cache_dir

        self.salt = hashlib.sha256((device.to_json() + codegen_version()).encode()).hexdigest()[:16]
        self.path = cache_dir() / "tune" / f"{device.name}-{self.salt}.json"
        self.samples = self._memory.setdefault(self.salt, {})
        if not self.samples and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
                self.samples.update({k: [float(x) for x in v] for k, v in data.items() if isinstance(v, list)})
            except (OSError, ValueError, TypeError):
                pass  # a damaged cache only costs a measurement
        self.dirty = False

    def get(self, key: str) -> float | None:
        got = self.samples.get(key)
        return statistics.median(got) if got else None

    def add(self, key: str, us: float) -> None:
        if np.isfinite(us) and us >= 0:
            self.samples.setdefault(key, []).append(float(us))
            self.dirty = True

    def save(self) -> None:
        if self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self.samples, sort_keys=True).encode())
            self.dirty = False
