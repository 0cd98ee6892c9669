"""`tileweave compile MODEL --policy P --device D --target {cuda,c} -o DIR`: plan (or --plan-in),
validate, generate, compile; writes sources, program.json and (cuda) PTX + CUBIN."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_compile_command(sub) -> None:
    from engine.commands import add_plan_args

    p = sub.add_parser("compile", help="generate and compile the kernels of a model's plan",
                       description="Plan MODEL (or load --plan-in), refuse an illegal plan, generate the "
                                   "kernels and compile them: CUDA with NVRTC for the device's arch (.cu, "
                                   ".ptx, .cubin) or C with the system compiler; writes program.json.")
    add_plan_args(p)
    p.add_argument("--target", choices=("cuda", "c"), default="cuda")
    p.add_argument("-o", "--out", required=True, help="output folder")
    p.set_defaults(func=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    from engine.codegen.api import compile_program, write_compiled
    from engine.codegen.generate import generate
    from engine.commands import planned_model
    from engine.runtime.execute import check_plan

    device, graph, plan = planned_model(args)
    check_plan(plan, graph, device.name)
    program = generate(plan, graph, device)
    compiled = compile_program(program, args.target, arch=device.nvrtc_arch)
    paths = write_compiled(program, compiled, Path(args.out))
    print(f"{len(program.kernels)} kernels ({args.target}{' ' + compiled.arch if compiled.arch else ''}), "
          f"arena {program.memory.arena_bytes} B (naive {program.memory.naive_bytes} B) -> "
          + ", ".join(p.name for p in paths))
    return 0
