"""Build the committed sample ONNX models, their reference I/O and catalog.json.

Run from the repository root:

    .venv/bin/python samples/make_samples.py

Every model is built with ``onnx.helper`` from fixed seeds, so re-running the script
produces byte-identical ``.onnx`` files (no timestamps, fixed producer and doc strings)
and byte-identical ``.io.npz`` files (fixed zip entry dates).  Reference outputs come
from onnxruntime's default CPU provider.

Conventions shared by all samples:
  * float32 activations everywhere; the large weight matrices of the whole-model samples
    are stored as float16 initializers followed by ``Cast(to=FLOAT)`` to keep the files small;
  * ``ir_version`` is pinned to 10 (onnx 1.23 writes 14, which onnxruntime 1.31 refuses);
  * random inputs are rounded to bfloat16-representable values with magnitude >= 2**-14, so
    they are never zero, are exact in float32, float16 and bfloat16, and compress well in the
    ``.io.npz`` files.
"""

from __future__ import annotations

import io
import json
import math
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SAMPLES_DIR = Path(__file__).resolve().parent
IR_VERSION = 10
PRODUCER = "tileweave-samples"
PRODUCER_VERSION = "1.0"
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL


# --------------------------------------------------------------------------------------
# Graph-building helpers
# --------------------------------------------------------------------------------------


