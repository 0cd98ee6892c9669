"""A corpus of reduction chains as real exporters write them (onnx.helper, fixed seeds): a transformer
MLP, a ConvNeXt block, Swin window attention, softmax → MatMul, and a GEMM → GEMM chain. Each builder
returns (model, inputs, reduction extents of the chain) — the extents bound the work one output element
may cost when every value is computed once."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


class _Graph:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def weight(self, shape, scale: float = 0.2) -> str:
        name = f"w{len(self.inits)}"
        value = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def const(self, value, dtype=np.int64) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op: str, *inputs: str, **attrs) -> str:
        self.n += 1
        out = f"{op.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=f"{op}_{self.n}", **attrs))
        return out

    def layer_norm(self, x: str, dim: int) -> str:
        return self.op("LayerNormalization", x, self.weight((dim,), 1.0), self.weight((dim,)), axis=-1,
                       epsilon=1e-5)

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        return self.op("Add", self.op("MatMul", x, self.weight((n_in, n_out), n_in ** -0.5)),
                       self.weight((n_out,)))

    def gelu(self, x: str, op: bool = False) -> str:
        """Exact GELU: the Gelu op (opset 20), or as torch's TorchScript exporter writes it:
        x * 0.5 * (1 + erf(x / sqrt 2))."""
        if op:
            return self.op("Gelu", x)
        erf = self.op("Erf", self.op("Div", x, self.const(np.float32(2 ** 0.5), np.float32)))
        half = self.op("Mul", x, self.const(np.float32(0.5), np.float32))
        return self.op("Mul", half, self.op("Add", erf, self.const(np.float32(1.0), np.float32)))

    def model(self, name: str, inputs: dict[str, np.ndarray], out: str, out_shape, opset: int = 17) -> onnx.ModelProto:
        g = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info(k, FLOAT, list(v.shape)) for k, v in inputs.items()],
            [helper.make_tensor_value_info(out, FLOAT, list(out_shape))], self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def transformer_mlp(tokens: int = 64, dim: int = 48, hidden: int = 192):
    """LayerNorm → MatMul → GELU (the opset-20 op) → MatMul → Add (residual) → LayerNorm."""
    g = _Graph(1)
    x = "x"
    h = g.linear(g.gelu(g.linear(g.layer_norm(x, dim), dim, hidden), op=True), hidden, dim)
    y = g.layer_norm(g.op("Add", h, x), dim)
    inputs = {"x": g.rng.standard_normal((tokens, dim)).astype(np.float32)}
    return g.model("transformer_mlp", inputs, y, (tokens, dim), opset=20), inputs, \
        (dim, dim, dim, hidden, dim, dim)


def convnext_block(channels: int = 32, size: int = 14):
    """Depthwise 7x7 Conv → LayerNorm over channels (NHWC) → MLP (4x) → layer scale → residual."""
    g = _Graph(2)
    c = channels
    dw = g.op("Conv", "x", g.weight((c, 1, 7, 7), 0.1), g.weight((c,)), group=c, kernel_shape=[7, 7],
              pads=[3, 3, 3, 3])
    nhwc = g.op("Transpose", dw, perm=[0, 2, 3, 1])
    h = g.linear(g.gelu(g.linear(g.layer_norm(nhwc, c), c, 4 * c)), 4 * c, c)
    scaled = g.op("Mul", h, g.weight((c,), 0.5))
    y = g.op("Add", "x", g.op("Transpose", scaled, perm=[0, 3, 1, 2]))
    inputs = {"x": g.rng.standard_normal((1, c, size, size)).astype(np.float32)}
    return g.model("convnext_block", inputs, y, (1, c, size, size)), inputs, (49, c, c, c, 4 * c)


def swin_window_attention(size: int = 8, window: int = 4, dim: int = 32, heads: int = 2):
    """Window partition → attention (QKV, scaled scores + relative bias, softmax, @V, projection) →
    window reverse → residual."""
    g = _Graph(3)
    n, ws, hd = size // window, window, dim // heads
    tokens = ws * ws
    xs = g.op("Reshape", "x", g.const([1, n, ws, n, ws, dim]))
    win = g.op("Reshape", g.op("Transpose", xs, perm=[0, 1, 3, 2, 4, 5]), g.const([n * n, tokens, dim]))
    qkv = g.linear(win, dim, 3 * dim)
    qkv = g.op("Transpose", g.op("Reshape", qkv, g.const([n * n, tokens, 3, heads, hd])), perm=[2, 0, 3, 1, 4])
    q, k, v = (g.op("Gather", qkv, g.const(i), axis=0) for i in range(3))
    scores = g.op("MatMul", g.op("Mul", q, g.const(np.float32(hd ** -0.5), np.float32)),
                  g.op("Transpose", k, perm=[0, 1, 3, 2]))
    scores = g.op("Add", scores, g.weight((heads, tokens, tokens), 0.5))
    attn = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    merged = g.op("Reshape", g.op("Transpose", attn, perm=[0, 2, 1, 3]), g.const([n * n, tokens, dim]))
    proj = g.linear(merged, dim, dim)
    back = g.op("Reshape", proj, g.const([1, n, n, ws, ws, dim]))
    back = g.op("Reshape", g.op("Transpose", back, perm=[0, 1, 3, 2, 4, 5]), g.const([1, size * size, dim]))
    y = g.op("Add", "x", back)
    inputs = {"x": g.rng.standard_normal((1, size * size, dim)).astype(np.float32)}
    return g.model("swin_window_attention", inputs, y, (1, size * size, dim)), inputs, \
        (dim, hd, tokens, tokens, tokens, dim)


def softmax_matmul(rows: int = 64, keys: int = 96, dim: int = 40):
    """Softmax over keys → MatMul with the values."""
    g = _Graph(4)
    y = g.op("MatMul", g.op("Softmax", "x", axis=-1), g.weight((keys, dim), 1.0))
    inputs = {"x": g.rng.standard_normal((2, rows, keys)).astype(np.float32)}
    return g.model("softmax_matmul", inputs, y, (2, rows, dim)), inputs, (keys, keys, keys)


def gemm_chain(rows: int = 64, widths: tuple[int, ...] = (48, 96, 64, 32)):
    """GEMM → ReLU → GEMM → ReLU → GEMM (NeRF-style MLP)."""
    g = _Graph(5)
    h = "x"
    for k, (a, b) in enumerate(zip(widths, widths[1:])):
        h = g.linear(h, a, b)
        if k < len(widths) - 2:
            h = g.op("Relu", h)
    inputs = {"x": g.rng.standard_normal((rows, widths[0])).astype(np.float32)}
    return g.model("gemm_chain", inputs, h, (rows, widths[-1])), inputs, tuple(widths[:-1])


CHAINS = {f.__name__: f for f in (transformer_mlp, convnext_block, swin_window_attention, softmax_matmul,
                                  gemm_chain)}
