"""`tileweave info` and `tileweave run`: model summary (text or JSON) and execution of a model on a
backend with inputs from an .npz file or the fixed-seed generator, outputs written to an .npz file."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from engine.errors import BackendError, ShapeError, TileweaveError
from engine.files import check_output, write_output
from engine.ir.graph import PrimGraph, StageKind, TensorSpec

BACKENDS = ("reference", "cpu", "cuda", "cuda-sim", "opencl")
DEFAULT_POLICY = "welder"
DEFAULT_DEVICE = "a100"


# ---- shared argument handling ---------------------------------------------------------------


def parse_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """`["x=1,128", "mask=1,1,1,128"]` -> {"x": (1, 128), ...}; `NAME=` binds a scalar."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items or ():
        name, eq, dims = item.rpartition("=")
        if not eq or not name:
            raise ShapeError(f"--shape '{item}' is malformed", hint="write --shape NAME=d0,d1,... e.g. x=1,128")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise ShapeError(f"--shape '{item}': dimensions must be integers",
                             hint="write --shape NAME=d0,d1,... e.g. x=1,128") from None
        if any(d <= 0 for d in shape):
            raise ShapeError(f"--shape '{item}': dimensions must be positive")
        if name in shapes:
            raise ShapeError(f"--shape binds '{name}' twice")
        shapes[name] = shape
    return shapes


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--shape", action="append", metavar="NAME=d0,d1,...",
                   help="bind the shape of an input with dynamic dimensions (repeatable)")


def add_models_args(p: argparse.ArgumentParser, nargs: str = "+") -> None:
    """MODEL... and --shape bound in every MODEL: what the many-model commands take (bench, tune)."""
    p.add_argument("models", nargs=nargs, metavar="MODEL", help="paths to .onnx files")
    p.add_argument("--shape", action="append", metavar="NAME=d0,d1,...",
                   help="bind the shape of an input with dynamic dimensions, in every MODEL where it has them "
                        "(repeatable); dimensions left unbound take the shapes of the arrays in the model's "
                        ".io.npz beside it, where it has one")


def add_plan_args(p: argparse.ArgumentParser, policy_help: str = "fusion policy") -> None:
    """MODEL, --shape, --policy, --device, --plan-in (alias --plan) and --no-batching: what every
    command that plans a model takes (compile, run, rprogram, export)."""
    _add_model_args(p)
    p.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"{policy_help}: unfused | elementwise | stitch | welder (default {DEFAULT_POLICY})")
    p.add_argument("--device", default=None,
                   help="device preset (v100, a100, rtx3090, h100, h200), host (this CPU, measured on first use) "
                        f"or a .toml/.json file (default: a --plan-in plan's own; else host for --backend cpu, the "
                        f"attached GPU's preset for --backend cuda, else {DEFAULT_DEVICE})")
    p.add_argument("--plan-in", "--plan", dest="plan_in", metavar="PLAN.json",
                   help="use this saved plan instead of planning with --policy")
    p.add_argument("--no-batching", action="store_true",
                   help="welder: keep Q/K/V-style contractions separate (no operator batching)")
    add_tf32_arg(p)
    add_tune_arg(p)


def add_tf32_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tf32", action="store_true",
                   help="let fp32 matrix products run on TF32 tensor cores (mma.sync m16n8k8) where the device has them "
                        "(a100, rtx3090, h100, h200): operands rounded to 10 mantissa bits, about 1e-3 relative "
                        "error; a plan option (default off: fp32 FMA, exact fp32)")


def plan_options(args: argparse.Namespace) -> dict:
    """The plan options the command line sets (--tf32); a saved plan keeps its own."""
    return {"tf32": True} if getattr(args, "tf32", False) else {}


def add_tune_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tune", type=int, default=None, metavar="K",
                   help="measure the top K tile candidates of every kernel on the device (host: the C backend; "
                        "a GPU device needs one attached) and keep the fastest; for welder also each region's "
                        "kernels from the other policies, so the plan is never slower than theirs kernel by kernel; "
                        "on the host the tuned plan, the untuned one and those policies' plans are then timed as "
                        "whole programs and the fastest kept; measurements go to the tuning database "
                        "(TILEWEAVE_TUNE_DB), keyed by subgraph signature, device and code version")


