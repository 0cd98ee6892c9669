"""The transformer ops of opset 23 and later, as torch's exporter writes them for
`scaled_dot_product_attention`, RMSNorm and rotary position embeddings: Attention (23-25), RMSNormalization
and RotaryEmbedding, lowered to the stages the rest of the frontend emits (contractions, reductions,
elementwise and layout stages), so the scheduler fuses and tiles them like their decomposed forms.

Attention keeps 3-D inputs ([batch, seq, heads x head_size]) in place: its stages read them through
index maps, no transpose stage. The masks (attn_mask, is_causal, the sliding window, nonpad_kv_seqlen)
become one select in the logits' epilogue, and the softmax is the guarded one the reference uses: a
row every key of which is masked gives zeros, not NaN."""

from __future__ import annotations

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.frontend.ops.nn import softmax_into
from engine.frontend.ops.reduce import reduce_into
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, StageKind

_NEG_INF = float("-inf")


@register("RMSNormalization")
def convert_rms_norm(ctx: LowerCtx, node: OnnxNode) -> None:
    """y = x / sqrt(mean(x^2 over axes axis..rank-1) + epsilon) * scale (scale broadcast)."""
    x, scale = node.inputs[0], node.inputs[1]
    shape = ctx.shape(x)
    rank = len(shape)
    axis = ctx.axis(node, rank, -1)
    if int(ctx.attr(node, "stash_type", 1)) != 1:
        raise ctx.unsupported("stash_type other than float32")
    dt = ctx.dtype(x)
    axes = tuple(range(axis, rank))
    count = 1
    for a in axes:
        count *= shape[a]
    inv = E.imm(1.0 / count, dt)
    out = node.outputs[0]
    ms = reduce_into(ctx, ctx.tmp(out, "meansq"), x, axes, True, Combine.SUM,
                     body_fn=lambda v: E.mul(E.mul(v, v), inv), op="rmsnorm.meansq")
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    y = E.mul(ctx.bload(x, shape), E.unary("rsqrt", E.add(ctx.bload(ms, shape), E.imm(eps, dt))))
    ctx.elementwise(out, shape, dt, E.mul(y, ctx.bload(scale, shape)), op="rmsnorm")


@register("RotaryEmbedding")
def convert_rotary_embedding(ctx: LowerCtx, node: OnnxNode) -> None:
    """Rotates the first rotary_embedding_dim features of each head by the cached cos/sin of its position:
    halves (x[k], x[k + d/2]) or, interleaved, pairs (x[2k], x[2k + 1]). One elementwise stage; the caches
    are read through position_ids where given (a gather), else per [batch, seq]."""
    x, cos, sin = node.inputs[0], node.inputs[1], node.inputs[2]
    pos = node.inputs[3] if ctx.has(node, 3) else None
    shape = ctx.shape(x)
    if len(shape) == 4:
        head = shape[3]
    elif len(shape) == 3:
        heads = int(ctx.attr(node, "num_heads", 0))
        if heads <= 0 or shape[2] % heads:
            raise ctx.unsupported(f"a 3-D input of shape {list(shape)} without num_heads dividing its last axis")
        head = shape[2] // heads
    else:
        raise ctx.unsupported(f"an input of rank {len(shape)} (3 or 4 expected)")
    rot = int(ctx.attr(node, "rotary_embedding_dim", 0)) or head
    if rot > head or rot % 2:
        raise ctx.unsupported(f"rotary_embedding_dim {rot} with head size {head} (an even size up to it)")
    half = rot // 2
    if ctx.shape(cos)[-1] != half or ctx.shape(sin)[-1] != half:
        raise ctx.unsupported(f"cos/sin caches of last axis {ctx.shape(cos)[-1]} (rotary_embedding_dim / 2 = {half})")
    iv = I.out_vars(len(shape))
    ranges = {f"i{k}": (0, n - 1) for k, n in enumerate(shape)}
    b = iv[0]
    if len(shape) == 4:
        s, d = iv[2], iv[3]
        lane = lambda e: (iv[0], iv[1], iv[2], e)  # noqa: E731  (the feature axis replaced)
    else:
        s, d = iv[1], I.mod(iv[2], head, ranges)
        lane = lambda e: (iv[0], iv[1], iv[2] - d + e)  # noqa: E731
    interleaved = bool(int(ctx.attr(node, "interleaved", 0)))
    if interleaved:
        k = I.mod(I.floordiv(d, 2, ranges), half, ranges)
        partner = d + 1 - I.mod(d, 2, ranges) * 2
        first = E.binary("eq", E.index_val(I.mod(d, 2, ranges)), E.imm(0, DType.I64))
    else:
        k = I.mod(d, half, ranges)
        partner = I.mod(d + half, rot, ranges)
        first = E.binary("lt", E.index_val(I.mod(d, rot, ranges)), E.imm(half, DType.I64))
    if pos is not None:
        row = I.as_lin(I.Indirect(ctx.resolve(pos), (b, s), ctx.shape(cos)[0]))
        ci = (row, k)
    else:
        ci = (b, s, k)
    dt = ctx.dtype(x)
    xs = ctx.load(x, lane(d))
    turned = E.mul(ctx.load(sin, ci), ctx.load(x, lane(partner)))
    rotated = E.add(E.mul(ctx.load(cos, ci), xs), E.select(first, E.unary("neg", turned), turned))
    body = rotated if rot == head else E.select(
        E.binary("lt", E.index_val(d), E.imm(rot, DType.I64)), rotated, xs)
    ctx.elementwise(node.outputs[0], shape, dt, body, op="rotary")


