"""User edits on a Plan: one Edit (set_edge, split, merge, set_tile) in, a re-derived and validated
Plan out — or a PlanError naming the broken rule. `replay` applies an ordered edit list on a base
policy deterministically; `apply_to_identical_layers` repeats an edit on every identical layer."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

from engine.codegen.micro import micro_budget
from engine.device import Device, get_device
from engine.errors import PlanError
from engine.ir.graph import PrimGraph
from engine.schedule.build import assemble, trial_conns
from engine.schedule.plan import EDIT_KINDS, Conn, Edit, Plan, Tile
from engine.schedule.tiles import group_signature, make_tile, staging_limit
from engine.schedule.validate import validate
from engine.tilegraph.tilegraph import segment_sinks, segments_of

_MODES = ("unfused", "elementwise", "stitch", "welder")


def _arg(edit: Edit, name: str, required: bool = True):
    args = edit.arg
    if name not in args and required:
        raise PlanError(f"edit {edit.kind} needs argument '{name}'", hint=f"given: {', '.join(args) or 'none'}")
    return args.get(name)


def _edge_of(plan: Plan, graph: PrimGraph, edit: Edit) -> tuple[str, str]:
    p, c = str(_arg(edit, "producer")), str(_arg(edit, "consumer"))
    if (p, c) not in set(graph.edges):
        raise PlanError(f"edit {edit.kind}: '{p}' -> '{c}' is not an edge of model '{graph.name}'",
                        hint="tileweave plan MODEL --json lists the edges")
    return p, c


def _fixed_tiles(plan: Plan, graph: PrimGraph) -> dict[str, Tile]:
    out: dict[str, Tile] = {}
    for e in plan.edits:
        if e.kind == "set_tile":
            out[str(e.arg["stage"])] = _tile_from(graph, e)
    return out


def _tile_from(graph: PrimGraph, edit: Edit) -> Tile:
    name = str(_arg(edit, "stage"))
    if not graph.is_stage(name):
        raise PlanError(f"edit set_tile: '{name}' is not a stage of model '{graph.name}'")
    shape, threads = _arg(edit, "shape"), _arg(edit, "threads")
    stage = graph.stage(name)
    try:
        shape = tuple(int(x) for x in shape)
        threads = int(threads)
    except (TypeError, ValueError):
        raise PlanError(f"edit set_tile: shape {shape!r} / threads {threads!r} must be integers") from None
    if len(shape) != len(stage.shape) or any(t < 1 for t in shape):
        raise PlanError(f"edit set_tile: tile {list(shape)} does not fit the rank-{len(stage.shape)} output "
                        f"{list(stage.shape)} of '{name}'")
    step = _arg(edit, "reduce_step", False) or ()
    try:
        step = tuple(int(x) for x in step)
    except (TypeError, ValueError):
        raise PlanError(f"edit set_tile: reduce_step {step!r} must be a list of integers") from None
    if any(s < 1 for s in step):
        raise PlanError(f"edit set_tile: reduce_step {list(step)} must be positive")
    tpr = _arg(edit, "threads_per_row", False)
    mapping = _arg(edit, "thread_shape", False) or ()
    try:
        mapping = tuple(int(x) for x in mapping)
    except (TypeError, ValueError):
        raise PlanError(f"edit set_tile: thread_shape {mapping!r} must be a list of integers (ty, tx)") from None
    return make_tile(stage, shape, threads, step, int(tpr) if tpr is not None else None, thread_shape=mapping)


def _check_mapping(tile: Tile, device: Device) -> None:
    """A thread mapping the user gave must be one codegen prints as given: (ty, tx) with tx a power of two,
    ty * tx the block's threads, the tm x tn micro-tile within the device's accumulator budget and the k
    step's staging within its shared-memory budget; refused in one line naming the mappings that fit."""
    if not tile.thread_shape:
        return
    bm, bn = math.prod(tile.shape[:-1]), tile.shape[-1] if tile.shape else 1
    acc = micro_budget(device).accumulators
    step = math.prod(tile.reduce_step) if tile.reduce_step else 32
    fits = [(tile.threads // tx, tx) for tx in (1 << e for e in range(tile.threads.bit_length()))
            if tile.threads % tx == 0 and -(-bm // (tile.threads // tx)) * -(-bn // tx) <= acc
            and min(step, 4) <= staging_limit(tile.shape, tile.threads, device, (tile.threads // tx, tx))]
    if len(tile.shape) >= 2 and tile.thread_shape in fits:
        return
    named = ", ".join("x".join(map(str, m)) for m in fits) or "none (use more threads or a smaller tile)"
    raise PlanError(f"edit set_tile: thread_shape {'x'.join(map(str, tile.thread_shape))} does not fit tile "
                    f"{list(tile.shape)} of '{tile.stage}' on {tile.threads} threads on {device.name} "
                    f"(ty x tx, tx a power of two, ty * tx = threads, at most {acc} accumulators per thread); "
                    f"mappings that fit: {named}")


def _check_step(graph: PrimGraph, tile: Tile, device: Device, edit: Edit) -> None:
    """A k step the user gave must be printed as given: one whose GEMM staging is over the device's budget
    (codegen would halve it behind the plan's back) is refused, naming the largest that fits."""
    if not _arg(edit, "reduce_step", False) or len(tile.shape) < 2:
        return
    step = math.prod(tile.reduce_step)
    reduce = graph.stage(tile.stage).reduce
    if reduce:
        step = min(step, math.prod(reduce))
    limit = staging_limit(tile.shape, tile.threads, device, tile.thread_shape)
    if step > max(4, limit):
        raise PlanError(f"edit set_tile: k step {step} of '{tile.stage}' at tile {list(tile.shape)} on {tile.threads} "
                        f"threads stages more than {device.name}'s shared-memory budget allows (codegen would halve it)",
                        hint=f"use a reduce_step of at most {max(4, limit)}, or a smaller tile")


def apply_edit(plan: Plan, graph: PrimGraph, device: Device, edit: Edit) -> Plan:
    """Apply one edit, re-derive groups, tiles and costs, validate; PlanError names the broken rule.
    The plan's own options (its recompute bound) hold throughout."""
    from engine.schedule.validate import bounded

    with bounded(dict(plan.options)):
        return _apply_edit(plan, graph, device, edit)


def _apply_edit(plan: Plan, graph: PrimGraph, device: Device, edit: Edit) -> Plan:
    started = time.perf_counter()
    if plan.model_hash != graph.structural_hash:
        raise PlanError(f"plan was made for model '{plan.model_name}', not '{graph.name}'")
    if edit.kind not in EDIT_KINDS:
        raise PlanError(f"unknown edit kind '{edit.kind}'", hint=f"use one of {', '.join(EDIT_KINDS)}")
    base = plan.base_policy or plan.policy
    mode = base if base in _MODES else "welder"
    conns = {e.key: e.conn for e in plan.edges}
    reasons = {e.key: e.reason for e in plan.edges}
    sources = {e.key: e.source for e in plan.edges}
    fixed = _fixed_tiles(plan, graph)
    if edit.kind in ("set_edge", "split"):
        edge = _edge_of(plan, graph, edit)
        level = Conn.KERNEL if edit.kind == "split" else _conn(_arg(edit, "conn"))
        conns[edge] = level
        reasons[edge], sources[edge] = f"user: {edit.kind} to {level.value}", "user"
    elif edit.kind == "merge":
        edge = _edge_of(plan, graph, edit)
        conns = _best_merge(plan, graph, device, edit, edge, conns, reasons, sources, fixed, mode, base)
    else:
        tile = _tile_from(graph, edit)
        anchors = _anchors(plan, graph, conns)
        if tile.stage not in anchors:
            raise PlanError(f"edit set_tile: '{tile.stage}' anchors no segment of this plan",
                            hint=f"set the tile of a segment's sink, e.g. '{sorted(anchors)[0]}'")
        _check_mapping(tile, device)
        _check_step(graph, tile, device, edit)
        fixed[tile.stage] = tile
    new = assemble(graph, device, conns, policy="user", mode=mode, reasons=reasons, sources=sources,
                   decisions=plan.decisions, fixed=fixed, base_policy=base, edits=plan.edits + (edit,),
                   options=dict(plan.options), started=started,
                   keep=_untouched(plan, conns, {tile.stage} if edit.kind == "set_tile" else set()))
    bad = validate(new, graph, device)
    if bad:
        raise PlanError(f"edit {_describe(edit)} is illegal: {bad[0]}")
    return new


def _untouched(plan: Plan, conns: Mapping, tiled: set[str]) -> list:
    """The plan's groups an edit leaves alone (no edge touching them changes level, none of their tiles
    is newly fixed: `tiled`), kept as the plan has them. A policy's plan may hold tiles its search chose
    segment by segment while a group grew (welder's GLOBAL_SYNC merges) that a fresh search of the whole
    group would not choose again: searching them again re-tiled kernels the edit never touched (and the
    app recompiled them)."""
    old = {e.key: e.conn for e in plan.edges}
    touched = {s for e, conn in conns.items() if old.get(e, Conn.KERNEL) != conn for s in e} | tiled
    return [g for g in plan.groups if touched.isdisjoint(g.stages)]


def _conn(value) -> Conn:
    try:
        return Conn(str(value))
    except ValueError:
        raise PlanError(f"unknown connection '{value}'", hint=f"use one of {', '.join(c.value for c in Conn)}") from None


def _anchors(plan: Plan, graph: PrimGraph, conns: Mapping) -> set[str]:
    out: set[str] = set()
    for g in plan.groups:
        for seg in segments_of(graph, g.stages, conns):
            out.update(segment_sinks(graph, seg, conns))
    return out


def _best_merge(plan, graph, device, edit, edge, conns, reasons, sources, fixed, mode, base) -> dict:
    """The fused level for `edge` that validates with the lowest modeled time (register first on ties)."""
    best, noes = None, []
    for level in (Conn.REGISTER, Conn.SHARED, Conn.GLOBAL_SYNC):
        trial = trial_conns(graph, conns, edge, level)
        cand = assemble(graph, device, trial, policy="user", mode=mode, fixed=fixed, base_policy=base,
                        keep=_untouched(plan, trial, set()))
        bad = validate(cand, graph, device)
        if bad:
            noes.append(f"{level.value}: {bad[0]}")
        elif best is None or cand.modeled_us < best[1] - 1e-9:
            best = (trial, cand.modeled_us, level)
    if best is None:
        raise PlanError(f"edit {_describe(edit)} is illegal at every level: " + "; ".join(noes))
    trial, _, level = best
    for e, conn in trial.items():
        if conn != conns.get(e):
            reasons[e], sources[e] = f"user: merge at {conn.value}", "user"
    return trial


def _describe(edit: Edit) -> str:
    return f"{edit.kind}(" + ", ".join(f"{k}={v}" for k, v in edit.args) + ")"


def replay(base_policy: str, edits: Sequence[Edit], graph: PrimGraph, device: Device, *,
           options: Mapping | None = None) -> Plan:
    """The base policy's plan with `edits` applied in order (deterministic)."""
    from engine.schedule.policies import make_plan

    started = time.perf_counter()
    plan = make_plan(graph, base_policy, device, options=options)
    for edit in edits:
        plan = apply_edit(plan, graph, device, edit)
    import dataclasses

    return dataclasses.replace(plan, schedule_seconds=round(time.perf_counter() - started, 4))


def apply_to_identical_layers(plan: Plan, graph: PrimGraph, edit: Edit, device: Device | None = None) -> Plan:
    """Apply `edit` to its edge (or tile's stage) and to every structurally identical one — the same
    producer/consumer expressions and shapes up to tensor names, i.e. the same place in another layer."""
    device = device or get_device(plan.device)
    if edit.kind == "set_tile":
        name = str(_arg(edit, "stage"))
        if not graph.is_stage(name):
            raise PlanError(f"edit set_tile: '{name}' is not a stage of model '{graph.name}'")
        key = group_signature(graph, [name], {})
        targets = [s.name for s in graph.stages if group_signature(graph, [s.name], {}) == key]
        edits = [Edit.make("set_tile", **(edit.arg | {"stage": s})) for s in targets]
    else:
        p, c = _edge_of(plan, graph, edit)
        key = group_signature(graph, [p, c], {})
        same = [(a, b) for a, b in graph.edges if group_signature(graph, [a, b], {}) == key]
        edits = [Edit.make(edit.kind, **(edit.arg | {"producer": a, "consumer": b})) for a, b in same]
    for e in edits:
        plan = apply_edit(plan, graph, device, e)
    return plan