def default_device(args: argparse.Namespace) -> str:
    """--device, else host when the command runs the C backend, the attached GPU's preset for the CUDA
    backend, else the default GPU preset (a saved plan brings its own device: `planned_model`)."""
    if args.device is not None:
        return args.device
    backend = getattr(args, "backend", None)
    if backend == "cuda":
        from engine.runtime.execute import attached_preset

        return attached_preset(DEFAULT_DEVICE)
    return "host" if backend == "cpu" else DEFAULT_DEVICE


def add_time_limit_arg(p: argparse.ArgumentParser, what: str) -> None:
    """--time-limit SECONDS (default TILEWEAVE_TIME_LIMIT): what `compile` and `run` are bounded by."""
    p.add_argument("--time-limit", dest="time_limit", metavar="SECONDS", default=None,
                   help=f"stop {what} when it takes longer than SECONDS, with a one-line error, exit 2 "
                        "(default: TILEWEAVE_TIME_LIMIT, else none, the C compiler's own 600 s aside)")


def planned_model(args: argparse.Namespace):
    """(device, graph, plan) for `add_plan_args` arguments: the saved plan (re-applying its operator
    batching) or the policy's plan; graph is the one the plan was made on."""
    from engine.device import get_device, named_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import load_plan, plan_model

    graph = load_graph(args.model, getattr(args, "bound_shapes", None) or parse_shapes(args.shape))
    if args.plan_in:
        given = [flag for flag, on in (("--tune", args.tune is not None), ("--tf32", getattr(args, "tf32", False))) if on]
        if given:
            flags = " and ".join(given)
            raise TileweaveError(f"{flags} {'applies' if len(given) == 1 else 'apply'} when planning; a saved plan "
                                 "(--plan-in) runs as it is", hint=f"drop {'/'.join(given)} or --plan-in")
        graph, plan = load_plan(args.plan_in, graph)
        if args.device is None:  # the device the plan was made for, when it names one
            args.device = named_device(plan.device, default_device(args))
        return get_device(args.device), graph, plan
    args.device = default_device(args)
    device = get_device(args.device)
    graph, plan = plan_model(graph, args.policy, device, batching=False if args.no_batching else None,
                             options=plan_options(args), tune=args.tune)
    return device, graph, plan


# ---- info -----------------------------------------------------------------------------------


def add_info_command(sub) -> None:
    p = sub.add_parser("info", help="summarize a model: ops, stages, tensors, bytes, flops",
                       description="Import and lower MODEL; print its ONNX ops, primitive stages, tensors, "
                                   "parameter bytes, FLOPs and the minimum DRAM traffic.")
    _add_model_args(p)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    from engine.frontend.importer import import_onnx, lower

    graph = import_onnx(args.model, parse_shapes(args.shape))
    info = model_info(graph.onnx_ops, lower(graph), opset=graph.opset)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(format_info(info))
    return 0


def _tensor(t: TensorSpec, name: str | None = None) -> dict:
    return {"name": name or t.name, "shape": list(t.shape), "dtype": t.dtype.value, "bytes": t.nbytes}


def model_info(onnx_ops: dict[str, int], pg: PrimGraph, *, opset: int | None = None) -> dict:
    """The summary `tileweave info` prints, as a JSON-ready dict."""
    kinds = Counter(s.kind.value for s in pg.stages)
    outputs = set(pg.outputs)
    return {
        "name": pg.name,
        "opset": opset,
        "model_hash": pg.structural_hash,
        "onnx_ops": dict(sorted(onnx_ops.items())),
        "stages": {k.value: kinds.get(k.value, 0) for k in StageKind},
        "stage_count": len(pg.stages),
        "inputs": [_tensor(t) for t in pg.inputs],
        "outputs": [_tensor(pg.specs[t], name) for name, t in zip(pg.output_names, pg.outputs)],
        "constants": [_tensor(t) for t in pg.constants],
        "intermediates": [_tensor(s.spec) for s in pg.stages if s.name not in outputs],
        "param_bytes": pg.param_bytes,
        "flops": pg.flops,
        "min_dram_bytes": pg.min_dram_bytes,
    }


