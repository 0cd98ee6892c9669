"""Tests for engine/ir/serialize.py: stages and whole sample graphs round-trip through JSON text."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import CATALOG, sample_path

from engine.api import load_graph
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, Stage, StageKind
from engine.ir.serialize import graph_from_json, graph_to_json, stage_from_json, stage_to_json


def test_stage_round_trip_with_every_node_kind():
    i0, i1 = I.out_vars(2)
    gathered = I.as_lin(I.Indirect("idx", (I.floordiv(i0, 2),), 7))
    body = E.select(
        E.binary("lt", E.index_val(I.mod(i1 + 1, 3)), E.imm(2, DType.I64)),
        E.unary("exp", E.Load("x", (gathered, I.imax(i1 - 1, 0)), DType.F32, pad=0.0)),
        E.cast(E.Load("m", (I.iabs(i1 - 2),), DType.I64), DType.F32),
    )
    stage = Stage("s", StageKind.REDUCE, (4, 5), DType.F32, E.binary("mul", body, E.imm(0.5)), (3,),
                  Combine.MAX, op="odd", origin=("n1", "n2"))
    back = stage_from_json(json.loads(json.dumps(stage_to_json(stage))))
    assert back == stage and hash(back) == hash(stage)


@pytest.mark.parametrize("name", [n for n, e in CATALOG.items() if e["category"] != "scale"])
def test_sample_graph_round_trip(name):
    g = load_graph(sample_path(name))
    text = json.dumps(graph_to_json(g))
    back = graph_from_json(json.loads(text), dict(g.weights))
    assert back == g
    assert back.structural_hash == g.structural_hash


def test_weights_round_trip_and_change_the_hash():
    g = load_graph(sample_path("gelu_chain"))
    back = graph_from_json(json.loads(json.dumps(graph_to_json(g, weights=True))))
    assert back.structural_hash == g.structural_hash
    name = next(iter(g.weights))
    changed = dict(g.weights)
    changed[name] = g.weights[name] + np.float32(1)
    assert graph_from_json(graph_to_json(g), changed).structural_hash != g.structural_hash
