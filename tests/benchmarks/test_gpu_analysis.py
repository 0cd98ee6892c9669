"""benchmarks/gpu_analysis.py on the measurements committed from a real H200 (benchmarks/data/h200-2026-11-27):
the table reads them back, and the rate variant (memory at what a grid's SMs can draw, branch gpurate)
leaves a kernel on a full, well-occupied grid as modeled and never raises one under a wave."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_analysis  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "h200-2026-11-27"


def test_the_rate_variant_changes_small_grids_only(capsys, monkeypatch):
    models = gpu_analysis.load(DATA)
    kernels = [k for m in models for c in m["cells"].values() for k in c["kernels"]]
    assert len(models) == 12 and len(kernels) == 4139
    def warps(k):
        return min(k["resident_blocks_per_sm"], -(-k["grid"] // gpu_analysis.SM)) * (k["threads"] // 32)

    full = [k for k in kernels if k["grid"] >= gpu_analysis.SM and warps(k) >= 48 and k["segments"] == 1
            and k["terms_us"]["wave_quantization"] <= 0.005 * k["modeled_us"]]
    small = [k for k in kernels if k["grid"] < gpu_analysis.SM]
    dram_bound = [k for k in small if k["modeled_us"] > 50 and k["terms_us"]["dram"] > k["terms_us"]["l2"]]
    assert full and dram_bound
    # 48 warps or more per SM on every SM, next to no partial wave: the old latency fraction was 1 and the rate is
    # at least the level's bandwidth.
    assert all(abs(gpu_analysis.with_rate(k) - k["modeled_us"]) <= 0.01 * k["modeled_us"] for k in full)
    # Under one wave: never dearer. The latency-bound L2 rate of a few SMs is what it was (the old fraction of
    # each SM's share times the quantisation is that rate too); DRAM is no longer slowed by a latency fraction
    # taken against the L2 share, so the kernels the old model had DRAM-bound get much cheaper.
    assert all(gpu_analysis.with_rate(k) <= k["modeled_us"] * 1.001 for k in small)
    assert all(gpu_analysis.with_rate(k) < 0.75 * k["modeled_us"] for k in dram_bound)
    monkeypatch.setattr(sys, "argv", ["gpu_analysis.py", str(DATA), "--rate-variant"])
    assert gpu_analysis.main() == 0
    out = capsys.readouterr().out
    assert "| as it is | ρ 0.66 |" in out and "(branch gpurate)" in out and "| 339 kernels |" in out