def format_info(info: dict) -> str:
    """Compact human-readable table of `model_info`."""
    lines = [f"model   {info['name']}  (opset {info['opset']}, hash {info['model_hash']})"]
    ops = ", ".join(f"{op} {n}" for op, n in sorted(info["onnx_ops"].items(), key=lambda kv: (-kv[1], kv[0])))
    lines.append(f"onnx    {sum(info['onnx_ops'].values())} nodes: {ops}")
    kinds = ", ".join(f"{k} {n}" for k, n in info["stages"].items() if n)
    lines.append(f"stages  {info['stage_count']}: {kinds}")
    lines.append("")
    rows = [("role", "name", "shape", "dtype", "bytes")]
    for role in ("inputs", "outputs"):
        rows += [(role[:-1], t["name"], _shape(t["shape"]), t["dtype"], _bytes(t["bytes"])) for t in info[role]]
    for role in ("constants", "intermediates"):
        items = info[role]
        total = sum(t["bytes"] for t in items)
        rows.append((role[:-1] + "s", f"({len(items)} tensors)", "", "", _bytes(total)))
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if k < 4 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths))))
    lines.append("")
    lines.append(f"params          {_bytes(info['param_bytes'])}")
    lines.append(f"flops           {info['flops']:,}")
    lines.append(f"min DRAM bytes  {_bytes(info['min_dram_bytes'])}  (inputs + weights + outputs once)")
    return "\n".join(lines)


def _shape(shape: list[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# ---- device ---------------------------------------------------------------------------------


def add_device_command(sub) -> None:
    p = sub.add_parser("device", help="show a device's figures and where each came from",
                       description="Print every figure the cost model uses for DEVICE (default host) with its "
                                   "source: datasheet, estimate, file, detected (read off this machine) or "
                                   "measured (timed on it). host is probed on first use (a few seconds) and "
                                   "cached per CPU, OpenMP thread count (OMP_NUM_THREADS) and C compiler.")
    p.add_argument("device", nargs="?", default="host",
                   help="host, a preset (v100, a100, rtx3090, h100, h200) or a .toml/.json file (default host)")
    p.add_argument("--refresh", action="store_true", help="host: probe again and replace the cached figures")
    p.add_argument("--json", action="store_true", help="print the device as JSON (what a device file holds)")
    p.set_defaults(func=cmd_device)


def cmd_device(args: argparse.Namespace) -> int:
    from engine.device import get_device

    if args.refresh and args.device.strip().lower() != "host":
        raise TileweaveError("--refresh probes the host again; other devices are not measured here",
                             hint="tileweave device host --refresh")
    if args.refresh:
        from engine.host import host_device

        device = host_device(refresh=True)
    else:
        device = get_device(args.device)
    if args.json:
        print(device.to_json())
        return 0
    print(f"{device.name}: {device.description or device.kind}")
    for key, value in sorted(device.to_dict().items()):
        if key in ("name", "source", "description"):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        print(f"  {key:32s} {shown:>14s}  {device.source_of(key)}")
    if device.name == "host":
        from engine.host import cache_path

        print(f"cached in {cache_path()}")
    return 0


def add_cache_command(sub) -> None:
    p = sub.add_parser("cache", help="show what the cache folder holds; trim or clear its compiled parts",
                       description="Print the cache folder (TILEWEAVE_CACHE, default ~/.cache/tileweave) part by "
                                   "part: files, size, what each holds. The compile caches (cc, nvrtc) grow with "
                                   "every program compiled; --prune trims them to a size, least recently used "
                                   "first; --clear removes every part that is rebuilt on demand (cc, nvrtc, "
                                   "schedule). The measurements (host, tune) and the workbench's edits and uploads are never removed.")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--prune", metavar="SIZE",
                     help="remove the least recently used compiled programs until cc and nvrtc hold at most SIZE "
                          "(bytes, or e.g. 500M, 2GiB, 2GB: as --memory-budget)")
    how.add_argument("--clear", action="store_true", help="remove cc, nvrtc and schedule (all rebuilt on demand)")
    p.add_argument("--json", action="store_true", help="print the parts as JSON")
    p.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace) -> int:
    from engine import cache
    from engine.flags import cache_dir
    from engine.runtime.budget import format_bytes, parse_size

    limit = parse_size(args.prune, "--prune") if args.prune is not None else None
    bound = cache.max_bytes(strict=True)  # a bad value: one line here (compiles ignore it)
    root = cache_dir()
    if limit is not None:
        removed, freed = cache.prune(limit, root)
        print(f"removed {removed} entries (compiled programs, CUDA units, kernel objects), {format_bytes(freed)}, "
              "least recently used first")
    if args.clear:
        gone = cache.clear(root)
        print(f"removed {', '.join(gone) or 'nothing (already empty)'}; kept the measurements (host, tune) and the "
              "workbench's edits and uploads")
    rows = cache.usage(root)
    if args.json:
        print(json.dumps({"folder": str(root), "max_bytes": bound, "parts": rows}, indent=1))
        return 0
    print(f"cache folder {root}; " + (f"compiles trim cc and nvrtc to {format_bytes(bound)}, least recently used "
                                      "first, at most once a day (TILEWEAVE_CACHE_MAX)" if bound else
                                      "compiles never trim cc and nvrtc (TILEWEAVE_CACHE_MAX=off)"))
    for r in rows:
        kept = "rebuilt on demand" if r["rebuilt"] else "kept"
        print(f"  {r['part']:9s} {r['files']:>8d} files {format_bytes(r['bytes']):>10s}  {r['holds']} ({kept})")
    print(f"  {'total':9s} {sum(r['files'] for r in rows):>8d} files {format_bytes(sum(r['bytes'] for r in rows)):>10s}")
    return 0