class GraphBuilder:
    """Accumulates nodes, initializers and graph I/O; names nodes ``<scope><Op>_<n>``."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.scope = ""
        self._count = 0

    # -- graph I/O and constants --------------------------------------------------
    def input(self, name: str, shape: Sequence[int], elem: int = FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, tensor: str, name: str, shape: Sequence[int], elem: int = FLOAT) -> str:
        """Expose ``tensor`` as graph output ``name`` (renaming the producing node's output)."""
        for node in self.nodes:
            for i, out in enumerate(node.output):
                if out == tensor:
                    node.output[i] = name
            for i, inp in enumerate(node.input):
                if inp == tensor:
                    node.input[i] = name
        self.outputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def init(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def scalar(self, value: float, dtype=np.float32) -> str:
        """A 0-d initializer (the style onnx graph optimizers leave behind)."""
        return self.init(self._fresh("const"), np.array(value, dtype=dtype))

    def ints(self, values: Sequence[int]) -> str:
        """A 1-d int64 initializer (shapes, axes, split sizes, slice bounds)."""
        return self.init(self._fresh("ints"), np.array(values, dtype=np.int64))

    def constant(self, value, dtype=np.float32) -> str:
        """A ``Constant`` node (the style the TorchScript exporter emits)."""
        tensor = numpy_helper.from_array(np.array(value, dtype=dtype))
        return self.op("Constant", [], value=tensor)

    def weight(self, name: str, value: np.ndarray, fp16: bool = False) -> str:
        """A float32 weight; with ``fp16`` stored as float16 and cast back by a ``Cast`` node."""
        if not fp16:
            return self.init(name, value.astype(np.float32))
        self.init(name, value.astype(np.float16))
        return self.op("Cast", [name], to=FLOAT)

    # -- nodes ------------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs) -> str | list[str]:
        node_name = self._fresh(op_type)
        outputs = [f"{node_name}_out{i}" if n_out > 1 else f"{node_name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=node_name, **attrs))
        return outputs[0] if n_out == 1 else outputs

    def _fresh(self, stem: str) -> str:
        self._count += 1
        return f"{self.scope}{stem}_{self._count}"

    # -- model ----------------------------------------------------------------------------
    def model(self, opset: int, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers, doc_string=doc
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", opset)],
            producer_name=PRODUCER,
            producer_version=PRODUCER_VERSION,
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


def linear(g: GraphBuilder, x: str, w: str, b: str) -> str:
    """``x @ w + b`` as MatMul + Add (how torch exports nn.Linear on 3-d inputs)."""
    return g.op("Add", [g.op("MatMul", [x, w]), b])


def layer_norm(g: GraphBuilder, x: str, scale: str, bias: str, eps: float) -> str:
    """The opset-17 ``LayerNormalization`` op over the last axis."""
    return g.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=eps)


def conv_bn(g: GraphBuilder, rng, x: str, cin: int, cout: int, k: int, prefix: str, **conv_attrs) -> str:
    """Conv (no bias) + BatchNormalization with random running statistics."""
    group = conv_attrs.get("group", 1)
    fan_in = cin // group * k * k
    w = g.weight(f"{prefix}.weight", rng.normal(0, math.sqrt(2.0 / fan_in), (cout, cin // group, k, k)))
    y = g.op("Conv", [x, w], kernel_shape=[k, k], **conv_attrs)
    bn = [
        g.weight(f"{prefix}.bn.weight", rng.uniform(0.5, 1.5, cout)),
        g.weight(f"{prefix}.bn.bias", rng.normal(0, 0.1, cout)),
        g.weight(f"{prefix}.bn.running_mean", rng.normal(0, 0.1, cout)),
        g.weight(f"{prefix}.bn.running_var", rng.uniform(0.5, 1.5, cout)),
    ]
    return g.op("BatchNormalization", [y, *bn], epsilon=1e-5)


# -- BERT ------------------------------------------------------------------------------

SEQ, HIDDEN, HEADS, HEAD_DIM, FFN = 128, 768, 12, 64, 3072


def bert_params(hidden: int = HIDDEN, ffn: int = FFN) -> list[tuple[str, tuple[int, ...]]]:
    """(parameter name, shape); "w_*" are weight matrices, the rest biases / LayerNorm params."""
    return [
        ("w_q", (hidden, hidden)), ("b_q", (hidden,)),
        ("w_k", (hidden, hidden)), ("b_k", (hidden,)),
        ("w_v", (hidden, hidden)), ("b_v", (hidden,)),
        ("w_o", (hidden, hidden)), ("b_o", (hidden,)),
        ("ln1_scale", (hidden,)), ("ln1_bias", (hidden,)),
        ("w_ffn1", (hidden, ffn)), ("b_ffn1", (ffn,)),
        ("w_ffn2", (ffn, hidden)), ("b_ffn2", (hidden,)),
        ("ln2_scale", (hidden,)), ("ln2_bias", (hidden,)),
    ]  # fmt: skip


BERT_PARAMS = bert_params()


def bert_extended_mask(g: GraphBuilder, mask: str) -> str:
    """``(1 - mask[:, None, None, :]) * -10000`` -> [1, 1, 1, SEQ], as TorchScript exports it."""
    m = g.op("Unsqueeze", [mask, g.constant([1], np.int64)])
    m = g.op("Unsqueeze", [m, g.constant([2], np.int64)])
    m = g.op("Sub", [g.constant(1.0), m])
    return g.op("Mul", [m, g.constant(-10000.0)])


def computed_shape(g: GraphBuilder, x: str, tail: Sequence[int]) -> str:
    """``x.size()[:2] + tail`` via Shape -> Gather -> Unsqueeze -> Concat (must be folded)."""
    shape = g.op("Shape", [x])
    dims = []
    for axis in (0, 1):
        d = g.op("Gather", [shape, g.constant(axis, np.int64)], axis=0)
        dims.append(g.op("Unsqueeze", [d, g.constant([0], np.int64)]))
    dims += [g.constant([t], np.int64) for t in tail]
    return g.op("Concat", dims, axis=0)


def bert_attention(g: GraphBuilder, x: str, ext_mask: str, p: dict[str, str], n_heads: int = HEADS,
                   head_dim: int = HEAD_DIM) -> str:
    """HF BertSelfAttention + BertSelfOutput dense (without residual/LayerNorm)."""

    def heads(t: str, perm: list[int]) -> str:
        t = g.op("Reshape", [t, computed_shape(g, t, (n_heads, head_dim))])
        return g.op("Transpose", [t], perm=perm)

    q = heads(linear(g, x, p["w_q"], p["b_q"]), [0, 2, 1, 3])  # [1, 12, 128, 64]
    k = heads(linear(g, x, p["w_k"], p["b_k"]), [0, 2, 3, 1])  # [1, 12, 64, 128]
    v = heads(linear(g, x, p["w_v"], p["b_v"]), [0, 2, 1, 3])  # [1, 12, 128, 64]
    scores = g.op("Div", [g.op("MatMul", [q, k]), g.constant(math.sqrt(head_dim))])
    probs = g.op("Softmax", [g.op("Add", [scores, ext_mask])], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])  # [1, 128, 12, 64]
    ctx = g.op("Reshape", [ctx, computed_shape(g, ctx, (n_heads * head_dim,))])
    return linear(g, ctx, p["w_o"], p["b_o"])


def gelu_erf(g: GraphBuilder, x: str) -> str:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` from elementary ops (TorchScript's GELU export)."""
    e = g.op("Erf", [g.op("Div", [x, g.constant(math.sqrt(2.0))])])
    return g.op("Mul", [g.op("Mul", [x, g.op("Add", [e, g.constant(1.0)])]), g.constant(0.5)])


def bert_layer(g: GraphBuilder, x: str, ext_mask: str, p: dict[str, str], n_heads: int = HEADS,
               head_dim: int = HEAD_DIM) -> str:
    """One post-norm BERT encoder layer (HF BertLayer)."""
    h = g.op("Add", [bert_attention(g, x, ext_mask, p, n_heads, head_dim), x])
    h = layer_norm(g, h, p["ln1_scale"], p["ln1_bias"], eps=1e-12)
    f = gelu_erf(g, linear(g, h, p["w_ffn1"], p["b_ffn1"]))
    f = linear(g, f, p["w_ffn2"], p["b_ffn2"])
    return layer_norm(g, g.op("Add", [f, h]), p["ln2_scale"], p["ln2_bias"], eps=1e-12)


def bert_random_params(g: GraphBuilder, rng, prefix: str, params=BERT_PARAMS) -> dict[str, str]:
    """BERT parameters as initializers; weight matrices fp16-stored + Cast."""
    p = {}
    for key, shape in params:
        name = f"{prefix}.{key}"
        if key.startswith("w_"):
            p[key] = g.weight(name, rng.normal(0, 0.02, shape), fp16=True)
        elif key.endswith("_scale"):
            p[key] = g.weight(name, 1.0 + rng.normal(0, 0.05, shape))
        else:
            p[key] = g.weight(name, rng.normal(0, 0.02, shape))
    return p


# --------------------------------------------------------------------------------------
# Random inputs
# --------------------------------------------------------------------------------------


def round_input(x: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 precision, magnitudes clamped to >= 2**-14 (never zero)."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    x = u.view(np.float32)
    tiny = np.float32(2.0**-14)
    return np.where(np.abs(x) < tiny, np.copysign(tiny, x), x).astype(np.float32)


def normal_input(rng, shape, scale: float = 1.0) -> np.ndarray:
    return round_input(rng.standard_normal(shape) * scale)


def uniform_input(rng, shape, low: float, high: float) -> np.ndarray:
    return round_input(rng.uniform(low, high, shape))


# --------------------------------------------------------------------------------------
# Samples: each builder returns (model, {input name: array}) — inputs are None for "scale"
# --------------------------------------------------------------------------------------

Inputs = dict[str, np.ndarray] | None


def build_bert_layer(rng, seq: int = SEQ, hidden: int = HIDDEN, heads: int = HEADS,
                     ffn: int = FFN) -> tuple[onnx.ModelProto, Inputs]:
    g = GraphBuilder("bert_layer")
    x = g.input("hidden", [1, seq, hidden])
    mask = g.input("attention_mask", [1, seq])
    g.scope = "embeddings_mask/"
    ext = bert_extended_mask(g, mask)
    g.scope = "encoder.layer.0/"
    p = bert_random_params(g, rng, "encoder.layer.0", bert_params(hidden, ffn))
    y = bert_layer(g, x, ext, p, heads, hidden // heads)
    g.output(y, "out", [1, seq, hidden])
    model = g.model(
        17, f"BERT-base encoder layer (seq {seq}, hidden {hidden}, {heads} heads, FFN {ffn}), TorchScript-style"
    )
    valid = int(rng.integers(seq * 3 // 4, seq * 15 // 16 + 1))
    inputs = {
        "hidden": normal_input(rng, (1, seq, hidden)),
        "attention_mask": (np.arange(seq) < valid).astype(np.float32)[None, :],
    }
    return model, inputs


def build_vit_block(rng, tokens: int = 197, dim: int = 384, heads: int = 6,
                    mlp: int = 1536) -> tuple[onnx.ModelProto, Inputs]:
    head_dim = dim // heads
    g = GraphBuilder("vit_block")
    x = g.input("x", [1, tokens, dim])

    def w(name, shape):
        return g.weight(name, rng.normal(0, 0.02, shape), fp16=True)

    def vec(name, n, mean=0.0, std=0.02):
        return g.weight(name, mean + rng.normal(0, std, n))

    g.scope = "attn/"
    h = layer_norm(g, x, vec("norm1.weight", dim, 1.0, 0.05), vec("norm1.bias", dim), eps=1e-6)
    qkv = linear(g, h, w("attn.qkv.weight", (dim, 3 * dim)), vec("attn.qkv.bias", 3 * dim))
    q, k, v = g.op("Split", [qkv, g.ints([dim, dim, dim])], n_out=3, axis=-1)
    head_shape = g.ints([1, tokens, heads, head_dim])
    q = g.op("Transpose", [g.op("Reshape", [q, head_shape])], perm=[0, 2, 1, 3])  # [1, 6, 197, 64]
    k = g.op("Transpose", [g.op("Reshape", [k, head_shape])], perm=[0, 2, 3, 1])  # [1, 6, 64, 197]
    v = g.op("Transpose", [g.op("Reshape", [v, head_shape])], perm=[0, 2, 1, 3])  # [1, 6, 197, 64]
    q = g.op("Mul", [q, g.scalar(head_dim**-0.5)])
    probs = g.op("Softmax", [g.op("MatMul", [q, k])], axis=-1)
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, g.ints([1, tokens, dim])])
    x = g.op("Add", [x, linear(g, ctx, w("attn.proj.weight", (dim, dim)), vec("attn.proj.bias", dim))])

    g.scope = "mlp/"
    h = layer_norm(g, x, vec("norm2.weight", dim, 1.0, 0.05), vec("norm2.bias", dim), eps=1e-6)
    h = g.op("Gelu", [linear(g, h, w("mlp.fc1.weight", (dim, mlp)), vec("mlp.fc1.bias", mlp))])
    h = linear(g, h, w("mlp.fc2.weight", (mlp, dim)), vec("mlp.fc2.bias", dim))
    g.output(g.op("Add", [x, h]), "out", [1, tokens, dim])
    model = g.model(20, f"ViT-S/16 pre-norm encoder block ({tokens} tokens, dim {dim}, {heads} heads, MLP {mlp})")
    return model, {"x": normal_input(rng, (1, tokens, dim))}


def build_mobilenetv2_block(rng, c: int = 32, expand: int = 192,
                            hw: int = 56) -> tuple[onnx.ModelProto, Inputs]:
    g = GraphBuilder("mobilenetv2_block")
    x = g.input("x", [1, c, hw, hw])
    lo, hi = g.scalar(0.0), g.scalar(6.0)
    h = conv_bn(g, rng, x, c, expand, 1, "expand")
    h = g.op("Clip", [h, lo, hi])
    h = conv_bn(g, rng, h, expand, expand, 3, "depthwise", group=expand, pads=[1, 1, 1, 1], strides=[1, 1])
    h = g.op("Clip", [h, lo, hi])
    h = conv_bn(g, rng, h, expand, c, 1, "project")
    g.output(g.op("Add", [h, x]), "out", [1, c, hw, hw])
    model = g.model(13, f"MobileNetV2 inverted residual block ({c} -> {expand} -> dw3x3 -> {c}, ReLU6, residual)")
    return model, {"x": normal_input(rng, (1, c, hw, hw))}


def build_conv_bn_relu(rng) -> tuple[onnx.ModelProto, Inputs]:
    g = GraphBuilder("conv_bn_relu")
    x = g.input("x", [1, 16, 32, 32])
    h = g.op("Relu", [conv_bn(g, rng, x, 16, 32, 3, "conv1", pads=[1, 1, 1, 1])])  # [1, 32, 32, 32]
    h = g.op("Relu", [conv_bn(g, rng, h, 32, 32, 3, "conv2", strides=[2, 2], auto_pad="SAME_UPPER")])
    h = g.op("Relu", [conv_bn(g, rng, h, 32, 64, 3, "conv3", pads=[1, 1, 1, 1])])  # [1, 64, 16, 16]
    h = g.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])  # [1, 64, 8, 8]
    h = g.op("Flatten", [g.op("GlobalAveragePool", [h])], axis=1)  # [1, 64]
    fc_w = g.weight("fc.weight", rng.normal(0, 0.1, (10, 64)))
    fc_b = g.weight("fc.bias", rng.normal(0, 0.1, 10))
    g.output(g.op("Gemm", [h, fc_w, fc_b], transB=1), "logits", [1, 10])
    model = g.model(15, "3 x (Conv3x3 + BN + ReLU) 16->32->32->64, MaxPool, GlobalAveragePool, Gemm to 10")
    return model, {"x": normal_input(rng, (1, 16, 32, 32))}


def build_lstm(rng, steps: int = 32, batch: int = 1, n_in: int = 128,
               n_hidden: int = 256) -> tuple[onnx.ModelProto, Inputs]:
    bound = 1.0 / math.sqrt(n_hidden)
    g = GraphBuilder("lstm")
    x = g.input("x", [steps, batch, n_in])
    h0 = g.input("initial_h", [1, batch, n_hidden])
    c0 = g.input("initial_c", [1, batch, n_hidden])
    w = g.weight("lstm.W", rng.uniform(-bound, bound, (1, 4 * n_hidden, n_in)), fp16=True)
    r = g.weight("lstm.R", rng.uniform(-bound, bound, (1, 4 * n_hidden, n_hidden)), fp16=True)
    b = g.weight("lstm.B", rng.uniform(-bound, bound, (1, 8 * n_hidden)))
    y, y_h = g.op("LSTM", [x, w, r, b, "", h0, c0], n_out=2, hidden_size=n_hidden, direction="forward")
    g.output(y, "y", [steps, 1, batch, n_hidden])
    g.output(y_h, "y_h", [1, batch, n_hidden])
    model = g.model(14, f"Single-layer forward LSTM, {steps} steps, batch {batch}, input {n_in}, hidden {n_hidden}")
    inputs = {
        "x": normal_input(rng, (steps, batch, n_in)),
        "initial_h": normal_input(rng, (1, batch, n_hidden), 0.1),
        "initial_c": normal_input(rng, (1, batch, n_hidden), 0.1),
    }
    return model, inputs


def build_nerf_mlp(rng, n: int = 4096, width: int = 256) -> tuple[onnx.ModelProto, Inputs]:
    n_in, depth, skip = 63, 8, 5
    g = GraphBuilder("nerf_mlp")
    x = g.input("x", [n, n_in])
    h, fan_in = x, n_in
    for i in range(depth):
        if i == skip:  # NeRF's skip connection: feed the encoded input back in
            h = g.op("Concat", [h, x], axis=-1)
            fan_in = width + n_in
        wi = g.weight(
            f"layers.{i}.weight", rng.normal(0, math.sqrt(2.0 / fan_in), (fan_in, width)), fp16=True
        )
        bi = g.weight(f"layers.{i}.bias", rng.normal(0, 0.02, width))
        h, fan_in = g.op("Relu", [linear(g, h, wi, bi)]), width
    wo = g.weight("head.weight", rng.normal(0, math.sqrt(1.0 / width), (width, 4)), fp16=True)
    out = linear(g, h, wo, g.weight("head.bias", rng.normal(0, 0.02, 4)))
    axes = g.ints([1])
    rgb = g.op("Sigmoid", [g.op("Slice", [out, g.ints([0]), g.ints([3]), axes])])
    sigma = g.op("Relu", [g.op("Slice", [out, g.ints([3]), g.ints([4]), axes])])
    g.output(g.op("Concat", [rgb, sigma], axis=1), "rgb_sigma", [n, 4])
    model = g.model(
        17, f"NeRF MLP: 8 x Linear({width})+ReLU, skip concat at layer 5, rgb sigmoid / sigma relu head"
    )
    return model, {"x": normal_input(rng, (n, n_in))}


def build_layernorm_residual(rng) -> tuple[onnx.ModelProto, Inputs]:
    rows, dim = 512, 768
    g = GraphBuilder("layernorm_residual")
    x = g.input("x", [rows, dim])
    res = g.input("residual", [rows, dim])
    s = g.op("Add", [x, res])
    mean = g.op("ReduceMean", [s], axes=[-1], keepdims=1)
    d = g.op("Sub", [s, mean])
    var = g.op("ReduceMean", [g.op("Pow", [d, g.scalar(2.0)])], axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, g.scalar(1e-5)])])
    y = g.op("Mul", [g.op("Div", [d, std]), g.weight("gamma", 1.0 + rng.normal(0, 0.1, dim))])
    g.output(g.op("Add", [y, g.weight("beta", rng.normal(0, 0.1, dim))]), "y", [rows, dim])
    model = g.model(
        17, "LayerNorm(x + residual) from elementary ops (ReduceMean/Sub/Pow/Sqrt/Div), [512, 768]"
    )
    return model, {"x": normal_input(rng, (rows, dim)), "residual": normal_input(rng, (rows, dim))}


def build_masked_softmax(rng) -> tuple[onnx.ModelProto, Inputs]:
    shape = [1, 12, 128, 128]
    g = GraphBuilder("masked_softmax")
    scores = g.input("scores", shape)
    mask = g.input("mask", [1, 1, 1, 128], BOOL)
    bias = g.op("Where", [mask, g.scalar(0.0), g.scalar(-1e9)])
    s = g.op("Add", [g.op("Mul", [scores, g.scalar(0.125)]), bias])
    g.output(g.op("Softmax", [s], axis=-1), "probs", shape)
    model = g.model(17, "Scaled attention scores + Where(mask, 0, -1e9) additive mask + Softmax(axis=-1)")
    valid = int(rng.integers(96, 121))
    inputs = {
        "scores": normal_input(rng, shape, 4.0),
        "mask": (np.arange(128) < valid).reshape(1, 1, 1, 128),
    }
    return model, inputs


def build_gelu_chain(rng) -> tuple[onnx.ModelProto, Inputs]:
    rows, dim = 128, 3072
    g = GraphBuilder("gelu_chain")
    x = g.input("x", [rows, dim])
    inner = g.op("Add", [x, g.op("Mul", [g.op("Pow", [x, g.scalar(3.0)]), g.scalar(0.044715)])])
    t = g.op("Tanh", [g.op("Mul", [inner, g.scalar(math.sqrt(2.0 / math.pi))])])
    gelu = g.op("Mul", [g.op("Mul", [g.op("Add", [t, g.scalar(1.0)]), g.scalar(0.5)]), x])
    y = g.op("Add", [gelu, g.weight("bias", rng.normal(0, 0.1, dim))])
    g.output(g.op("Mul", [y, g.weight("scale", rng.uniform(0.5, 1.5, dim))]), "y", [rows, dim])
    model = g.model(
        17, "tanh-approximate GELU from elementary ops on [128, 3072], then bias Add and scale Mul"
    )
    return model, {"x": normal_input(rng, (rows, dim), 2.0)}


def build_pow_broadcast_add(rng, rows: int = 1024, cols: int = 4096) -> tuple[onnx.ModelProto, Inputs]:
    g = GraphBuilder("pow_broadcast_add")
    a = g.input("a", [1, cols])
    x = g.input("x", [rows, cols])
    p = g.op("Pow", [g.op("Abs", [a]), g.scalar(2.5)])
    v = g.op("Exp", [g.op("Neg", [g.op("Sqrt", [g.op("Add", [p, g.scalar(1.0)])])])])  # [1, 4096], costly
    y = g.op("Add", [x, v])  # one-to-many: v is broadcast over 1024 rows
    s = g.op("ReduceSum", [y, g.ints([-1])], keepdims=1)
    g.output(g.op("Div", [y, s]), "out", [rows, cols])
    model = g.model(
        17,
        f"AStitch one-to-many: exp(-sqrt(|a|^2.5 + 1)) [1,{cols}] broadcast-added to [{rows},{cols}], row-normalised",
    )
    # No reference I/O: a [1024, 4096] float32 input plus output is ~32 MB, over the whole samples budget.
    return model, None


def build_bert12(rng) -> tuple[onnx.ModelProto, Inputs]:
    layers = 12
    g = GraphBuilder("bert12")
    x = g.input("hidden", [1, SEQ, HIDDEN])
    mask = g.input("attention_mask", [1, SEQ])
    g.scope = "embeddings_mask/"
    ext = bert_extended_mask(g, mask)
    for i in range(layers):
        prefix = f"encoder.layer.{i}"
        g.scope = prefix + "/"
        p = {key: g.input(f"{prefix}.{key}", shape) for key, shape in BERT_PARAMS}
        x = bert_layer(g, x, ext, p)
    g.output(x, "out", [1, SEQ, HIDDEN])
    model = g.model(17, "12-layer BERT-base encoder, weights as graph inputs (scheduling benchmark)")
    return model, None


@dataclass(frozen=True)
class Sample:
    name: str
    category: str
    seed: int
    build: Callable[[np.random.Generator], tuple[onnx.ModelProto, Inputs]]
    description: str


SAMPLES: list[Sample] = [
    Sample("bert_layer", "whole-model", 1001, build_bert_layer,
           "BERT-base encoder layer as TorchScript exports it: Q/K/V MatMul+Add, reshapes with computed "
           "shapes (Shape/Gather/Unsqueeze/Concat), masked Softmax attention, LayerNormalization, "
           "erf-GELU FFN. seq 128, hidden 768, 12 heads, FFN 3072; fp16-stored weights + Cast."),
    Sample("vit_block", "whole-model", 1002, build_vit_block,
           "ViT-S pre-norm encoder block: LayerNorm, fused QKV MatMul + Split, 6-head attention, "
           "residual, LayerNorm, MLP with the Gelu op (opset 20), residual. 197 tokens, dim 384."),
    Sample("mobilenetv2_block", "whole-model", 1003, build_mobilenetv2_block,
           "MobileNetV2 inverted residual: 1x1 Conv expand 32->192 + BN + ReLU6 (Clip), depthwise 3x3 "
           "Conv + BN + ReLU6, 1x1 Conv project to 32 + BN, residual Add. Input [1,32,56,56]."),
    Sample("conv_bn_relu", "whole-model", 1004, build_conv_bn_relu,
           "3 x (Conv3x3 + BatchNormalization + Relu) 16->32->32->64 (second conv stride 2, SAME_UPPER), "
           "MaxPool 2x2, GlobalAveragePool, Flatten, Gemm to 10 classes. Input [1,16,32,32]."),
    Sample("lstm", "whole-model", 1005, build_lstm,
           "ONNX LSTM op: 32 time steps, batch 1, input 128, hidden 256, forward, with bias and "
           "initial_h/initial_c inputs; outputs Y and Y_h."),
    Sample("nerf_mlp", "whole-model", 1006, build_nerf_mlp,
           "NeRF MLP on 4096 encoded points [4096,63]: 8 x (MatMul+Add+Relu) width 256 with the input "
           "concatenated back in at layer 5, head to 4 channels, Sigmoid(rgb) / Relu(sigma) via Slice+Concat."),
    Sample("layernorm_residual", "memory-intensive", 1007, build_layernorm_residual,
           "LayerNorm(x + residual) written with elementary ops (ReduceMean, Sub, Pow, ReduceMean, Add eps, "
           "Sqrt, Div, Mul gamma, Add beta) on [512,768]."),
    Sample("masked_softmax", "memory-intensive", 1008, build_masked_softmax,
           "Attention scores [1,12,128,128] * 0.125 + Where(bool mask [1,1,1,128], 0, -1e9), Softmax(axis=-1)."),
    Sample("gelu_chain", "memory-intensive", 1009, build_gelu_chain,
           "tanh-approximate GELU from elementary ops (Pow, Mul, Add, Tanh) on [128,3072], then a bias Add "
           "and a per-column scale Mul."),
    Sample("pow_broadcast_add", "memory-intensive", 1010, build_pow_broadcast_add,
           "AStitch one-to-many: an expensive elementwise chain (Abs, Pow 2.5, Add, Sqrt, Neg, Exp) on [1,4096] "
           "broadcast-Added to [1024,4096], then ReduceSum(last axis, keepdims) and a broadcast Div. "
           "No stored I/O (it would be ~32 MB)."),
    Sample("bert12", "scale", 1011, build_bert12,
           "12-layer BERT-base encoder (same layer as bert_layer), all weights as graph inputs so the file "
           "stays tiny; for scheduling benchmarks."),
]  # fmt: skip


# Small variants: the same graphs at shapes the SIMT emulator (`--backend cuda-sim`) runs in seconds,
# keeping tails (sizes that are not multiples of the tiles). Built on demand by the tests; never written.
SMALL: dict[str, Callable[[np.random.Generator], tuple[onnx.ModelProto, Inputs]]] = {
    "bert_layer": lambda rng: build_bert_layer(rng, seq=40, hidden=128, heads=2, ffn=256),
    "vit_block": lambda rng: build_vit_block(rng, tokens=29, dim=64, heads=2, mlp=128),
    "mobilenetv2_block": lambda rng: build_mobilenetv2_block(rng, c=8, expand=48, hw=10),
    "nerf_mlp": lambda rng: build_nerf_mlp(rng, n=200, width=64),
    "lstm": lambda rng: build_lstm(rng, steps=6, n_in=48, n_hidden=64),
    "pow_broadcast_add": lambda rng: build_pow_broadcast_add(rng, rows=96, cols=1000),
}


def build_small(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The small variant of sample `name` (SMALL) and inputs for it, from the sample's own seed."""
    sample = next(s for s in SAMPLES if s.name == name)
    rng = np.random.default_rng(sample.seed)
    model, inputs = SMALL[name](rng)
    if inputs is None:
        inputs = {i.name: normal_input(rng, [d.dim_value for d in i.type.tensor_type.shape.dim])
                  for i in model.graph.input}
    return model, inputs


# --------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------


def build(sample: Sample) -> tuple[onnx.ModelProto, Inputs]:
    return sample.build(np.random.default_rng(sample.seed))


def model_opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def run_reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs), strict=True))


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Like ``np.savez_compressed`` but with fixed zip metadata, so the bytes are reproducible."""
    with zipfile.ZipFile(path, "w") as zf:
        for key, value in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue(), compresslevel=9)


def main(out_dir: Path = SAMPLES_DIR) -> None:
    catalog = []
    for sample in SAMPLES:
        model, inputs = build(sample)
        onnx_file = f"{sample.name}.onnx"
        (out_dir / onnx_file).write_bytes(model.SerializeToString())
        io_file = None
        if inputs is not None:
            outputs = run_reference(model, inputs)
            io_file = f"{sample.name}.io.npz"
            write_npz(out_dir / io_file, {**inputs, **outputs})
        entry = {
            "name": sample.name,
            "file": onnx_file,
            "io": io_file,
            "description": sample.description,
            "category": sample.category,
            "opset": model_opset(model),
        }
        if sample.name == "bert_layer":
            entry["default"] = True
        catalog.append(entry)
        size = (out_dir / onnx_file).stat().st_size + ((out_dir / io_file).stat().st_size if io_file else 0)
        print(f"{sample.name:20s} opset {entry['opset']:2d}  {size / 1e6:6.2f} MB", file=sys.stderr)
    (out_dir / "catalog.json").write_text(json.dumps(catalog, indent=2) + "\n")


if __name__ == "__main__":
    main()
