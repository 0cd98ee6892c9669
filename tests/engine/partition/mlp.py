"""A two-layer MLP whose weights (2 x 16 MiB) exceed a 28 MB device, large enough that its GEMMs, not
launches, dominate the modeled time: the partition tests' model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROWS, WIDTH, HIDDEN = 256, 1024, 4096


def write_mlp(folder: Path, seed: int = 7) -> tuple[Path, dict[str, np.ndarray]]:
    """mlp.onnx (y = relu(x W1 + b1) W2) and random inputs for it."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((WIDTH, HIDDEN)).astype(np.float32) / 32
    b1 = rng.standard_normal(HIDDEN).astype(np.float32)
    w2 = rng.standard_normal((HIDDEN, WIDTH)).astype(np.float32) / 64
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu1"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, WIDTH])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
                               numpy_helper.from_array(w2, "w2")])
    path = folder / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path, {"x": rng.standard_normal((ROWS, WIDTH)).astype(np.float32)}


def write_small_device(folder: Path, memory_bytes: int = 28_000_000) -> Path:
    path = folder / "small.json"
    path.write_text(json.dumps({"base": "a100", "memory_bytes": memory_bytes}))
    return path
