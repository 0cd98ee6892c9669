"""`tileweave rprogram MODEL`: schedule a model's kernels as a Rammer rProgram on a device preset and
print makespan, sequential time, speedup, utilization and waves (text or JSON), optionally a Perfetto trace."""

from __future__ import annotations

import argparse
import json

DEFAULT_POLICY = "welder"
DEFAULT_DEVICE = "a100"


def add_rprogram_command(sub) -> None:
    from engine.commands import add_plan_args

    p = sub.add_parser(
        "rprogram", help="schedule kernels as an rProgram (wavefront policy) and report makespan",
        description="Plan MODEL with a policy, place every thread block (rTask) on the vEUs of a device "
                    "preset with Rammer's wavefront policy, and compare the makespan with sequential "
                    "kernel-by-kernel execution.")
    add_plan_args(p, "scheduling policy")
    p.add_argument("--no-merge", action="store_true", help="keep a grid barrier between every two waves")
    p.add_argument("--trace", metavar="OUT.json", help="write a Chrome trace-event file (opens in Perfetto)")
    p.add_argument("--out", metavar="RPROGRAM.json", help="write the rProgram itself as JSON")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_rprogram)


def cmd_rprogram(args: argparse.Namespace) -> int:
    from engine.commands import planned_model
    from engine.files import check_output, write_output
    from engine.rprogram.model import rprogram_to_json
    from engine.rprogram.trace import write_trace
    from engine.rprogram.wavefront import build_rprogram
    from engine.schedule.pipeline import batching_decisions

    inputs = (args.model, args.plan_in)
    for flag, path in (("--trace", args.trace), ("--out", args.out)):
        if path:
            check_output(path, flag, inputs, kind="json")
    device, graph, plan = planned_model(args)
    rp = build_rprogram(plan, device, graph=graph, merge=not args.no_merge)
    if args.trace:
        write_trace(rp, args.trace)
    if args.out:
        write_output(args.out, json.dumps(rprogram_to_json(rp)), "--out")
    batching = list(batching_decisions(plan))
    info = rp.summary() | {"batching": batching, "steps_detail": [{"waves": list(s.waves), "kernels": len(s.ops),
                                              "start_us": round(s.start_us, 3), "end_us": round(s.end_us, 3),
                                              "reason": s.reason} for s in rp.steps]}
    print(json.dumps(info, indent=2) if args.json else format_summary(info, rp))
    return 0


def format_summary(info: dict, rp) -> str:
    vd = rp.vdevice
    lines = [
        f"rprogram {info['model']} · {info['policy']} on {info['device']}: {info['kernels']} kernels, "
        f"{info['rtasks']} rTasks on {vd.veus} vEUs ({vd.sm_count} SMs × {vd.slots} slots, limited by "
        f"{vd.limiter})",
        f"makespan     {info['makespan_us']:10.2f} µs  (one launch + {info['steps']} step(s))",
        f"sequential   {info['sequential_us']:10.2f} µs  ({info['kernels']} kernels + a launch each)",
        f"speedup      {info['speedup']:10.2f} ×",
        f"utilization  {100 * info['utilization']:10.1f} %",
        f"waves        {info['waves']:10d}     (BFS levels, merged into {info['steps']} step(s))",
        *(f"batching     {d}" for d in info["batching"]),
    ]
    return "\n".join(lines)
