"""Rammer's wavefront policy: a Plan (kernel groups with costs) and a Device in, an RProgram out.

Kernels become rOperators; BFS levels of the kernel DAG are waves; each wave picks kernel variants by
whether it fills the vDevice and places its rTasks on the earliest-free vEUs; adjacent waves merge
(dependency counters instead of a grid barrier) when the model says that is faster."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

from engine.device import Device
from engine.ir.graph import PrimGraph
from engine.rprogram.model import (
    MEASURED,
    MODELED,
    ROperator,
    RProgram,
    RProgramError,
    RTask,
    Step,
    Variant,
    VDevice,
    make_vdevice,
)
from engine.schedule.plan import Conn, Group, Plan, Tile

# A block waiting on a dependency counter polls one L2 atomic: a few hundred ns on sm_70+ (estimate).
DEFAULT_SYNC_US = 0.5


def build_rprogram(plan: Plan, device: Device | str, *, graph: PrimGraph | None = None,
                   profile: Mapping[str, float] | object | None = None, merge: bool = True,
                   variants: bool = True, sync_us: float = DEFAULT_SYNC_US) -> RProgram:
    """Schedule the plan's kernels on a vDevice of `device` with the wavefront policy.

    With `graph`, kernel variants (the groups' top-k candidate tiles) are costed by the scheduler's cost
    model; without it, scaled from the chosen tile. `profile` gives measured kernel times in µs by kernel
    name (a mapping, or an object with a `kernel_us` mapping); kernels it names use them (labelled
    "measured"), the others the cost model. `variants=False` keeps every kernel at the plan's tile
    (what a Program generated from the plan runs, e.g. as a persistent kernel)."""
    if isinstance(device, str):
        from engine.device import get_device

        device = get_device(device)
    if not plan.groups:
        raise RProgramError(f"plan for {plan.model_name!r} has no kernels to schedule")
    measured = _measured_times(profile)
    if graph is not None:
        plan = split_grid_barriers(plan, graph, device)
    envelope = [_resources(g, device) for g in plan.groups]
    vdev = make_vdevice(device, max(r[0] for r in envelope), max(r[1] for r in envelope),
                        max(r[2] for r in envelope))
    ops = operators_from_plan(plan, device, vdev, measured, graph)
    if not variants:
        ops = tuple(dataclasses.replace(op, variants=op.variants[:1]) for op in ops)
    launch_us = device.launch_overhead_s * 1e6
    veus, steps = schedule_wavefront(ops, vdev, barrier_us=device.grid_barrier_s * 1e6, sync_us=sync_us,
                                     merge=merge)
    return RProgram(
        model_name=plan.model_name, policy=plan.policy, vdevice=vdev, operators=ops, veus=veus,
        steps=steps, launch_us=launch_us, barrier_us=device.grid_barrier_s * 1e6, sync_us=sync_us,
        sequential_us=sum(op.kernel_us + launch_us for op in ops),
    )


def _measured_times(profile) -> dict[str, float]:
    """Kernel name -> µs from a mapping, a Profile (`kernels` of KernelTime), or an object with a
    `kernel_us` mapping."""
    if profile is None:
        return {}
    if isinstance(profile, Mapping):
        times = profile
    elif isinstance(getattr(profile, "kernels", None), tuple | list):
        times = {k.kernel: k.us for k in profile.kernels}
    else:
        times = getattr(profile, "kernel_us", None)
    if not isinstance(times, Mapping):
        raise RProgramError(f"profile of type {type(profile).__name__} has no per-kernel times",
                            hint="pass a Profile or a mapping of kernel name to measured µs")
    return {str(k): float(v) for k, v in times.items()}


def _resources(g: Group, device: Device) -> tuple[int, int, int]:
    """threads, shared bytes per block, registers per thread (0 = unknown) of a group's kernel."""
    if g.cost is None:
        raise RProgramError(f"kernel {g.name} has no cost in the plan", hint="schedule it with a policy that "
                            "models costs (make_plan) before building an rProgram")
    shared = int(g.cost.footprint.get("shared", 0))
    reg_bytes = int(g.cost.footprint.get("register", 0))
    # Registers beyond the ISA limit spill to local memory instead of failing the launch.
    regs = min(device.max_regs_per_thread, -(-reg_bytes // 4))
    return g.threads, shared, regs


def kernel_time_us(g: Group) -> float:
    """The modeled kernel on its own, without its launch overhead (the rProgram launches once)."""
    assert g.cost is not None
    return max(0.0, g.cost.modeled_us - float(g.cost.terms_us.get("launch", 0.0)))


def task_time_us(kernel_us: float, waves: int, blocks: int, resident: int, vdev: VDevice) -> float:
    """Duration of one rTask. The modeled kernel runs `waves` waves, each with up to `resident` blocks
    sharing an SM; on the vDevice at most `slots` share it. A block's time is taken proportional to
    how many blocks share its SM (bandwidth-bound), so a kernel alone on the vDevice keeps its modeled
    time whatever the slot count."""
    per_sm = -(-blocks // vdev.sm_count)  # blocks an SM gets when the grid spreads over all SMs
    own = max(1, min(resident, per_sm))
    here = max(1, min(vdev.slots, per_sm))
    return kernel_us / max(1, waves) * min(1.0, here / own)


def operators_from_plan(plan: Plan, device: Device, vdev: VDevice, measured: Mapping[str, float] | None = None,
                        graph: PrimGraph | None = None) -> tuple[ROperator, ...]:
    """One rOperator per group, its dependencies from the stage edges that cross groups."""
    measured = measured or {}
    owner = {s: g.name for g in plan.groups for s in g.stages}
    deps: dict[str, list[str]] = {g.name: [] for g in plan.groups}
    for e in plan.edges:
        a, b = owner.get(e.producer), owner.get(e.consumer)
        if a is None or b is None:
            raise RProgramError(f"edge {e.producer} -> {e.consumer} names a stage in no kernel group")
        if a != b and a not in deps[b]:
            deps[b].append(a)
    ops = []
    for g in plan.groups:
        threads, shared, regs = _resources(g, device)
        assert g.cost is not None
        kernel_us, source = (measured[g.name], MEASURED) if g.name in measured else (kernel_time_us(g), MODELED)
        task_us = task_time_us(kernel_us, g.cost.waves, g.blocks, g.cost.resident_blocks_per_sm, vdev)
        chosen = _variant(g.segments[0], g.blocks, threads, shared, regs, task_us, source, "plan")
        others = (_costed_variants(g, plan, graph, device, vdev) if graph is not None and source == MODELED
                  else _candidate_variants(g, chosen, vdev))
        ops.append(ROperator(g.name, g.id, g.stages, (chosen, *others), tuple(deps[g.name]), kernel_us))
    return tuple(ops)


def _candidate_variants(g: Group, chosen: Variant, vdev: VDevice) -> list[Variant]:
    """Top-k tiles as variants. Only single-segment kernels (one tile decides the grid) and tiles that
    fit the vDevice's block envelope; a candidate's per-block time is the chosen one's scaled by its
    traffic per wave (the cost model is bandwidth-bound for these)."""
    if len(g.segments) != 1 or not g.candidates:
        return []
    base = next((c for c in g.candidates if c.tile == g.segments[0]), None)
    per_wave0 = base.traffic_bytes / max(1, base.waves) if base else 0.0
    out, seen = [], {dataclasses.replace(g.segments[0], stage="")}
    for c in g.candidates:
        key = dataclasses.replace(c.tile, stage="")
        if key in seen or per_wave0 <= 0:
            continue
        seen.add(key)
        scale = (c.traffic_bytes / max(1, c.waves)) / per_wave0
        shared = int(chosen.shared_bytes * math.prod(c.tile.shape) / max(1, math.prod(chosen.tile)))
        if c.tile.threads > vdev.threads or shared > vdev.shared_bytes:
            continue
        out.append(_variant(c.tile, c.tile.blocks, c.tile.threads, shared, chosen.regs_per_thread,
                            chosen.task_us * scale, f"{chosen.source} (scaled from the chosen tile by "
                            f"traffic per wave)", "candidate"))
    return out


def _costed_variants(g: Group, plan: Plan, graph: PrimGraph, device: Device, vdev: VDevice) -> list[Variant]:
    """Top-k tiles as variants, each costed by the scheduler's cost model (legal tiles that fit the
    vDevice's block envelope only)."""
    from engine.schedule.cost import estimate_group
    from engine.schedule.validate import check_group

    if len(g.segments) != 1:
        return []
    conns = {e.key: e.conn for e in plan.edges}
    out, seen = [], {dataclasses.replace(g.segments[0], stage="")}
    pool = [(c.tile, "candidate") for c in g.candidates] + [(t, "split") for t in _finer_tiles(g, graph, vdev)]
    for tile, origin in pool:
        key = dataclasses.replace(tile, stage="")
        if key in seen or check_group(graph, g.stages, conns, [tile], device):
            continue
        seen.add(key)
        cost = estimate_group(graph, g.stages, conns, [tile], device, warm=g.cost.l2_warm if g.cost else ())
        variant_group = dataclasses.replace(g, segments=(tile,), cost=cost)
        threads, shared, regs = _resources(variant_group, device)
        if threads > vdev.threads or shared > vdev.shared_bytes or regs > max(vdev.regs_per_thread, 1):
            continue
        task = task_time_us(kernel_time_us(variant_group), cost.waves, tile.blocks,
                            cost.resident_blocks_per_sm, vdev)
        out.append(_variant(tile, tile.blocks, threads, shared, regs, task, MODELED, origin))
    return out


def _finer_tiles(g: Group, graph: PrimGraph, vdev: VDevice) -> list[Tile]:
    """Rammer's extra-parallel variants for small grids: the chosen tile with its innermost output axis
    halved (down to one warp's transaction, 32 elements) while the grid still fits one vDevice wave."""
    from engine.schedule.tiles import make_tile

    base = g.segments[0]
    stage = graph.stage(base.stage)
    if not base.shape or base.row_split != 1 or base.blocks * 2 > vdev.veus:
        return []
    out, inner = [], base.shape[-1]
    while inner > 32 and base.blocks * base.shape[-1] // (inner // 2) <= vdev.veus:
        inner //= 2
        shape = base.shape[:-1] + (inner,)
        threads = max(32, min(base.threads, -(-math.prod(shape) // 32) * 32))
        out.append(make_tile(stage, shape, threads, base.reduce_step))
    return out


def _variant(tile: Tile, blocks: int, threads: int, shared: int, regs: int, task_us: float, source: str,
             origin: str) -> Variant:
    return Variant(blocks, threads, shared, regs, task_us, source, tile.shape, tile.reduce_step,
                   tile.rows_per_block, tile.threads_per_row, tile.row_split, origin, tile.thread_shape)


def split_grid_barriers(plan: Plan, graph: PrimGraph, device: Device) -> Plan:
    """The plan with every grid barrier (GLOBAL_SYNC edge) turned into a kernel boundary, each segment
    its own kernel at the tile it had: in an rProgram the dependency between rOperators (a counter, or
    the barrier between steps) does what the in-kernel grid barrier did, and single-segment kernels can
    run as rTasks of the persistent kernel and take split variants. A segment splitting its rows across
    blocks (row_split > 1) needs its consumers behind a grid barrier: such a group stays whole."""
    from engine.schedule.build import assemble

    keep = {s for g in plan.groups if any(t.row_split > 1 for t in g.segments) for s in g.stages}
    cut = [e for e in plan.edges if e.conn == Conn.GLOBAL_SYNC and e.producer not in keep]
    if not cut:
        return plan
    conns = {e.key: (Conn.KERNEL if e in cut else e.conn) for e in plan.edges}
    reasons = {e.key: ("global_sync cut for the rProgram: a dependency between rOperators replaces the grid "
                       "barrier" if e in cut else e.reason) for e in plan.edges}
    fixed = {t.stage: t for g in plan.groups for t in g.segments}
    return assemble(graph, device, conns, policy=plan.policy, mode=plan.policy, reasons=reasons,
                    scores={e.key: e.score for e in plan.edges}, decisions=plan.decisions, fixed=fixed,
                    base_policy=plan.base_policy, edits=plan.edits, sources={e.key: e.source for e in plan.edges},
                    options=dict(plan.options))


def plan_for_rprogram(plan: Plan, rp: RProgram, graph: PrimGraph, device: Device) -> Plan:
    """The plan with every kernel at the tile its rProgram variant chose (cost re-estimated), so that
    `generate` produces the kernels the rProgram schedules; kernels left at variant 0 are untouched.
    Grid barriers are cut first, as `build_rprogram` does (`split_grid_barriers`)."""
    from engine.schedule.cost import estimate_group
    from engine.schedule.tiles import record_mappings

    plan = split_grid_barriers(plan, graph, device)
    conns = {e.key: e.conn for e in plan.edges}
    groups = []
    for g in plan.groups:
        v = rp.chosen(g.name)
        if v.origin == "plan":
            groups.append(g)
            continue
        tile = Tile(g.segments[0].stage, v.tile, v.threads, v.blocks, v.reduce_step, v.rows_per_block,
                    v.threads_per_row, v.row_split, v.thread_shape)
        tile = record_mappings(graph, [list(g.stages)], conns, [tile], device)[0]  # the mapping it runs
        cost = estimate_group(graph, g.stages, conns, [tile], device, warm=g.cost.l2_warm if g.cost else ())
        groups.append(dataclasses.replace(g, segments=(tile,), cost=cost,
                                          reason=f"{g.reason}; rProgram variant {v.origin} tile {list(v.tile)}"))
    return dataclasses.replace(plan, groups=tuple(groups))


# ---- the policy -----------------------------------------------------------------------------


def bfs_waves(ops: tuple[ROperator, ...]) -> list[list[str]]:
    """Operators by BFS level of the dependency DAG (level = 1 + deepest dependency), plan order kept
    within a level. Plans order groups by their first stage, which need not be topological."""
    names = [op.name for op in ops]
    deps = {op.name: op.deps for op in ops}
    for op in ops:
        unknown = [d for d in op.deps if d not in deps]
        if unknown:
            raise RProgramError(f"rOperator {op.name} depends on {unknown[0]}, which is not a kernel")
    level: dict[str, int] = {}
    while len(level) < len(names):
        ready = [n for n in names if n not in level and all(d in level for d in deps[n])]
        if not ready:
            stuck = [n for n in names if n not in level]
            raise RProgramError(f"kernels {', '.join(stuck[:3])} depend on each other (a cycle)",
                                hint="split the group that closes the cycle")
        for n in ready:
            level[n] = 1 + max((level[d] for d in deps[n]), default=-1)
    waves: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for n in names:
        waves[level[n]].append(n)
    return waves


def choose_variants(ops: list[ROperator], veus: int) -> tuple[list[int], str]:
    """Per op the variant to run: the fastest when the wave's chosen tiles leave vEUs idle, the one
    using the least vEU-time when they over-fill the device."""
    blocks = sum(op.variants[0].blocks for op in ops)
    if blocks <= veus:
        picks = [min(range(len(op.variants)),
                     key=lambda k, op=op: (math.ceil(op.variants[k].blocks / veus) * op.variants[k].task_us, k))
                 for op in ops]
        return picks, f"{blocks} blocks fill {blocks}/{veus} vEUs: fastest variants"
    picks = [min(range(len(op.variants)), key=lambda k, op=op: (op.variants[k].busy_us, k)) for op in ops]
    return picks, f"{blocks} blocks over-fill {veus} vEUs: most resource-efficient variants"


@dataclass
class _Placer:
    """Earliest-free-vEU list scheduling of one step; copyable to try a merge."""

    free: list  # heap of (free time, vEU)
    tasks: list  # (vEU, RTask)
    ends: dict  # op -> end of its last rTask

    @staticmethod
    def start(veus: int, at: float) -> _Placer:
        return _Placer([(at, v) for v in range(veus)], [], {})

    def copy(self) -> _Placer:
        return _Placer(list(self.free), list(self.tasks), dict(self.ends))

    def place(self, op: ROperator, variant: Variant, step_start: float, sync_us: float) -> None:
        in_step = [self.ends[d] for d in op.deps if d in self.ends]
        # Dependencies from earlier steps ended before the barrier; in-step ones are waited on through
        # a counter, which every dependent rTask polls once.
        ready = max(in_step, default=step_start)
        wait = sync_us if in_step else 0.0
        end_max = ready
        for b in range(variant.blocks):
            free, v = heapq.heappop(self.free)
            s = max(free, ready) + wait
            e = s + variant.task_us
            heapq.heappush(self.free, (e, v))
            self.tasks.append((v, RTask(op.name, b, s, e)))
            end_max = max(end_max, e)
        self.ends[op.name] = end_max

    @property
    def end(self) -> float:
        return max(t for t, _ in self.free)


def schedule_wavefront(ops: tuple[ROperator, ...], vdev: VDevice, *, barrier_us: float, sync_us: float,
                       merge: bool = True) -> tuple[tuple[tuple[RTask, ...], ...], tuple[Step, ...]]:
    """Place every rTask; returns per-vEU task lists (start order) and the steps between barriers."""
    by_name = {op.name: op for op in ops}
    waves = bfs_waves(ops)
    steps: list[Step] = []
    done: list[tuple[int, RTask]] = []
    t0 = 0.0
    cur: _Placer | None = None
    cur_waves: list[int] = []
    cur_ops: list[str] = []
    cur_picks: list[int] = []
    cur_reason = ""
    for w, names in enumerate(waves):
        wave_ops = [by_name[n] for n in names]
        picks, why = choose_variants(wave_ops, vdev.veus)
        if cur is not None:
            merged = cur.copy()
            for op, k in zip(wave_ops, picks):
                merged.place(op, op.variants[k], t0, sync_us)
            apart = _Placer.start(vdev.veus, cur.end + barrier_us)
            for op, k in zip(wave_ops, picks):
                apart.place(op, op.variants[k], cur.end + barrier_us, sync_us)
            if merge and merged.end < apart.end:
                cur, cur_waves, cur_ops, cur_picks = merged, cur_waves + [w], cur_ops + names, cur_picks + picks
                cur_reason += (f"; wave {w} merged ({why}): ends at {merged.end:.2f} µs, "
                               f"{apart.end:.2f} µs after a barrier")
                continue
            steps.append(Step(len(steps), tuple(cur_waves), tuple(cur_ops), tuple(cur_picks), t0, cur.end,
                              cur_reason))
            done.extend(cur.tasks)
            cur_reason = (f"barrier before wave {w} ({why}): merged it would end at {merged.end:.2f} µs, "
                          f"not before {apart.end:.2f} µs" if merge else f"barrier before wave {w} ({why}): "
                          f"merging disabled")
            t0 = cur.end + barrier_us
            cur = apart
        else:
            cur = _Placer.start(vdev.veus, t0)
            for op, k in zip(wave_ops, picks):
                cur.place(op, op.variants[k], t0, sync_us)
            cur_reason = f"wave {w} starts the program ({why})"
        cur_waves, cur_ops, cur_picks = [w], list(names), list(picks)
    if cur is not None:
        steps.append(Step(len(steps), tuple(cur_waves), tuple(cur_ops), tuple(cur_picks), t0, cur.end,
                          cur_reason))
        done.extend(cur.tasks)
    per_veu: list[list[RTask]] = [[] for _ in range(vdev.veus)]
    for v, task in done:
        per_veu[v].append(task)
    return tuple(tuple(sorted(ts, key=lambda t: (t.start_us, t.end_us))) for ts in per_veu), tuple(steps)


def check_rprogram(rp: RProgram) -> list[str]:
    """Every broken rule, one line each: a vEU running two rTasks at once, an rTask starting before an
    rTask it reads from has ended, a block missing or placed twice."""
    problems: list[str] = []
    eps = 1e-9
    for v, tasks in enumerate(rp.veus):
        for a, b in zip(tasks, tasks[1:]):
            if b.start_us < a.end_us - eps:
                problems.append(f"vEU {v}: {b.op}#{b.block} starts at {b.start_us} before "
                                f"{a.op}#{a.block} ends at {a.end_us}")
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    seen: dict[str, set[int]] = {}
    for tasks in rp.veus:
        for t in tasks:
            first[t.op] = min(first.get(t.op, math.inf), t.start_us)
            last[t.op] = max(last.get(t.op, -math.inf), t.end_us)
            blocks = seen.setdefault(t.op, set())
            if t.block in blocks:
                problems.append(f"{t.op}: block {t.block} placed twice")
            blocks.add(t.block)
    for op in rp.operators:
        want = rp.chosen(op.name).blocks
        if len(seen.get(op.name, ())) != want:
            problems.append(f"{op.name}: {len(seen.get(op.name, ()))} of {want} blocks placed")
        for d in op.deps:
            if op.name in first and d in last and first[op.name] < last[d] - eps:
                problems.append(f"{op.name} starts at {first[op.name]} before its input {d} ends at {last[d]}")
    return problems