class _Heads:
    """One of Attention's Q, K, V (or a past/present cache) read as [batch, heads, seq, head_size]: a 4-D
    tensor as it is, a 3-D one ([batch, seq, heads x head_size]) through its index map."""

    def __init__(self, ctx: LowerCtx, name: str, heads: int | None):
        self.ctx, self.name = ctx, name
        shape = ctx.shape(name)
        self.flat = len(shape) == 3
        if self.flat:
            if not heads or shape[2] % heads:
                raise ctx.unsupported(f"3-D input '{name}' of shape {list(shape)}: q_num_heads/kv_num_heads must "
                                      "be given and divide its last axis")
            self.shape4 = (shape[0], heads, shape[1], shape[2] // heads)
        elif len(shape) == 4:
            self.shape4 = tuple(shape)
        else:
            raise ctx.unsupported(f"input '{name}' of rank {len(shape)} (3 or 4 expected)")

    def load(self, b, h, s, d) -> E.Expr:
        if self.flat:
            return self.ctx.load(self.name, (b, s, h * self.shape4[3] + d))
        return self.ctx.load(self.name, (b, h, s, d))


def _present(ctx: LowerCtx, out: str, new: _Heads, past: str | None) -> _Heads:
    """The cache after this step, [batch, kv_heads, past + new, head_size]: past and new concatenated along
    the sequence, or the new keys in 4-D form; a stage when the node outputs it or there is a past."""
    if not out and past is None:
        return new
    name = out or ctx.tmp(new.name, "present")
    iv = I.out_vars(4)
    b, h, t, d = iv
    if past is None:
        body = new.load(b, h, t, d)
        shape = new.shape4
    else:
        pshape = ctx.shape(past)
        if len(pshape) != 4 or pshape[0] != new.shape4[0] or pshape[1] != new.shape4[1] or pshape[3] != new.shape4[3]:
            raise ctx.unsupported(f"past cache '{past}' of shape {list(pshape)} with new keys/values of "
                                  f"{list(new.shape4)}")
        p = pshape[2]
        shape = (new.shape4[0], new.shape4[1], p + new.shape4[2], new.shape4[3])
        dt = ctx.dtype(past)
        old = ctx.load(past, (b, h, t, d), pad=E.imm(0, dt).value)
        fresh = ctx.load(new.name, (b, t - p, h * new.shape4[3] + d) if new.flat else (b, h, t - p, d),
                         pad=E.imm(0, dt).value)
        body = E.select(E.binary("lt", E.index_val(t), E.imm(p, DType.I64)), old, fresh)
    ctx.emit(name, shape, ctx.dtype(new.name), body, kind=StageKind.LAYOUT, op="attention.present")
    return _Heads(ctx, name, None)


@register("Attention")
def convert_attention(ctx: LowerCtx, node: OnnxNode) -> None:
    """softmax(softcap(Q K^T * scale) + bias) V over [batch, heads, seq, head_size], with grouped-query heads
    (each KV head serves q_heads / kv_heads query heads), a past KV cache (present = past ++ new), and the
    bias from attn_mask (additive, or boolean: False masks; padded with masked keys where shorter than the
    keys), is_causal (a query attends keys up to its own position, offset by the past or by
    nonpad_kv_seqlen), the sliding window and nonpad_kv_seqlen (keys past a batch's length masked).
    qk_matmul_output_mode 0-3 selects which logits the fourth output holds; softmax_precision the dtype the
    softmax runs in."""
    q_in, k_in, v_in = node.inputs[:3]
    opt = lambda k: node.inputs[k] if ctx.has(node, k) else None  # noqa: E731
    mask, past_k, past_v, nonpad = opt(3), opt(4), opt(5), opt(6)
    if (past_k is None) != (past_v is None):
        raise ctx.unsupported("past_key without past_value (or the reverse)")
    if nonpad is not None and past_k is not None:
        raise ctx.unsupported("nonpad_kv_seqlen together with a past cache")
    qh = int(ctx.attr(node, "q_num_heads", 0)) or None
    kvh = int(ctx.attr(node, "kv_num_heads", 0)) or None
    q, k, v = _Heads(ctx, q_in, qh), _Heads(ctx, k_in, kvh), _Heads(ctx, v_in, kvh)
    outs = list(node.outputs) + ["", "", ""]
    k = _present(ctx, outs[1], k, past_k)
    v = _present(ctx, outs[2], v, past_v)
    bsz, hq, sq, dh = q.shape4
    _, hk, total, dk = k.shape4
    dv = v.shape4[3]
    if dk != dh or v.shape4[2] != total or v.shape4[1] != hk or k.shape4[0] != bsz:
        raise ctx.unsupported(f"Q {list(q.shape4)}, K {list(k.shape4)} and V {list(v.shape4)} that do not match")
    if hq % hk:
        raise ctx.unsupported(f"{hq} query heads over {hk} key/value heads (a multiple expected)")
    rep = hq // hk
    dt = ctx.dtype(q_in)
    scale = ctx.attr(node, "scale", None)
    scale = float(scale) if scale is not None else 1.0 / dh ** 0.5
    softcap = float(ctx.attr(node, "softcap", 0.0) or 0.0)
    mode = int(ctx.attr(node, "qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise ctx.unsupported(f"qk_matmul_output_mode {mode} (0-3)")
    left = int(ctx.attr(node, "left_window_size", -1))
    right = int(ctx.attr(node, "right_window_size", -1))
    out = outs[0]
    shape = (bsz, hq, sq, total)
    iv = I.out_vars(4)
    ranges = {f"i{j}": (0, n - 1) for j, n in enumerate(shape)}
    b, h, i, j = iv
    kvhead = I.floordiv(h, rep, ranges) if rep > 1 else h
    r = I.var("r0")
    qr, kr = q.load(b, h, i, r), k.load(b, kvhead, j, r)
    if dt != DType.F32:
        # Low precision rounds as the reference does: each operand scaled by sqrt(scale) before the product.
        root = E.imm(scale ** 0.5, dt)
        qr, kr = E.mul(qr, root), E.mul(kr, root)
    scores = ctx.emit(ctx.tmp(out, "qk"), shape, dt, E.mul(qr, kr),
                      kind=StageKind.CONTRACTION, op="attention.qk", reduce=(dh,), combine=Combine.SUM)
    x = ctx.load(scores, iv) if dt != DType.F32 else E.mul(ctx.load(scores, iv), E.imm(scale, dt))
    if softcap > 0:
        x = E.mul(E.unary("tanh", E.div(x, E.imm(softcap, dt))), E.imm(softcap, dt))
    capped = x
    x, keep = _masked(ctx, x, iv, shape, mask, bool(int(ctx.attr(node, "is_causal", 0))), left, right, nonpad,
                      ctx.shape(past_k)[2] if past_k is not None else 0)
    if keep is not None:
        x = E.select(keep, x, E.imm(_NEG_INF, dt))
    # softmax_precision: the biased logits cast to it for the softmax, the probabilities cast back (reference).
    sdt = _precision(ctx, node, dt)
    logits = ctx.elementwise(ctx.tmp(out, "logits"), shape, sdt, E.cast(x, sdt), op="attention.logits")
    probs = softmax_into(ctx, ctx.tmp(out, "probs") if mode != 3 or not outs[3] else outs[3], logits, len(shape) - 1,
                         guarded=True, out_dtype=dt)
    if outs[3] and mode in (0, 1):
        ctx.elementwise(outs[3], shape, dt, capped, op="attention.qk_out")
    elif outs[3] and mode == 2:
        ctx.elementwise(outs[3], shape, dt, x if sdt != dt else ctx.load(logits, iv), op="attention.qk_out")
    yshape = (bsz, hq, sq, dv)
    yv = I.out_vars(4)
    yranges = {f"i{n}": (0, m - 1) for n, m in enumerate(yshape)}
    ykv = I.floordiv(yv[1], rep, yranges) if rep > 1 else yv[1]
    pv = E.mul(ctx.load(probs, (yv[0], yv[1], yv[2], r)), v.load(yv[0], ykv, r, yv[3]))
    if not q.flat:
        ctx.emit(out, yshape, dt, pv, kind=StageKind.CONTRACTION, op="attention.pv", reduce=(total,),
                 combine=Combine.SUM)
        return
    y4 = ctx.emit(ctx.tmp(out, "pv"), yshape, dt, pv, kind=StageKind.CONTRACTION, op="attention.pv",
                  reduce=(total,), combine=Combine.SUM)
    o = I.out_vars(3)
    oranges = {"i0": (0, bsz - 1), "i1": (0, sq - 1), "i2": (0, hq * dv - 1)}
    index = (o[0], I.floordiv(o[2], dv, oranges), o[1], I.mod(o[2], dv, oranges))
    ctx.emit(out, (bsz, sq, hq * dv), dt, ctx.load(y4, index), kind=StageKind.LAYOUT, op="attention.merge_heads")


def _masked(ctx: LowerCtx, x: E.Expr, iv, shape, mask: str | None, causal: bool, left: int, right: int,
            nonpad: str | None, past: int):
    """(logits with an additive mask added, the condition a key is kept under or None): a boolean attn_mask,
    the causal frontier, the window and the padding as one condition; a float mask added."""
    b, h, i, j = iv
    keep: list[E.Expr] = []
    if mask is not None:
        mshape = ctx.shape(mask)
        if len(mshape) > 4 or len(mshape) < 1:
            raise ctx.unsupported(f"attn_mask of rank {len(mshape)}")
        index = []
        for n, var in zip(mshape, iv[4 - len(mshape):]):
            full = shape[iv.index(var)]
            if var is j:
                if n > full:
                    raise ctx.unsupported(f"attn_mask of {n} keys for {full} keys")
                index.append(j)
            elif n == full:
                index.append(var)
            elif n == 1:
                index.append(I.const(0))
            else:
                raise ctx.unsupported(f"attn_mask of shape {list(mshape)} against logits of {list(shape)}")
        mdt = ctx.dtype(mask)
        short = mshape[-1] < shape[3]
        if mdt == DType.BOOL:
            keep.append(ctx.load(mask, tuple(index), pad=False if short else None))
        else:
            x = E.add(x, E.cast(ctx.load(mask, tuple(index), pad=_NEG_INF if short else None), x.dtype))
    # The frontier of each query: keys up to its position plus the offset (the past, or the batch's
    # valid keys less the queries), and the window around it.
    sq = shape[2]
    if nonpad is not None:
        length = E.cast(ctx.load(nonpad, (b,)), DType.I64)
        keep.append(E.binary("lt", E.index_val(j), length))
        # j - i + sq <= length  <=>  j <= i + (length - sq)
        ahead = lambda lin: E.index_val(lin + sq)  # noqa: E731
        offset_le = lambda lin: E.binary("le", ahead(lin), length)  # noqa: E731  (lin <= offset)
    else:
        offset_le = lambda lin: E.binary("le", E.index_val(lin), E.imm(past, DType.I64))  # noqa: E731
    if causal:
        keep.append(offset_le(j - i))
    if left >= 0:  # i + offset - j <= left  <=>  not (j - i + left + 1 <= offset)
        keep.append(E.unary("not", offset_le(j - i + left + 1)))
    if right >= 0:  # j - i - offset <= right  <=>  j - i - right <= offset
        keep.append(offset_le(j - i - right))
    if not keep:
        return x, None
    cond = keep[0]
    for c in keep[1:]:
        cond = E.binary("and", cond, c)
    return x, cond


def _precision(ctx: LowerCtx, node: OnnxNode, dt: DType) -> DType:
    """The softmax's dtype: softmax_precision where given (a float type), else the inputs'."""
    code = ctx.attr(node, "softmax_precision", None)
    if code is None:
        return dt
    from engine.frontend.importer import dtype_of_onnx

    sdt = dtype_of_onnx(int(code))
    if not sdt.is_float:
        raise ctx.unsupported(f"softmax_precision {int(code)} ({sdt.value}; a float type expected)")
    return sdt
