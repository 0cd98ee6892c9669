"""Table rows and detail dicts for the pages: model summary, groups, edges, one group or edge in
detail, the edit list, and the reference verdict. Pure: engine values in, plain dicts out."""

from __future__ import annotations

from collections import Counter

from app.views.fmt import fmt_bytes, fmt_count, fmt_shape, fmt_us
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Edit, Group, Plan


def model_summary(graph: PrimGraph, onnx_ops: dict | None = None) -> dict:
    """Headline numbers of a model: ONNX ops, primitive stages, parameters, FLOPs, minimum DRAM."""
    params = sum(t.size for t in graph.constants)
    return {
        "onnx ops": sum((onnx_ops or {}).values()),
        "stages": len(graph.stages),
        "edges": len(graph.edges),
        "parameters": params,
        "parameter bytes": graph.param_bytes,
        "FLOPs": graph.flops,
        "min DRAM bytes": graph.min_dram_bytes,
    }


def summary_cards(summary: dict) -> list[tuple[str, str]]:
    """(label, formatted value) for st.metric."""
    return [
        ("ONNX ops", str(summary["onnx ops"])),
        ("Primitive stages", str(summary["stages"])),
        ("Parameters", fmt_count(summary["parameters"])),
        ("FLOPs", fmt_count(summary["FLOPs"])),
        ("Min DRAM traffic", fmt_bytes(summary["min DRAM bytes"])),
    ]


def stage_op_rows(graph: PrimGraph) -> list[dict]:
    counts = Counter((s.kind.value, s.op or s.kind.value) for s in graph.stages)
    return [{"kind": k, "op": op, "stages": n} for (k, op), n in sorted(counts.items())]


def group_rows(plan: Plan) -> list[dict]:
    rows = []
    for g in plan.groups:
        cost = g.cost
        rows.append({
            "id": g.id, "kernel": g.name, "stages": len(g.stages), "segments": len(g.segments),
            "blocks": g.blocks, "threads": g.threads,
            "DRAM bytes": int(cost.traffic_bytes.get("dram", 0)) if cost else None,
            "modeled µs": round(cost.modeled_us, 2) if cost else None,
            "reason": g.reason,
        })
    return rows


def edge_label(producer: str, consumer: str) -> str:
    return f"{producer} → {consumer}"


def edge_rows(graph: PrimGraph, plan: Plan) -> list[dict]:
    rows = []
    for e in plan.edges:
        spec = graph.specs[e.producer]
        rows.append({
            "edge": edge_label(e.producer, e.consumer), "connection": e.conn.value, "shape": fmt_shape(spec.shape),
            "bytes": spec.nbytes, "source": e.source, "reason": e.reason,
        })
    return rows


def tile_rows(group: Group) -> list[dict]:
    return [{"segment": k, "anchor stage": t.stage, "tile": fmt_shape(t.shape), "threads": t.threads,
             "blocks": t.blocks, "reduce step": fmt_shape(t.reduce_step) if t.reduce_step else "—",
             "rows/block": t.rows_per_block, "threads/row": t.threads_per_row, "row split": t.row_split,
             "threads ty x tx": fmt_shape(t.thread_shape) if t.thread_shape else "—"}
            for k, t in enumerate(group.segments)]


def group_detail(graph: PrimGraph, group: Group) -> dict:
    """Everything about one kernel group the Tile-graph page shows when it is selected."""
    cost = group.cost
    out = {
        "kernel": group.name, "reason": group.reason, "score": group.score,
        "stages": [f"{s} ({graph.stage(s).op or graph.stage(s).kind.value}, {fmt_shape(graph.stage(s).shape)})"
                   for s in group.stages],
        "tiles": tile_rows(group),
    }
    if cost:
        out["footprint"] = {k: fmt_bytes(v) for k, v in cost.footprint.items()}
        out["traffic"] = {k: fmt_bytes(v) for k, v in cost.traffic_bytes.items()}
        if cost.l2_warm:  # inputs earlier kernels left in L2 (modeled on a GPU preset, unmeasured)
            out["read from L2, left by earlier kernels"] = (f"{', '.join(cost.l2_warm)}: {fmt_bytes(cost.l2_warm_bytes)} "
                                                            "of DRAM saved")
        out["modeled time"] = {k: fmt_us(v) for k, v in cost.terms_us.items()} | {"total": fmt_us(cost.modeled_us)}
        out["occupancy"] = (f"{cost.resident_blocks_per_sm} blocks/SM (limited by {cost.occupancy_limiter}), "
                            f"{cost.waves} wave(s), efficiency {cost.wave_efficiency:.0%}")
    return out


def edge_detail(graph: PrimGraph, plan: Plan, producer: str, consumer: str) -> dict:
    e = plan.edge(producer, consumer)
    spec = graph.specs[producer]
    return {
        "edge": edge_label(producer, consumer), "connection": e.conn.value, "reason": e.reason,
        "score": e.score, "source": e.source, "tensor": f"{fmt_shape(spec.shape)} {spec.dtype.value}",
        "bytes": fmt_bytes(spec.nbytes),
        "producer kernel": plan.group_of(producer).name, "consumer kernel": plan.group_of(consumer).name,
    }


def describe_edit(edit: Edit) -> str:
    a = edit.arg
    if edit.kind in ("set_edge", "merge") and "producer" in a:
        conn = f" = {a['conn']}" if a.get("conn") else ""
        return f"{edit.kind} {a['producer']} → {a['consumer']}{conn}"
    if edit.kind == "split" and "producer" in a:
        return f"split at {a['producer']} → {a['consumer']}"
    if edit.kind == "set_tile":
        shape = fmt_shape(tuple(a.get("shape", ()))) if a.get("shape") else "—"
        step = f", k step {fmt_shape(tuple(a['reduce_step']))}" if a.get("reduce_step") else ""
        step += f", threads {fmt_shape(tuple(a['thread_shape']))} (ty x tx)" if a.get("thread_shape") else ""
        return f"set_tile {a.get('stage', a.get('group_stage'))}: tile {shape}, {a.get('threads')} threads{step}"
    return f"{edit.kind} " + ", ".join(f"{k}={v}" for k, v in edit.args)


def decision_rows(plan: Plan) -> list[dict]:
    """The plan's decision log, in order: operator batching first (why contractions were or were not
    merged), then the policy's per-edge and per-group decisions with their reasons."""
    rows = []
    for k, text in enumerate(plan.decisions):
        kind, sep, rest = text.partition(": ")
        batching = kind == "batching" and bool(sep)
        rows.append({"#": k + 1, "kind": "batching" if batching else "schedule",
                     "decision": rest if batching else text})
    return rows


def verdict_text(max_rel_err: float, tolerance: float) -> tuple[bool, str]:
    ok = max_rel_err <= tolerance
    if ok:
        return True, f"match the reference executor: matches reference, max rel err {max_rel_err:.2e} (tolerance {tolerance:.0e})"
    return False, f"do NOT match the reference executor: max rel err {max_rel_err:.2e} > tolerance {tolerance:.0e}"
