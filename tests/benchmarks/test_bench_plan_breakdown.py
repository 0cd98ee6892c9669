"""benchmarks/bench_plan_breakdown.py: its wrappers find the engine names they time (a renamed function fails
the child, not the figures), its parts never exceed the wall time, and a variant it does not know is a one-line
usage error (exit 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import bench_plan_breakdown as bpb  # noqa: E402


def _rows(out: str) -> list[dict[str, str]]:
    """The printed table's rows, each by its column names (the columns may grow: read them by name)."""
    lines = out.splitlines()
    head = [h.strip() for h in lines[0].split("|")[1:-1]]
    return [dict(zip(head, (x.strip() for x in line.split("|")[1:-1]))) for line in lines[2:]]


def test_a_cell_splits_its_wall_time_and_a_capped_search_costs_no_more_candidates(capsys):
    model = str(ROOT / "samples" / "layernorm_residual.onnx")
    assert bpb.main([model, "--devices", "a100", "--variant", "base", "--variant", "cap=1"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [r["variant"] for r in rows] == ["base", "cap=1"]
    for r in rows:
        wall, walk, stitch, rest, builds, counts, floors = (float(r[k]) for k in (
            "wall s", "walk", "stitch", "rest", "builds s", "counts s", "floors s"))
        assert walk + stitch + rest == pytest.approx(wall, abs=0.02)
        assert 0 < builds + counts + floors <= wall
        assert 0 < float(r["cpu s"]) <= wall + 0.05  # the planning process's CPU seconds (one thread)
        assert int(r["passes"]) > 0 and int(r["kernels built"]) > 0
    assert int(rows[1]["kernels built"]) <= int(rows[0]["kernels built"])


def test_an_unknown_variant_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as err:
        bpb.main(["samples/gelu_chain.onnx", "--variant", "fast"])
    assert err.value.code == 2
    assert "unknown variant 'fast'" in capsys.readouterr().err


def test_a_tree_variant_plans_with_that_checkouts_engine_and_rounds_keep_the_counts(capsys):
    model = str(ROOT / "samples" / "gelu_chain.onnx")
    assert bpb.main([model, "--devices", "host", "--variant", "base", "--variant", f"tree={ROOT}",
                     "--rounds", "2"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert [r["variant"] for r in rows] == ["base", f"tree={ROOT}"]
    same = ("trials", "passes", "kernels built", "floors", "plan kernels", "modeled us")
    assert [rows[0][k] for k in same] == [rows[1][k] for k in same]  # the same engine: the same search and plan


def test_a_tree_that_is_no_checkout_is_a_usage_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        bpb.main(["samples/gelu_chain.onnx", "--variant", f"tree={tmp_path}"])
    assert err.value.code == 2
    assert "is not a tileweave checkout" in capsys.readouterr().err


def test_ties_are_counted_among_the_candidates_costed(capsys):
    model = str(ROOT / "samples" / "layernorm_residual.onnx")
    assert bpb.main([model, "--devices", "host"]) == 0
    row = _rows(capsys.readouterr().out)[0]
    costed, tied = int(row["costed"]), int(row["tied"])
    assert 0 <= tied < costed
