"""`tileweave export MODEL --policy P --device D -o bundle.zip`: the kernel bundle of a plan;
`--annotated-onnx OUT.onnx`: the model with each node's kernel, connections and modeled µs in its metadata."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_export_command(sub) -> None:
    from engine.commands import add_plan_args, add_time_limit_arg

    p = sub.add_parser("export", help="write a kernel bundle (CUDA + per-kernel PTX/CUBIN, C, program/plan/trace JSON)",
                       description="Plan MODEL (or load --plan-in), generate and compile its kernels with NVRTC "
                                   "for each --arch, and write a zip: sources, PTX/CUBIN per kernel, program.json, "
                                   "plan.json, trace.json, weights.npz, run_bundle.py (runs it without tileweave: "
                                   "--backend cpu or cuda) and a manifest.")
    add_plan_args(p)
    p.add_argument("--arch", action="append", help="NVRTC target, repeatable (default sm_80 and sm_90)")
    p.add_argument("--no-weights", action="store_true", help="leave weights.npz out of the bundle")
    p.add_argument("-o", "--out", help="output .zip path of the kernel bundle")
    p.add_argument("--annotated-onnx", metavar="OUT", help="also (or only) write the model as ONNX with each node's "
                   "kernel, connection levels and modeled µs in its metadata_props (Netron shows them)")
    add_time_limit_arg(p, "the NVRTC compile (all kernels and archs together; run in a worker process that is killed)")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from engine.bundle.annotate import annotate_onnx
    from engine.bundle.export import DEFAULT_ARCHS, bundle_info, export_bundle
    from engine.commands import planned_model
    from engine.errors import TileweaveError
    from engine.files import check_output, write_output
    from engine.flags import time_limit_s

    if not args.out and not args.annotated_onnx:
        raise TileweaveError("nothing to export: give -o bundle.zip, --annotated-onnx model.onnx, or both")
    time_limit = time_limit_s(args.time_limit)
    inputs = (args.model, getattr(args, "plan_in", None))
    if args.out:
        check_output(args.out, "-o", inputs, kind="zip")
    if args.annotated_onnx:
        check_output(args.annotated_onnx, "--annotated-onnx", inputs, kind="onnx")
    if args.out and args.annotated_onnx and Path(args.out).absolute() == Path(args.annotated_onnx).absolute():
        raise TileweaveError(f"-o and --annotated-onnx are the same file '{args.out}'", hint="give two paths")
    device, graph, plan = planned_model(args)
    if args.annotated_onnx:
        write_output(args.annotated_onnx, annotate_onnx(args.model, graph, plan), "--annotated-onnx")
        print(f"{args.annotated_onnx}: {Path(args.model).name} annotated with {plan.kernels} kernels of {plan.policy}")
    if not args.out:
        return 0
    out = Path(args.out)
    data = export_bundle(graph, plan, device, archs=tuple(args.arch or DEFAULT_ARCHS),
                         with_weights=not args.no_weights, time_limit=time_limit)
    write_output(out, data, "-o")
    info = bundle_info(data)
    print(f"{out}: {info.kernels} kernels for {', '.join(info.archs)}, {len(info.files)} files, "
          f"{info.nbytes / 1e6:.2f} MB")
    return 0
