"""Text and DOT renderings of a PrimGraph, and the DUMP_DIR/DEBUG trail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from support import sample_path

from engine.frontend.importer import load_graph
from engine.ir.printer import format_graph, format_stage, graph_to_dot


def test_text_is_stable_and_lists_every_stage():
    g1 = load_graph(sample_path("layernorm_residual"))
    g2 = load_graph(sample_path("layernorm_residual"))
    text = format_graph(g1)
    assert text == format_graph(g2)
    for s in g1.stages:
        assert format_stage(s) in text
    assert text.splitlines()[0].endswith(g1.structural_hash)
    assert "sum r0<768" in text  # the layernorm mean is a reduce over the row


def test_dot_has_one_node_per_stage_and_renders():
    g = load_graph(sample_path("masked_softmax"))
    dot = graph_to_dot(g)
    for s in g.stages:
        assert f'"{s.name}" [' in dot
    assert dot.count("->") >= len(g.edges)
    if shutil.which("dot") is None:
        pytest.skip("graphviz 'dot' not installed (make test installs it)")
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True).stdout
    assert "<svg" in svg


def test_dump_dir_and_debug_trail(tmp_path):
    out = tmp_path / "dump"
    env = dict(os.environ, DUMP_DIR=str(out), DEBUG="4")
    cmd = [sys.executable, "-m", "engine", "run", str(sample_path("gelu_chain")), "--backend", "cpu",
           "--policy", "stitch", "--outputs", str(tmp_path / "o.npz")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {p.name for p in out.iterdir()}
    assert {"graph.txt", "graph.dot", "plan.json", "program.json", "profile.json", "repro.sh"} <= names
    assert any(n.endswith(".cu") for n in names) and any(n.endswith(".c") for n in names)
    assert "__global__" in proc.stderr  # DEBUG=4 prints the generated CUDA
    assert "tileweave run" in (out / "repro.sh").read_text()