# ---- run ------------------------------------------------------------------------------------


def add_run_command(sub) -> None:
    p = sub.add_parser("run", help="run a model on a backend and write its outputs to .npz",
                       description="Run MODEL. Inputs missing from --inputs are generated with a fixed "
                                   "seed (engine/runtime/inputs.py). The .npz keys are the model's "
                                   "graph input/output names.")
    add_plan_args(p, "fusion policy for cpu/cuda/cuda-sim/opencl")
    p.add_argument("--backend", default="reference", metavar="{" + ",".join(BACKENDS) + "}",
                   help="reference: NumPy over primitive stages; cpu: generated C; cuda: generated CUDA; "
                        "cuda-sim: the generated CUDA run on the CPU by the SIMT emulator, checked for "
                        "deadlocks, partial barriers/shuffles, out-of-range and never-written accesses and "
                        "races (any finding: exit 1); opencl: the CUDA program's kernels printed as OpenCL C, "
                        "run on the first OpenCL device (a GPU, else e.g. PoCL on the CPU; needs pyopencl)")
    p.add_argument("--inputs", metavar="IN.npz",
                   help="input arrays keyed by graph input name (arrays named like outputs are ignored); an "
                        "input's dynamic dimensions --shape leaves unbound take its array's shape")
    p.add_argument("--seed", type=int, default=0, help="seed for generated inputs (default 0)")
    p.add_argument("--outputs", required=True, metavar="OUT.npz", help="where to write the outputs")
    p.add_argument("--sim-grid-cap", type=int, default=None, metavar="N",
                   help="cuda-sim: run cooperative grids with at most N blocks (tile loops cover the rest; "
                        "default 16, 0: the launch's own grid)")
    p.add_argument("--sim-resident", type=int, default=1, metavar="N",
                   help="cuda-sim: blocks of an ordinary launch resident at once (default 1)")
    p.add_argument("--json", action="store_true",
                   help="cuda-sim: print the full report (every finding, bytes moved per kernel) as JSON")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="cpu, cuda, opencl: time each kernel as the median of N launches (cuda, opencl: after one warm-up) and "
                        "print it beside the plan's modeled time; cuda also times the whole launch list back "
                        "to back N times (launch overheads overlapping, as a program runs)")
    p.add_argument("--memory-budget", metavar="SIZE", default=None,
                   help="refuse the run before allocating anything when its inputs, constants, intermediates "
                        "(arena) and outputs exceed SIZE (e.g. 8GiB, 512MiB, 2GB; default: half of host RAM, "
                        "for --backend cuda the device's memory_bytes, for cuda-sim at most that)")
    add_time_limit_arg(p, "the compile, or the run (cpu, cuda, cuda-sim, reference; each gets the whole limit; "
                          "opencl: build and run together),")
    from engine.partition.cli import add_link_args

    add_link_args(p, devices_required=False)
    p.add_argument("--cluster", metavar="ADDRESS", default=None,
                   help="with --devices N > 1: the Ray cluster to run the device actors on (default: RAY_ADDRESS, "
                        "else an embedded Ray on this machine's cores)")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from engine.flags import time_limit_s
    from engine.frontend.importer import bind_from_arrays, load_graph
    from engine.runtime.budget import check_graph_memory, memory_budget
    from engine.runtime.inputs import complete_inputs

    if args.backend not in BACKENDS:
        raise BackendError(f"unknown backend '{args.backend}'", hint=f"use one of {', '.join(BACKENDS)}")
    check_sim_args(args)
    check_devices_args(args)
    check_profile_args(args)
    args.time_limit = time_limit_s(args.time_limit)
    out_path = check_output(args.outputs, "--outputs", inputs=(args.model, args.inputs, args.plan_in), kind="zip")
    args.budget = memory_budget(args.memory_budget, backend=args.backend,
                                device=default_device(args) if args.backend in ("cuda", "cuda-sim") else None)
    given = read_npz(args.inputs) if args.inputs else {}
    # Dynamic dimensions --shape leaves unbound take the --inputs arrays' shapes (planned_model's too).
    args.bound_shapes = bind_from_arrays(args.model, parse_shapes(args.shape), given)
    graph = load_graph(args.model, args.bound_shapes)
    check_graph_memory(graph, args.budget, args.backend)  # before generating inputs or running anything
    # Arrays named like graph outputs are ignored, so a samples/*.io.npz file works as --inputs.
    given = {k: v for k, v in given.items() if k not in graph.output_names or k in {s.name for s in graph.inputs}}
    inputs = complete_inputs(graph, given, seed=args.seed)
    generated = [n for n in inputs if n not in given]
    report = profiled = None
    if args.backend == "cuda-sim":
        outputs, report = run_sim(graph, inputs, args)
    elif args.devices > 1:
        outputs = run_devices(inputs, args)
    else:
        outputs, profiled = run_backend(graph, inputs, args)
    write_npz(out_path, outputs)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0 if report.ok else 1
    if generated:
        print(f"generated inputs (seed {args.seed}): {', '.join(generated)}")
    for name, arr in outputs.items():
        print(summarize_array(name, arr))
    print(f"wrote {len(outputs)} output(s) to {out_path}")
    if profiled is not None:
        for line in profile_lines(*profiled):
            print(line)
    if report is None:
        return 0
    for line in report.traffic_lines():
        print(f"cuda-sim traffic {line}")
    if report.stopped:
        print(f"cuda-sim: {report.stopped}")
    for line in report.summary_lines():
        print(line)
    if report.ok:
        print(f"cuda-sim: no findings in {report.launches} launch(es)")
    return 0 if report.ok else 1


