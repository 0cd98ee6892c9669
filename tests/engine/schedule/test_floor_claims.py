"""What the tile search's floor claims beyond its regions' boxes (engine/schedule/floor.py), each checked
against what it stands for: a reader whose index map is one-to-one (`reads_distinct`, checked point by point
for a reshape), a contraction no phase can tile (`generate.may_tile`: its multiply-adds are
per-element flops), and the rounding that lets a floor skip a candidate that could at most tie
(`tiles._models_at_least`). The bounds themselves are held against the kernel IR's counts over random graphs
in test_floor.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from support import graph_model

from engine.api import load_graph
from engine.codegen.generate import may_tile, resolved_body
from engine.schedule import tiles
from engine.schedule.floor import box_loads, reads_distinct


def _graph(tmp_path, nodes, inputs, consts=None, outs=("y",)):
    model = graph_model(nodes, inputs, consts or {}, outs)
    onnx.save(model, tmp_path / "m.onnx")
    return load_graph(tmp_path / "m.onnx")


def _stage_of(graph, op):
    return next(s for s in graph.stages if s.op == op)


def test_a_reshape_and_a_transpose_read_distinct_elements_a_broadcast_does_not(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 4)).astype(np.float32)
    m = rng.standard_normal((1, 1, 4)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "s"], ["y"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 1]),
             helper.make_node("Add", ["r", "m"], ["z"])]
    graph = _graph(tmp_path, nodes, {"x": x, "m": m}, {"s": np.array([4, 12], np.int64)}, outs=("y", "t", "z"))
    relu = _stage_of(graph, "relu").name
    readers = {s.op: s.name for s in graph.stages if relu in s.inputs}
    assert set(readers) == {"reshape", "transpose", "add"}, readers
    assert relu not in [t for t, _ in box_loads(graph.stage(readers["reshape"]))]  # a div/mod index
    assert reads_distinct(graph, readers["reshape"], relu)  # checked point by point
    assert reads_distinct(graph, readers["transpose"], relu)  # a box load naming every axis
    assert reads_distinct(graph, readers["add"], relu)
    assert not reads_distinct(graph, readers["add"], "m")  # every row reads the same 4 elements


def test_reads_distinct_checks_the_map_point_by_point(tmp_path):
    """A reshape whose flat order is kept reads one element per element; a Gather's rows (through an index
    tensor) are never claimed, one-to-one or not."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    ids = np.array([2, 0, 2], np.int64)  # row 2 twice
    nodes = [helper.make_node("Sigmoid", ["x"], ["g"]),
             helper.make_node("Gather", ["g", "ids"], ["y"], axis=0)]
    graph = _graph(tmp_path, nodes, {"x": x}, {"ids": ids})
    g = _stage_of(graph, "sigmoid").name
    gather = next(s.name for s in graph.stages if g in s.inputs)
    assert not reads_distinct(graph, gather, g)


def test_a_batched_product_over_several_heads_cannot_tile_one_head_can(tmp_path):
    """`may_tile` follows `_gemm_of`: a block spanning two heads flattens them into the GEMM's rows, where
    the second factor (each head's own keys) varies with them: no tiled GEMM, whatever the threads; one head
    per block is a GEMM."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 4, 16, 8)).astype(np.float32)
    k = rng.standard_normal((1, 4, 8, 16)).astype(np.float32)
    graph = _graph(tmp_path, [helper.make_node("MatMul", ["q", "k"], ["y"])], {"q": q, "k": k})
    mm = _stage_of(graph, "matmul").name
    body = resolved_body(graph, mm, set(), [])
    assert may_tile(graph, mm, body, (1, 1, 16, 16))
    assert not may_tile(graph, mm, body, (1, 2, 8, 16))


@pytest.mark.parametrize(("floor", "time", "at_least"), [
    (122.54325000071731, 122.5433, True),  # exact to the last digit, half a unit under what it rounds to
    (122.5433, 122.5433, True),
    (122.54324, 122.5433, False),  # may round to 122.5432: better than the time
    (122.54335, 122.5433, True),
])
def test_a_floor_skips_only_candidates_that_round_to_the_time_or_above(floor, time, at_least):
    assert tiles._models_at_least(floor, time) is at_least
    # whatever the candidate models at or above its floor rounds to `time` or more where claimed
    if at_least:
        assert round(floor, 4) >= time
