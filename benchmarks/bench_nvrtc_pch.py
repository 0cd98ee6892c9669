"""NVRTC's automatic precompiled headers in the process's own folder under the cache (`nvrtc.pch_options`,
`--pch-dir`) against NVRTC's default /tmp folder, and against no precompiled headers: the same CUDA programs
compiled cold (no compile cache) in fresh processes, variants alternating round by round.

    .venv/bin/python benchmarks/bench_nvrtc_pch.py [--rounds 3] [--models bert,resnet] [--policies stitch,welder]

Prints seconds per round per variant and the medians' ratios to `own folder`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {"own folder": "", "NVRTC default (/tmp)": "nvrtc.pch_options = lambda: nvrtc.SPEED_OPTIONS\n",
            "no PCH": "nvrtc.SPEED_OPTIONS = ()\n"}
WORKER = """
import pickle, sys, time
from engine.codegen import nvrtc
{patch}
sources = pickle.load(open(sys.argv[1], "rb"))
t = time.perf_counter()
for source, name in sources:
    nvrtc.compile_cuda(source, name=name, arch="sm_90", use_cache=False)
print(time.perf_counter() - t)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default="bert,resnet")
    p.add_argument("--policies", default="stitch,welder")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    import pickle

    from engine.codegen.generate import generate
    from engine.codegen.targets import render_cuda
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    device, sources = get_device("h200"), []
    for m in args.models.split(","):
        graph = load_graph(ROOT / "samples" / "zoo" / f"{m}.onnx")
        for policy in args.policies.split(","):
            planned, plan = plan_model(graph, policy, device)
            program = generate(plan, planned, device, target="cuda")
            sources.append((render_cuda(program), program.name))
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "sources.pkl"
        src.write_bytes(pickle.dumps(sources))
        for _ in range(args.rounds):
            for name, patch in VARIANTS.items():
                out = subprocess.run([sys.executable, "-c", WORKER.format(patch=patch), str(src)], cwd=ROOT,
                                     capture_output=True, text=True, check=True,
                                     env={**__import__("os").environ, "TILEWEAVE_CACHE": str(Path(tmp) / "cache")})
                times[name].append(float(out.stdout.split()[-1]))
    base = statistics.median(times["own folder"])
    print(f"{len(sources)} programs ({args.models} x {args.policies}, h200 preset, sm_90), {args.rounds} rounds\n")
    print("| variant | seconds per round | median | / own folder |\n|---|---|---:|---:|")
    for name, ts in times.items():
        print(f"| {name} | {', '.join(f'{t:.2f}' for t in ts)} | {statistics.median(ts):.2f} | "
              f"{statistics.median(ts) / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