def check_sim_args(args: argparse.Namespace) -> None:
    if args.backend != "cuda-sim" and (args.json or args.sim_grid_cap is not None or args.sim_resident != 1):
        raise TileweaveError("--json, --sim-grid-cap and --sim-resident apply to --backend cuda-sim only",
                             hint="add --backend cuda-sim or drop them")
    if args.sim_grid_cap is not None and args.sim_grid_cap < 0:
        raise TileweaveError(f"--sim-grid-cap must be 0 (no cap) or positive, got {args.sim_grid_cap}")
    if args.sim_resident < 1:
        raise TileweaveError(f"--sim-resident must be at least 1, got {args.sim_resident}")


def check_profile_args(args: argparse.Namespace) -> None:
    if args.profile < 0:
        raise TileweaveError(f"--profile must be a positive number of launches, got {args.profile}")
    if args.profile and (args.backend not in ("cpu", "cuda", "opencl") or args.devices > 1):
        raise TileweaveError(f"--profile times the kernels of --backend cpu, cuda or opencl on one device, not "
                             f"--backend {args.backend}" + (f" on {args.devices} devices" if args.devices > 1 else ""),
                             hint="drop --profile, or pick one of those backends")


def profile_lines(profile, plan) -> list[str]:
    """The measured profile beside the plan's modeled time per kernel, and the totals."""
    modeled = {g.name: g.cost.modeled_us for g in plan.groups if g.cost}
    runs = profile.kernels[0].runs if profile.kernels else 0
    width = max([len("total (each kernel timed alone)")] + [len(k.kernel) for k in profile.kernels])
    lines = [f"profile: {profile.label}, each kernel the median of {runs} launches; modeled for {plan.device}",
             f"{'kernel':<{width}}  {'measured us':>12}  {'modeled us':>11}"]
    for k in profile.kernels:
        m = modeled.get(k.kernel)
        lines.append(f"{k.kernel:<{width}}  {k.us:>12.1f}  {'' if m is None else f'{m:.1f}':>11}")
    lines.append(f"{'total (each kernel timed alone)':<{width}}  {profile.total_us:>12.1f}  {plan.modeled_us:>11.1f}")
    if profile.program_us is not None:
        lines.append(f"{'whole program, back to back':<{width}}  {profile.program_us:>12.1f}")
    return lines


