"""Group-level tile propagation (engine/tilegraph/tilegraph.py) against brute force: poison one input
element with NaN, evaluate the segment with the reference executor, see which anchor outputs change."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.frontend.importer import load_graph
from engine.runtime.reference import eval_stage
from engine.tilegraph.tilegraph import anchor_box, propagate_group, segment_sinks, segments_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "schedule"))
from sched_graphs import attention_model  # noqa: E402


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "attn.onnx"
    onnx.save(attention_model(m=6, k=5, n=7), path)
    return load_graph(path)


def _inputs(graph, rng):
    env = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in graph.inputs}
    env.update({k: np.asarray(v) for k, v in graph.weights.items()})
    return env


def _eval_segment(graph, segment, env):
    env = dict(env)
    for name in segment:
        env[name] = eval_stage(graph.stage(name), env)
    return env


def _touched(graph, segment, anchor, box, env, tensor):
    """Elements of `tensor` whose poisoning changes the anchor's box (brute force)."""
    base = _eval_segment(graph, segment, env)[anchor]
    sl = tuple(slice(lo, hi) for lo, hi in box)
    hits = []
    for idx in np.ndindex(*env[tensor].shape):
        poisoned = dict(env)
        arr = env[tensor].copy()
        arr[idx] = np.nan
        poisoned[tensor] = arr
        out = _eval_segment(graph, segment, poisoned)[anchor]
        if not np.array_equal(np.isnan(out[sl]), np.isnan(base[sl])):
            hits.append(idx)
    return hits


CONNS = {
    # the whole graph as one segment: matmul epilogue, softmax stitched through shared memory
    "all_fused": {"mm>add": "register", "add>sm::max": "shared", "add>sm::exp": "register",
                  "sm::max>sm::exp": "shared", "sm::exp>sm::sum": "register", "sm::exp>sm": "register",
                  "sm::sum>sm": "shared", "sm>out": "register"},
}


def _conns(graph, spec):
    out = {e: "kernel" for e in graph.edges}
    for k, v in spec.items():
        p, c = k.split(">")
        out[(p, c)] = v
    return out


@settings(max_examples=12, deadline=None)
@given(r0=st.integers(0, 5), r1=st.integers(1, 6), c0=st.integers(0, 6), c1=st.integers(1, 7), seed=st.integers(0, 99))
def test_group_regions_cover_brute_force(graph, r0, r1, c0, c1, seed):
    lo_r, hi_r = min(r0, 5), max(min(r0, 5) + 1, min(r1, 6))
    lo_c, hi_c = min(c0, 6), max(min(c0, 6) + 1, min(c1, 7))
    conns = _conns(graph, CONNS["all_fused"])
    [segment] = segments_of(graph, [s.name for s in graph.stages], conns)
    [anchor] = segment_sinks(graph, segment, conns)
    assert anchor == "out"
    box = ((lo_r, hi_r), (lo_c, hi_c))
    regions = propagate_group(graph, segment, conns, anchor, box)
    env = _inputs(graph, np.random.default_rng(seed))
    hits = _touched(graph, segment, anchor, box, env, "x")
    xbox = regions.inputs["x"]
    assert hits, "the anchor box depends on x"
    for idx in hits:
        assert all(lo <= i < hi for i, (lo, hi) in zip(idx, xbox)), (idx, xbox)
    # Softmax rows need the whole row of x, and exactly the box's rows: the region is tight here.
    assert xbox == ((lo_r, hi_r), (0, 5))
    assert regions.stages["sm::max"] == ((lo_r, hi_r), (0, 1))
    assert regions.stages["add"] == ((lo_r, hi_r), (0, 7))


def test_segments_split_at_global_sync(graph):
    conns = _conns(graph, CONNS["all_fused"])
    conns[("sm::sum", "sm")] = "global_sync"
    assert len(segments_of(graph, [s.name for s in graph.stages], conns)) == 1  # exp -> sm still joins them
    conns[("sm::exp", "sm")] = "global_sync"
    segs = segments_of(graph, [s.name for s in graph.stages], conns)
    assert len(segs) == 2
    assert segs[0][-1] == "sm::sum" and segs[1] == ["sm", "out"]
    assert [segment_sinks(graph, s, conns) for s in segs] == [["sm::sum"], ["out"]]


def test_anchor_box_clips_last_tile():
    assert anchor_box((10, 7), (4, 4), (2, 1)) == ((8, 10), (4, 7))
