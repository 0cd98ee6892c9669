"""`tileweave compile MODEL --policy P --device D --target {cuda,c,opencl} -o DIR`: plan (or --plan-in),
validate, generate, compile; writes the sources, per-kernel PTX + CUBIN (cuda) and program.json."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from engine.errors import CompileError, TileweaveError

_DESCRIPTION = """\
Plan MODEL (or load --plan-in), refuse an illegal plan, generate the kernels and compile them.
--target cuda writes into DIR: NAME.cu (every kernel, for reading); per kernel KERNEL.cu (its own
translation unit: prelude, helpers, kernel) and, per arch, KERNEL.ARCH.ptx and KERNEL.ARCH.cubin
(NVRTC; --arch, default the device's arch); program.json. --target c writes NAME.c (compiled with
the system C compiler to check it, built for this host's CPU; convolution blocks coarsened along
output channels, so its grids can be smaller than CUDA's) and program.json. --target opencl writes
NAME.cl (the CUDA program's kernels printed as OpenCL C 1.2, a kernel's grid-barrier segments as kernels
of their own, built for the first OpenCL device to check it; needs pyopencl) and program.json.
program.json holds the
launch list (kernel, source, per-arch ptx/cubin files with sha256, grid, block, shared bytes,
cooperative, args; a cooperative grid is one wave of the device at the registers the first --arch's
CUBIN uses, re-capped on a GPU by the driver's occupancy), per kernel and arch the compiled registers,
local and static shared bytes, the buffers with their arena offsets, and the arena peak beside the
naive sum; for --target c also each kernel's C-target choices (engine/codegen/ctarget.py: c_lanes, the
GEMM and conv register blocking, per segment the OpenMP split and the row and line caches)."""


def add_compile_command(sub) -> None:
    from engine.commands import add_plan_args, add_time_limit_arg

    p = sub.add_parser("compile", help="generate and compile a plan's kernels: sources, per-kernel PTX/CUBIN, "
                                       "program.json", description=_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(p)
    p.add_argument("--target", default="cuda", metavar="{cuda,c,opencl}",
                   help="cuda: NVRTC, per-kernel .ptx/.cubin; c: OpenMP C through the system compiler; "
                        "opencl: OpenCL C built for the first OpenCL device (default cuda)")
    p.add_argument("--arch", action="append", metavar="sm_XX",
                   help="cuda: NVRTC architecture, repeatable (default: the device's, e.g. sm_80 for a100)")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="output folder (created)")
    add_time_limit_arg(p, "the compile (NVRTC for every kernel and arch, or the C compiler; not the OpenCL build)")
    p.set_defaults(func=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    from engine.codegen.api import COMPILE_TARGETS, at_compiled, compile_program, fit_launches, write_compiled
    from engine.codegen.generate import generate
    from engine.commands import planned_model
    from engine.flags import time_limit_s
    from engine.runtime.execute import check_plan

    if args.target not in COMPILE_TARGETS:
        raise CompileError(f"unknown target '{args.target}'", hint=f"use one of {', '.join(COMPILE_TARGETS)}")
    if args.arch and args.target != "cuda":
        raise CompileError("--arch applies to --target cuda only")
    time_limit = time_limit_s(args.time_limit)
    out = check_out_dir(args.out)
    if args.arch:
        from engine.codegen.nvrtc import check_arch

        for arch in args.arch:
            check_arch(arch)
    device, graph, plan = planned_model(args)
    check_plan(plan, graph, device.name)
    program = generate(plan, graph, device, target="cuda" if args.target == "opencl" else args.target)
    archs = tuple(dict.fromkeys(args.arch or (device.nvrtc_arch,)))
    compiled = compile_program(program, args.target, archs=archs, time_limit=time_limit)
    program = fit_launches(program, compiled, device)  # cooperative grids at the compiled registers
    paths = write_compiled(program, compiled, out)
    what = f"{args.target} {', '.join(compiled.archs)}" if compiled.archs else args.target
    print(f"{len(program.kernels)} kernels ({what}), arena {program.memory.arena_bytes} B "
          f"(naive {program.memory.naive_bytes} B) -> {out}/")
    recosted = at_compiled(plan, graph, device, compiled)
    if recosted is not plan:
        print(f"modeled {recosted.modeled_us:.1f} us on {device.name} at the registers compiled for "
              f"{device.nvrtc_arch} (formula: {plan.modeled_us:.1f} us)")
    names = [p.name for p in paths]
    for k in compiled.kernels:  # one line per kernel: its unit, then its binaries
        mine = [n for n in names if n.startswith(k.name + ".")]
        print("  " + "  ".join(mine))
        names = [n for n in names if n not in mine]
    print("  " + "  ".join(names))
    return 0


def check_out_dir(path: str) -> Path:
    """Fail before planning when DIR cannot be created or written."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise TileweaveError(f"cannot write into '{path}': it is a file", hint="give a folder for -o")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise TileweaveError(f"cannot create '{path}': '{existing}' is a file", hint="give a folder for -o")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TileweaveError(f"cannot write into '{path}': permission denied on '{existing}'",
                             hint="choose another -o folder")
    return out