def check_devices_args(args: argparse.Namespace) -> None:
    from engine.partition.links import DEFAULT_LINK
    from engine.partition.plan import check_devices

    check_devices(args.devices)
    if args.devices == 1 and (args.cluster or args.link != DEFAULT_LINK):
        raise TileweaveError("--link and --cluster apply to a partitioned run", hint="add --devices N (N > 1)")
    if args.devices > 1 and args.backend != "cpu":
        raise BackendError(f"--devices {args.devices} runs the partition's parts on Ray actors with the C "
                           f"backend only, not --backend {args.backend}", hint="use --backend cpu")
    if args.devices > 1 and args.cluster:
        from engine.partition.execute import check_reachable

        check_reachable(args.cluster)  # before planning: a wrong address is one line, fast
    if args.devices > 1 and args.time_limit is not None:
        raise TileweaveError("--time-limit does not bound a partitioned run", hint="drop --time-limit or --devices")


def run_devices(inputs: dict[str, np.ndarray], args: argparse.Namespace) -> dict:
    """Outputs of the partition of the planned model over `args.devices` Ray actors (C backend)."""
    from engine.partition.cli import partitioned_model
    from engine.partition.execute import run_partition

    device, graph, plan, part = partitioned_model(args)
    result = run_partition(graph, plan, part, inputs, device=device, cluster=args.cluster)
    print(f"partition: {part.devices} devices on Ray at {result.address}, kernels per device "
          f"{[len(s.kernels) for s in part.stages]}, tensor parallel: {', '.join(part.tensor_parallel) or 'none'}")
    print(f"transfers: {len(result.received)} measured, {result.transfer_bytes:,} B "
          f"(plan: {len(part.transfers)}, {part.transfer_bytes:,} B)")
    return result.outputs


def run_sim(graph: PrimGraph, inputs: dict[str, np.ndarray], args: argparse.Namespace):
    """(outputs, SimReport) of the cuda-sim backend for the `run` arguments."""
    import engine.api as api

    _, planned_graph, plan = planned_model(args)
    result = api.run_model(planned_graph, inputs, backend="cuda-sim", device=args.device, plan=plan,
                           sim_grid_cap=args.sim_grid_cap, sim_resident=args.sim_resident, budget=args.budget,
                           time_limit=args.time_limit)
    return dict(result.outputs), result.sim


def run_backend(graph: PrimGraph, inputs: dict[str, np.ndarray], args: argparse.Namespace) -> tuple[dict, tuple | None]:
    """(outputs keyed by ONNX output name, from the backend `args.backend`; with --profile N, (the measured
    Profile, the plan), else None)."""
    import engine.api as api

    if args.backend == "reference":
        return api.run_model(graph, inputs, backend="reference", budget=args.budget,
                             time_limit=args.time_limit).outputs, None
    if args.backend == "cuda":
        from engine.runtime.cuda_driver import require_cuda

        require_cuda()  # no GPU: say so in one line before planning and compiling anything
    _, planned_graph, plan = planned_model(args)
    result = api.run_model(planned_graph, inputs, backend=args.backend, device=args.device, plan=plan,
                           budget=args.budget, time_limit=args.time_limit, repeat=max(1, args.profile))
    return dict(result.outputs), ((result.profile, plan) if args.profile and result.profile else None)


