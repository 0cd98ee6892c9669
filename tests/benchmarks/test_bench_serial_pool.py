"""benchmarks/bench_serial_pool.py: it times each serial kernel of a plan both ways with the plan's own modeled
time beside them, leaves the C target's threshold as it was, and a malformed spec is a one-line usage error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_serial_pool as bsp  # noqa: E402
from engine.codegen import ctarget  # noqa: E402


def test_serial_kernels_are_timed_both_ways_and_the_threshold_restored(capsys):
    threshold = ctarget.SERIAL_WORK
    assert bsp.main([f"{ROOT / 'samples' / 'layernorm_residual.onnx'}:unfused", "--runs", "3"]) == 0
    assert ctarget.SERIAL_WORK == threshold
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows  # the unfused plan of this sample runs most of its kernels serially on the host
    for r in rows:
        modeled, printed, pooled, ratio = (float(x) for x in r[3:7])
        assert modeled > 0 and printed > 0 and pooled > 0
        # the times are printed to 0.1 us, the ratio to 0.01 from the unrounded times
        assert (printed - 0.05) / (pooled + 0.05) - 0.005 <= ratio <= (printed + 0.05) / (pooled - 0.05) + 0.005


@pytest.mark.parametrize("spec", ["samples/zoo/swin.onnx", "missing.onnx:welder"])
def test_bad_spec_is_a_usage_error(spec, capsys):
    with pytest.raises(SystemExit) as e:
        bsp.main([spec])
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()[-1]) > 0
