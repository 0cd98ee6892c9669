"""A phase's region bounds read from a per-tile table are printed with that table. Found on a real GPU
(benchmarks/NOTES.md gpu-2026-11-30): zoo swin's h200 welder plan stores a GEMM (view_29) to global memory
alone, over the clipped boxes a window reshape gives its tiles; its bounds named a table `tab_..._p` that no
line defined, and NVRTC refused the kernel. The plan is the one `tileweave plan samples/zoo/swin.onnx
--policy welder --device h200 --plan-out` wrote at fc7b68d (tests/data/plans)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from engine.codegen.generate import generate
from engine.codegen.nvrtc import compile_cuda
from engine.codegen.targets import render_cuda
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import load_plan

ROOT = Path(__file__).resolve().parents[3]


def test_a_global_phase_over_a_table_region_prints_its_table_and_compiles():
    graph = load_graph(ROOT / "samples" / "zoo" / "swin.onnx")
    saved = json.loads(gzip.decompress((ROOT / "tests" / "data" / "plans" / "swin.welder.h200.json.gz").read_bytes()))
    planned, plan = load_plan(saved, graph)
    program = generate(plan, planned, get_device("h200"), target="cuda")
    # The case itself: a phase with no block buffer of its own whose region is a table (else this test
    # checks nothing: the plan or the generator changed, and another case is needed).
    cases = [(k.name, p.stage) for k in program.kernels for s in k.segments for p in s.phases
             if p.region.table and not any(b.tensor == p.stage and b.name in p.stores for b in k.locals)]
    assert cases, "the saved plan no longer has a global-only phase over a table region"
    source = render_cuda(program)
    used = set(re.findall(r"\b(tab_\w+)\[", source))
    defined = set(re.findall(r"\bint (tab_\w+)\[", source))
    assert used <= defined, sorted(used - defined)
    # Each table printed once (two such phases in one kernel get a table each, named by their position).
    assert all(len(re.findall(rf"\bint {t}\[", source)) == 1 for t in defined)
    binary = compile_cuda(source, name=program.name, arch="sm_90")
    assert binary.cubin[:4] == b"\x7fELF"
