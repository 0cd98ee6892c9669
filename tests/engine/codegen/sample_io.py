"""Sample models with inputs and onnxruntime outputs for backend tests (stored I/O, or a fixed seed
and a live onnxruntime run where the catalog has none)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
from support import random_feeds  # shared with the edit fuzzer; the codegen tests import it from here

SAMPLES = Path(__file__).resolve().parents[3] / "samples"
CATALOG = json.loads((SAMPLES / "catalog.json").read_text())
RUNNABLE = [e["name"] for e in CATALOG if e["category"] != "scale"]
MEMORY_INTENSIVE = [e["name"] for e in CATALOG if e["category"] == "memory-intensive"]


@functools.cache
def load_sample(name: str):
    """(PrimGraph, inputs, expected outputs) or raises the importer's UnsupportedOpError."""
    from engine.api import load_graph

    graph = load_graph(SAMPLES / f"{name}.onnx")
    entry = next(e for e in CATALOG if e["name"] == name)
    if entry["io"]:
        data = np.load(SAMPLES / entry["io"])
        inputs = {t.name: data[t.name] for t in graph.inputs}
        expected = {n: data[n] for n in graph.output_names}
        return graph, inputs, expected
    import onnxruntime as ort

    inputs = random_feeds(graph, 1234)
    sess = ort.InferenceSession(str(SAMPLES / entry["file"]), providers=["CPUExecutionProvider"])
    outs = sess.run(None, inputs)
    expected = {o.name: v for o, v in zip(sess.get_outputs(), outs)}
    return graph, inputs, expected


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| relative to max |want| (the issue's tolerance measure)."""
    want = np.asarray(want, dtype=np.float64)
    scale = max(float(np.abs(want).max()) if want.size else 0.0, 1e-30)
    return float(np.abs(np.asarray(got, dtype=np.float64) - want).max() / scale)
