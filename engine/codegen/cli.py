"""`tileweave compile MODEL --policy P --device D --target {cuda,c} -o DIR`: plan (or --plan-in),
validate, generate, compile; writes sources, program.json and (cuda) PTX + CUBIN."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_compile_command(sub) -> None:
    p = sub.add_parser("compile", help="generate and compile the kernels of a model's plan",
                       description="Plan MODEL (or load --plan-in), refuse an illegal plan, generate the "
                                   "kernels and compile them: CUDA with NVRTC for the device's arch (.cu, "
                                   ".ptx, .cubin) or C with the system compiler; writes program.json.")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--shape", action="append", metavar="NAME=d0,d1,...",
                   help="bind the shape of an input with dynamic dimensions (repeatable)")
    p.add_argument("--policy", default="welder", help="unfused | elementwise | stitch | welder (default welder)")
    p.add_argument("--device", default="a100", help="device preset or file (default a100)")
    p.add_argument("--target", choices=("cuda", "c"), default="cuda")
    p.add_argument("--plan-in", help="use this saved plan JSON instead of running the policy")
    p.add_argument("--no-batching", action="store_true",
                   help="welder: keep Q/K/V-style contractions separate (no operator batching)")
    p.add_argument("-o", "--out", required=True, help="output folder")
    p.set_defaults(func=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    from engine.codegen.api import compile_program, write_compiled
    from engine.codegen.generate import generate
    from engine.commands import parse_shapes
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.runtime.execute import check_plan
    from engine.schedule.pipeline import load_plan, plan_model

    device = get_device(args.device)
    graph = load_graph(args.model, parse_shapes(args.shape))
    if args.plan_in:
        graph, plan = load_plan(args.plan_in, graph)
    else:
        graph, plan = plan_model(graph, args.policy, device, batching=False if args.no_batching else None)
    check_plan(plan, graph, device.name)
    program = generate(plan, graph, device)
    compiled = compile_program(program, args.target, arch=device.nvrtc_arch)
    paths = write_compiled(program, compiled, Path(args.out))
    print(f"{len(program.kernels)} kernels ({args.target}{' ' + compiled.arch if compiled.arch else ''}), "
          f"arena {program.memory.arena_bytes} B (naive {program.memory.naive_bytes} B) -> "
          + ", ".join(p.name for p in paths))
    return 0
