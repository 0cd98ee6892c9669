"""Planning cost per policy, for comparing two trees: models and devices in; per model, device and policy
the CPU seconds of `plan_model` (`time.process_time`, one process per model and device, policies in turn
on the same memo tables) and the kernel-IR builds the cost model made (calls of `cost._segment_use`)
printed with the plan's modeled µs and DRAM bytes (planned cold: TILEWEAVE_SCHEDULE_CACHE=off in every process), and with --out each plan's JSON without schedule_seconds written there (diff two trees' folders
to see whether plans changed).

    PYTHONPATH=TREE .venv/bin/python benchmarks/plan_cpu.py samples/zoo/bert.onnx a100 --out /tmp/plans

MODEL is a path, a comma list of paths, or `zoo` / `samples` (every model of samples/zoo/ or samples/);
DEVICE a comma list. With --against OTHER_TREE each (model, device) is planned by the other tree and then
by this one, one after the other in fresh processes (same load), and a table of both trees' CPU seconds,
builds and old/new ratios per policy is printed, then the sums, then each plan's modeled µs and modeled DRAM
bytes (`Plan.modeled_us`, `Plan.dram_bytes`) old → new and the worst new/old ratio of either; --out DIR then holds DIR/old/MODEL and
DIR/new/MODEL and every plan is compared (`plans identical` or the differing files)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("unfused", "elementwise", "stitch", "welder")
SETS = {"zoo": ROOT / "samples" / "zoo", "samples": ROOT / "samples"}


def models_of(spec: str) -> list[Path]:
    out: list[Path] = []
    for part in spec.split(","):
        out += sorted(SETS[part].glob("*.onnx")) if part in SETS else [Path(part)]
    return out


def plan_one(model: Path, device_name: str, policies: list[str], out: Path | None) -> list[str]:
    """Plan `model` on `device_name` under each policy in this process; one printed line per policy."""
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule import cost
    from engine.schedule.pipeline import plan_model
    from engine.schedule.plan import plan_to_json

    graph, device = load_graph(model), get_device(device_name)
    builds = [0]
    build = cost._segment_use

    def counted(*a, **k):
        builds[0] += 1
        return build(*a, **k)

    cost._segment_use = counted  # counts the builds; the function itself runs unchanged
    lines = []
    for policy in policies:
        before, t0 = builds[0], time.process_time()
        _, plan = plan_model(graph, policy, device)
        seconds = time.process_time() - t0
        lines.append(f"{model.stem} {device_name} {policy} cpu {seconds:.2f} builds {builds[0] - before} "
                     f"modeled_us {plan.modeled_us:.6g} dram_bytes {plan.dram_bytes}")
        print(lines[-1], flush=True)
        if out:
            data = plan_to_json(plan)
            data.pop("schedule_seconds", None)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{model.stem}.{device_name}.{policy}.json").write_text(json.dumps(data, sort_keys=True, indent=1))
    cost._segment_use = build
    return lines


def run_tree(tree: Path, model: Path, device: str, policies: list[str], out: Path | None) -> dict:
    """This script, importing the engine of `tree`, on one model and device in a fresh process:
    {policy: (cpu s, builds, modeled µs, modeled DRAM bytes)}."""
    cmd = [sys.executable, str(Path(__file__).resolve()), str(model.resolve()), device,
           "--policies", ",".join(policies)] + (["--out", str(out)] if out else [])
    env = {**os.environ, "PYTHONPATH": str(tree), "TILEWEAVE_SCHEDULE_CACHE": "off"}  # cold planning
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: {tree} on {model.name} {device}: {done.stderr.strip().splitlines()[-1:]}")
    got = {}
    for line in done.stdout.splitlines():
        f = line.split()
        if len(f) >= 11 and f[3] == "cpu":
            got[f[2]] = (float(f[4]), int(f[6]), float(f[8]), int(f[10]))
    return got


def compare(args, models: list[Path], devices: list[str], policies: list[str]) -> None:
    other = Path(args.against).resolve()
    outs = (args.out / "old", args.out / "new") if args.out else (None, None)
    sums: dict[tuple[str, str], list[float]] = {}
    quality: list[str] = []  # per model, device and policy: modeled µs and DRAM old → new
    worst = [0.0, ""]
    print("| model | device | " + " | ".join(f"{p} CPU s old → new (old/new), builds" for p in policies) + " |")
    print("|---|---|" + "---|" * len(policies))
    for model in models:
        for device in devices:
            # One folder per model: samples/lstm.onnx and samples/zoo/lstm.onnx write the same file names.
            sub = model.resolve().relative_to(ROOT).with_suffix("").as_posix().replace("/", "_") \
                if model.resolve().is_relative_to(ROOT) else model.stem
            old = run_tree(other, model, device, policies, outs[0] / sub if args.out else None)
            new = run_tree(ROOT, model, device, policies, outs[1] / sub if args.out else None)
            cells = []
            shown = model.resolve().relative_to(SETS["samples"]).with_suffix("").as_posix() \
                if model.resolve().is_relative_to(SETS["samples"]) else model.stem  # zoo/lstm vs lstm
            for p in policies:
                (a, ba, ua, da), (b, bb, ub, db) = old[p], new[p]
                s = sums.setdefault((device, p), [0.0, 0.0])
                s[0], s[1] = s[0] + a, s[1] + b
                cells.append(f"{a:.2f} → {b:.2f} ({a / max(b, 1e-9):.2f}×), {ba:,} → {bb:,}")
                ratios = [ub / max(ua, 1e-12)] + ([db / max(da, 1)] if da or db else [])
                if max(ratios) > worst[0]:
                    worst[:] = [max(ratios), f"{shown} {device} {p}"]
                quality.append(f"| {shown} | {device} | {p} | {ua:.1f} → {ub:.1f} ({ratios[0]:.4f}) | "
                               + (f"{da / 1e6:.3f} → {db / 1e6:.3f} ({ratios[1]:.4f})" if len(ratios) > 1 else "—")
                               + " |")
            print(f"| {shown} | {device} | " + " | ".join(cells) + " |", flush=True)
    for (device, p), (a, b) in sorted(sums.items()):
        print(f"sum {device} {p}: {a:.2f} → {b:.2f} s ({a / max(b, 1e-9):.2f}×)")
    print("\n| model | device | policy | modeled µs old → new (new/old) | modeled DRAM MB old → new (new/old) |")
    print("|---|---|---|---|---|")
    print("\n".join(quality))
    print(f"worst new/old of modeled µs and DRAM: {worst[0]:.4f} ({worst[1]})")
    if args.out:
        names = sorted({f.relative_to(o).as_posix() for o in outs for f in o.glob("*/*.json")})
        differ = [n for n in names if not (outs[0] / n).exists() or not (outs[1] / n).exists()
                  or (outs[0] / n).read_bytes() != (outs[1] / n).read_bytes()]
        print(f"plans identical: {len(names)} of {len(names)}" if not differ else
              f"plans differ: {len(differ)} of {len(names)}: {', '.join(differ)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", help="an .onnx path, a comma list of them, or zoo / samples")
    parser.add_argument("device", help="a device, or a comma list of them")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--out", type=Path, help="folder for the plans' JSON (NAME.DEVICE.POLICY.json)")
    parser.add_argument("--against", help="another tree (a checkout of this repository) to compare with")
    args = parser.parse_args()
    policies = args.policies.split(",")
    models = models_of(args.model)
    missing = [str(m) for m in models if not m.exists()]
    if missing or not models:
        print(f"error: no such model: {', '.join(missing) or args.model}", file=sys.stderr)
        sys.exit(2)
    if args.against:
        compare(args, models, args.device.split(","), policies)
        return
    from engine.errors import TileweaveError

    for model in models:
        for device in args.device.split(","):
            try:
                plan_one(model, device, policies, args.out)
            except (TileweaveError, OSError) as err:
                print(f"error: {err}", file=sys.stderr)
                sys.exit(2)


if __name__ == "__main__":
    main()
