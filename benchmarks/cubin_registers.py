"""Registers without a GPU: engine/codegen/cubin.py's count for every kernel of every sample (welder and
stitch, sm_80) against `ptxas -v` on the same PTX (a development check: the CUDA 13.0 toolkit's ptxas,
never needed at runtime); then, per sample, the persistent kernel's vEUs as the rProgram placed them
(estimated registers) against the grid one wave holds at its compiled registers (a100 and h100 presets).

    .venv/bin/python benchmarks/cubin_registers.py [--ptxas /usr/local/cuda/bin/ptxas]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.codegen.api import compile_program  # noqa: E402
from engine.codegen.cubin import cubin_resources  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.device import get_device  # noqa: E402
from engine.frontend.importer import load_graph  # noqa: E402
from engine.rprogram.persistent import compile_persistent_cuda, modeled_grid  # noqa: E402
from engine.rprogram.wavefront import build_rprogram, plan_for_rprogram  # noqa: E402
from engine.schedule.policies import make_plan  # noqa: E402

SAMPLES = ROOT / "samples"


def ptxas_registers(ptxas: str, ptx: str, arch: str) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run([ptxas, "-v", f"-arch={arch}", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    found, current = {}, None
    for line in out.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            current = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            found[current] = int(m.group(1))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptxas", default=shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas")
    args = parser.parse_args()
    names = [e["name"] for e in json.loads((SAMPLES / "catalog.json").read_text()) if e["name"] != "bert12"]
    checked = mismatched = 0
    print("| sample | policy | kernels | registers (min-max) | ptxas agrees |")
    print("|---|---|---:|---|---|")
    for name in names:
        graph = load_graph(SAMPLES / f"{name}.onnx")
        for policy in ("welder", "stitch"):
            program = generate(make_plan(graph, policy, "a100"), graph)
            compiled = compile_program(program, "cuda", archs=("sm_80",))
            regs, agree = [], True
            for k in compiled.kernels:
                b = k.binaries[0]
                ours = cubin_resources(b.cubin)[k.name].registers
                theirs = ptxas_registers(args.ptxas, b.ptx, "sm_80")[k.name]
                regs.append(ours)
                checked += 1
                if ours != theirs:
                    agree, mismatched = False, mismatched + 1
            print(f"| {name} | {policy} | {len(regs)} | {min(regs)}-{max(regs)} | {'yes' if agree else 'NO'} |")
    print(f"\n{checked} kernels, {mismatched} mismatches\n")
    print("| sample | vEUs placed (a100) | assumed registers | compiled registers | a100 wave | h100 wave |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        graph = load_graph(SAMPLES / f"{name}.onnx")
        row = []
        for dev in ("a100", "h100"):
            device = get_device(dev)
            plan = make_plan(graph, "welder", device)
            rp = build_rprogram(plan, device, graph=graph)
            program = generate(plan_for_rprogram(plan, rp, graph, device), graph, device)
            src, binary = compile_persistent_cuda(program, rp, arch=device.nvrtc_arch)
            grid, _ = modeled_grid(src, binary, device)
            row.append((rp, binary.resources(src.entry).registers, grid))
        (rp, regs, a100), (_, _, h100) = row
        print(f"| {name} | {rp.vdevice.veus} | {rp.vdevice.regs_per_thread} | {regs} | {a100} | {h100} |")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
