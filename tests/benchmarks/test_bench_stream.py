"""benchmarks/bench_stream.py: a one-kernel plan's least bytes are the graph's floor (inputs read once, outputs
written once), a contraction kernel has none, and a model that does not exist is a one-line error (exit 2)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_stream  # noqa: E402
from engine.device import get_device  # noqa: E402
from engine.frontend.importer import load_graph  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402


def test_a_fused_memory_intensive_kernel_moves_the_graphs_floor_at_least():
    device = get_device("a100")
    planned, plan = plan_model(load_graph(ROOT / "samples" / "layernorm_residual.onnx"), "welder", device)
    conns = {e.key: e.conn for e in plan.edges}
    moved = [bench_stream.least_bytes(planned, g, conns, device) for g in plan.groups]
    # Every kernel moves at least what it writes; together at least the graph's floor, and no kernel more
    # than everything it touches.
    assert sum(moved) >= planned.min_dram_bytes
    for g, b in zip(plan.groups, moved):
        inputs = {t for s in g.stages for t in planned.stage(s).inputs if t not in g.stages}
        assert b <= sum(planned.specs[t].nbytes for t in inputs) + sum(planned.specs[s].nbytes for s in g.stages)


def test_a_missing_model_is_a_one_line_error(capsys):
    assert bench_stream.main(["no_such_model.onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no model") and "\n" not in err


def test_the_summary_counts_kernels_at_the_target():
    rows = [{"contraction": False, "model_memory_bound": True, "bytes": 8 << 20, "measured_us": 100.0},
            {"contraction": False, "model_memory_bound": False, "bytes": 1 << 10, "measured_us": 10.0},
            {"contraction": True, "model_memory_bound": False, "bytes": None, "measured_us": 50.0}]
    s = bench_stream.summary(rows, stream=100e9, llc=400e9, big=1 << 20, copy=80e9)
    assert s["all"]["kernels"] == 2 and s["big"]["kernels"] == 1 and s["model"]["kernels"] == 1
    # 8 MiB in 100 us: 84 GB/s, 84 % of STREAM; 1 KiB in 10 us: 0.1 %; together 76 %
    assert s["all"]["at_target"] == 1 and s["big"]["at_target"] == 1
    assert abs(s["all"]["weighted_of_stream"] - ((8 << 20) + (1 << 10)) / 110e-6 / 100e9) < 1e-9
    assert abs(s["big"]["weighted_of_copy"] - (8 << 20) / 100e-6 / 80e9) < 1e-9