def read_npz(path: str) -> dict[str, np.ndarray]:
    from engine.runtime.npz import read_npz_arrays

    try:
        return read_npz_arrays(path)
    except FileNotFoundError:
        raise TileweaveError(f"inputs file '{path}' does not exist", hint="check the path") from None
    except ValueError as err:
        raise TileweaveError(f"cannot read inputs file '{path}': {err}",
                             hint="write it with numpy.savez(path, name=array, ...)") from None


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """The arrays as one .npz, written whole or not at all (the previous file survives a failed write)."""
    from engine.runtime.npz import npz_bytes  # .npy 1.0 members: what every NumPy reads back

    write_output(path, npz_bytes(arrays), "--outputs")


def summarize_array(name: str, arr: np.ndarray) -> str:
    """`name  [1,128,768] float32  min -3.1 max 2.9 mean 0.0012`."""
    head = f"{name}  {_shape(list(arr.shape))} {arr.dtype}"
    if arr.size == 0:
        return f"{head}  (empty)"
    vals = arr.astype(np.float64)
    return f"{head}  min {vals.min():.6g} max {vals.max():.6g} mean {vals.mean():.6g}"


if __name__ == "__main__":  # pragma: no cover - convenience: python -m engine.commands info MODEL
    from engine.cli import main

    sys.exit(main())


# ---- bench --------------------------------------------------------------------------------------


def add_bench_command(sub) -> None:
    from engine.profile.bench import POLICIES

    p = sub.add_parser("bench", help="time our CPU backend against onnxruntime per policy",
                       description="For each MODEL and policy: plan for --device, generate C and check it against "
                                   "onnxruntime (ORT_ENABLE_ALL) in a worker process; then time onnxruntime and "
                                   "every policy of the model in the same interleaved rounds in one worker "
                                   "process, all with OMP_NUM_THREADS threads (default: every core); print medians, "
                                   "ours/onnxruntime, max relative error vs onnxruntime, kernels, modeled us "
                                   "and schedule seconds. Inputs come from MODEL's .io.npz beside it when "
                                   "there is one, else the fixed-seed generator. A cell that outlives "
                                   "--timeout is killed and reported as a timeout.")
    add_models_args(p)
    p.add_argument("--policy", action="append", dest="policies", metavar="P",
                   help=f"policy to run, optionally P+tune (repeatable; default all: {', '.join(POLICIES)})")
    p.add_argument("--device", default="host",
                   help="device the plans are made for: host (this CPU, the default), a GPU preset or a device "
                        "file; the code always runs on this CPU")
    p.add_argument("--tune", type=int, default=None, metavar="K",
                   help="plan the P+tune cells (e.g. --policy welder+tune) by measuring K tile candidates per "
                        "kernel on the device (default 3); given without any P+tune policy, every policy is tuned")
    p.add_argument("--runs", type=int, default=10, help="timed rounds; each runs onnxruntime and every policy once (default 10)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds per model and policy, planning and compiling included (default 120)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.profile.bench import bench_models, format_bench

    def progress(msg: str) -> None:
        if not args.json:
            print(f"... {msg}", file=sys.stderr, flush=True)

    result = bench_models(args.models, args.policies, device=args.device, runs=args.runs,
                          timeout=args.timeout, shapes=parse_shapes(args.shape), progress=progress, tune=args.tune)
    print(json.dumps(result, indent=1) if args.json else format_bench(result))
    return 0


# ---- app ----------------------------------------------------------------------------------------


def add_app_command(sub) -> None:
    p = sub.add_parser("app", help="start the Streamlit workbench (prints its local URL)",
                       description="Start the workbench UI on 127.0.0.1 (headless; open the printed URL).")
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument("--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.set_defaults(func=cmd_app)


def cmd_app(args) -> int:
    import subprocess

    script = Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py"
    if not script.exists():
        raise TileweaveError(f"workbench entry point {script} is missing", hint="reinstall tileweave from its repo")
    print(f"tileweave workbench: http://{args.address}:{args.port}  (Ctrl-C stops it)", flush=True)
    # --runner.postScriptGC false: as the repo's .streamlit/config.toml says, which Streamlit reads only
    # when started from the repo root (a full collection after every page run took seconds per page once
    # a session had planned several models).
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
           "--server.address", args.address, "--server.port", str(args.port), "--runner.postScriptGC", "false"]
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130
