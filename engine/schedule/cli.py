"""`tileweave plan MODEL --policy P --device D`: schedule a model and print the groups (table or JSON);
--plan-out saves the plan, --plan-in replays a saved plan's edits on its base policy and validates;
--explain adds every edge's connection and reason; --recompute-bound sets the plan's recompute bound, --tf32 its TF32 tensor-core option."""

from __future__ import annotations

import dataclasses
import json

from engine.errors import PlanError
from engine.schedule.plan import Conn, Plan, plan_to_json

DEFAULT_DEVICE = "a100"


def add_plan_command(sub) -> None:
    from engine.commands import add_tf32_arg, add_tune_arg

    p = sub.add_parser("plan", help="fuse and tile a model with a policy; print kernels, traffic, modeled time")
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--policy", default="welder", choices=["unfused", "elementwise", "stitch", "welder"])
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help="v100, a100, rtx3090, h100, h200, host (this CPU, measured on first use) or a .toml/.json "
                        f"file (default {DEFAULT_DEVICE})")
    p.add_argument("--json", action="store_true", help="print a JSON summary instead of the table")
    p.add_argument("--plan-out", metavar="FILE", help="write the plan JSON here")
    p.add_argument("--plan-in", metavar="FILE", help="replay this saved plan's edits on its base policy")
    p.add_argument("--shape", action="append", metavar="NAME=d0,d1,...", help="bind a dynamic input shape")
    p.add_argument("--no-batching", action="store_true",
                   help="welder: keep Q/K/V-style contractions separate (no operator batching)")
    p.add_argument("--recompute-bound", type=float, metavar="X",
                   help="how many times over a fused segment may compute its stages (inlined uses, tile "
                        "overlaps), a plan option (default 2); a reduction is always computed once per element")
    add_tf32_arg(p)
    add_tune_arg(p)
    p.add_argument("--explain", action="store_true",
                   help="also print every edge's connection and why (the levels refused and the rule broken)")
    p.set_defaults(func=run_plan_command)


def run_plan_command(args) -> int:
    from engine.commands import parse_shapes
    from engine.device import get_device
    from engine.files import check_output, write_output
    from engine.frontend.importer import load_graph
    from engine.schedule.edits import replay
    from engine.schedule.pipeline import BATCHING_PREFIX, load_plan, plan_model
    from engine.schedule.validate import validate

    device = get_device(args.device)
    options = {}
    if args.recompute_bound is not None:
        if not args.recompute_bound >= 1:
            raise PlanError(f"--recompute-bound {args.recompute_bound}: must be at least 1 (1 = nothing computed "
                            "twice)", hint="use e.g. --recompute-bound 2")
        options["recompute_bound"] = args.recompute_bound
    if args.tf32:
        options["tf32"] = True
    if args.plan_out:
        check_output(args.plan_out, "--plan-out", inputs=(args.model, args.plan_in), kind="json")
    graph = load_graph(args.model, parse_shapes(args.shape))
    if args.plan_in:
        if args.tune is not None:
            raise PlanError("--tune applies when planning; --plan-in replays a saved plan", hint="drop one of them")
        graph, saved = load_plan(args.plan_in, graph)
        plan = replay(saved.base_policy or saved.policy, saved.edits, graph, device, options=dict(saved.options))
        kept = tuple(d for d in saved.decisions if d.startswith(BATCHING_PREFIX))
        plan = dataclasses.replace(plan, decisions=kept + plan.decisions)
    else:
        graph, plan = plan_model(graph, args.policy, device, batching=False if args.no_batching else None,
                                 options=options, tune=args.tune)
    bad = validate(plan, graph, device)
    if bad:
        raise PlanError(f"plan is illegal: {bad[0]}")
    if args.plan_out:
        write_output(args.plan_out, json.dumps(plan_to_json(plan), indent=1, sort_keys=True), "--plan-out")
    summary = plan_summary(plan, graph)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(format_table(summary))
        if args.explain:
            print(format_explain(plan))
    return 0


def format_explain(plan: Plan) -> str:
    """Every edge of the plan with its connection and the reason it got it (refused levels and the rule
    each broke included), grouped by kernel; then the kernels' recompute factors (kernel IR counts)."""
    of = {s: g.name for g in plan.groups for s in g.stages}
    lines = ["", "edges (producer -> consumer: connection, why):"]
    for e in plan.edges:
        where = of.get(e.consumer, "?") if e.conn != Conn.KERNEL else f"{of.get(e.producer, '?')} | {of.get(e.consumer, '?')}"
        lines.append(f"  [{where}] {e.producer} -> {e.consumer}: {e.conn.value} — {e.reason}")
    lines.append("")
    lines.append("recompute (counted flops of the printed kernel over its stages' flops computed once, "
                 f"bound {dict(plan.options).get('recompute_bound', 2.0):g}x per fused segment):")
    for g in plan.groups:
        if g.cost is not None:
            lines.append(f"  {g.name}: {g.cost.recompute_factor:.2f}x")
    return "\n".join(lines)


def plan_summary(plan: Plan, graph) -> dict:
    """The JSON the CLI prints: totals, the operator-batching decisions, one entry per group."""
    from engine.schedule.pipeline import batching_decisions

    groups = []
    for g in plan.groups:
        members = set(g.stages)
        edges = [{"producer": e.producer, "consumer": e.consumer, "connection": e.conn.value, "reason": e.reason}
                 for e in plan.edges if e.producer in members and e.consumer in members]
        t = g.segments[-1]
        c = g.cost
        groups.append({
            "name": g.name, "stages": list(g.stages), "edges": edges,
            "tile": list(t.shape), "threads": g.threads, "blocks": g.blocks,
            "segments": [{"anchor": s.stage, "tile": list(s.shape), "threads": s.threads, "blocks": s.blocks,
                          "rows_per_block": s.rows_per_block, "threads_per_row": s.threads_per_row,
                          "row_split": s.row_split, "thread_shape": list(s.thread_shape)} for s in g.segments],
            "waves": c.waves if c else None,
            "traffic_bytes": c.traffic_bytes if c else None, "modeled_us": c.modeled_us if c else None,
            "terms_us": c.terms_us if c else None, "measured_us": g.measured_us, "reason": g.reason,
            "flops": c.flops if c else None, "recompute_factor": c.recompute_factor if c else None,
            "memory_intensive": all(graph.stage(s).is_memory_intensive for s in g.stages),
        })
    return {
        "model": plan.model_name, "policy": plan.policy, "device": plan.device, "kernels": plan.kernels,
        "memory_intensive_kernels": sum(1 for g in groups if g["memory_intensive"]),
        "dram_bytes": plan.dram_bytes, "modeled_us": round(plan.modeled_us, 3),
        "measured_us": None if plan.measured_us is None else round(plan.measured_us, 3),
        "tune": dict(plan.options).get("tune"),
        "schedule_seconds": plan.schedule_seconds,
        "fused_edges": sum(1 for e in plan.edges if e.conn != Conn.KERNEL), "edges": len(plan.edges),
        "batching": list(batching_decisions(plan)),
        "groups": groups,
    }


def format_table(summary: dict) -> str:
    tuned = summary.get("measured_us") is not None
    rows = [("kernel", "stages", "levels", "tile", "thr", "blocks", "waves", "traffic", "us")
            + (("measured us",) if tuned else ()) + ("reason",)]
    for g in summary["groups"]:
        levels: dict[str, int] = {}
        for e in g["edges"]:
            levels[e["connection"][0].upper()] = levels.get(e["connection"][0].upper(), 0) + 1
        traffic = g["traffic_bytes"] or {}
        rows.append((g["name"], str(len(g["stages"])), " ".join(f"{k}{v}" for k, v in sorted(levels.items())) or "-",
                     "x".join(map(str, g["tile"])), str(g["threads"]), str(g["blocks"]), str(g["waves"]),
                     _mb(traffic.get("dram", 0) + traffic.get("l2", 0)), f"{g['modeled_us']:.1f}")
                    + ((f"{g['measured_us']:.1f}",) if tuned else ()) + (g["reason"][:60],))
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.append(f"{summary['kernels']} kernels ({summary['memory_intensive_kernels']} memory-intensive), "
                 f"DRAM {_mb(summary['dram_bytes'])}, modeled {summary['modeled_us']:.1f} us, "
                 + (f"measured {summary['measured_us']:.1f} us (--tune {summary['tune']}), " if tuned else "") +
                 f"scheduled in {summary['schedule_seconds']:.2f} s  [{summary['policy']} on {summary['device']}]")
    lines += [f"batching: {d}" for d in summary.get("batching", ())]
    return "\n".join(lines)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}MB"
