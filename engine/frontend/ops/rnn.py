"""LSTM unrolled over its (static) sequence into primitives: one batched input projection per
direction (X @ Wᵀ for all steps), then per step a recurrent contraction (h_{t-1} @ Rᵀ), a cell stage
(c_t from the i, f, g gates) and a hidden stage (h_t from the o gate); Y, Y_h, Y_c gather the steps."""

from __future__ import annotations

from dataclasses import dataclass

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.graph import Combine, StageKind

GATES = {"i": 0, "o": 1, "f": 2, "c": 3}  # ONNX packs W/R/B rows as i, o, f, c
PEEPHOLES = {"i": 0, "o": 1, "f": 2}


@dataclass(frozen=True)
class _Lstm:
    """What every step of one direction reads."""

    d: int
    hidden: int
    xw: str  # [seq * batch, 4H] input projection (row t * batch + b)
    w_r: str
    bias: str | None
    peep: str | None
    clip: float | None
    acts: tuple[str, str, str]
    dtype: DType
    batch: int


def _activate(name: str, x: E.Expr, ctx: LowerCtx) -> E.Expr:
    if name == "Sigmoid":
        return E.unary("sigmoid", x)
    if name == "Tanh":
        return E.unary("tanh", x)
    if name == "Relu":
        return E.binary("max", x, E.imm(0, x.dtype))
    raise ctx.unsupported(f"activation {name}")


def _gate(ctx: LowerCtx, p: _Lstm, g: str, t: int, hr: str | None, c: E.Expr | None) -> E.Expr:
    """Pre-activation of gate g at step t over the (batch=i0, hidden=i1) grid."""
    b, h = I.out_vars(2)
    row = h + GATES[g] * p.hidden
    x = ctx.load(p.xw, (b + t * p.batch, row))
    if hr is not None:
        x = E.add(x, ctx.load(hr, (b, row)))
    if p.bias is not None:
        x = E.add(x, E.add(ctx.load(p.bias, (I.const(p.d), row)),
                           ctx.load(p.bias, (I.const(p.d), row + 4 * p.hidden))))
    if p.peep is not None and c is not None and g in PEEPHOLES:
        x = E.add(x, E.mul(ctx.load(p.peep, (I.const(p.d), h + PEEPHOLES[g] * p.hidden)), c))
    if p.clip is not None:
        x = E.binary("min", E.binary("max", x, E.imm(-p.clip, p.dtype)), E.imm(p.clip, p.dtype))
    return x


def _direction(ctx: LowerCtx, node: OnnxNode, p: _Lstm, steps: list[int], batch: int, h0, c0,
               out: str) -> tuple[dict[int, str], dict[int, str]]:
    """Emit the steps of one direction in execution order; returns step -> h stage, c stage."""
    hs, cs = {}, {}
    b, h = I.out_vars(2)
    r = I.var("r0")
    h_prev, c_prev = h0, c0  # loads over (b, k) / (b, h), or None for zeros
    H = p.hidden
    for t in steps:
        tag = f"d{p.d}.t{t}"
        hr = None
        if h_prev is not None:
            body = E.mul(h_prev(b, r), ctx.load(p.w_r, (I.const(p.d), h, r)))
            hr = ctx.emit(ctx.tmp(out, f"{tag}.hr"), (batch, 4 * H), p.dtype, body,
                          kind=StageKind.CONTRACTION, op="lstm.recurrent", reduce=(H,), combine=Combine.SUM)
        cp = c_prev(b, h) if c_prev is not None else None
        f_act, g_act, h_act = p.acts
        i_g = _activate(f_act, _gate(ctx, p, "i", t, hr, cp), ctx)
        g_g = _activate(g_act, _gate(ctx, p, "c", t, hr, None), ctx)
        cell = E.mul(i_g, g_g)
        if cp is not None:
            f_g = _activate(f_act, _gate(ctx, p, "f", t, hr, cp), ctx)
            cell = E.add(E.mul(f_g, cp), cell)
        c_name = ctx.elementwise(ctx.tmp(out, f"{tag}.c"), (batch, H), p.dtype, cell, op="lstm.cell")
        c_new = ctx.load(c_name, (b, h))
        o_g = _activate(f_act, _gate(ctx, p, "o", t, hr, c_new), ctx)
        h_name = ctx.elementwise(ctx.tmp(out, f"{tag}.h"), (batch, H), p.dtype,
                                 E.mul(o_g, _activate(h_act, c_new, ctx)), op="lstm.hidden")
        hs[t], cs[t] = h_name, c_name
        h_prev = (lambda hn: lambda bb, kk: ctx.load(hn, (bb, kk)))(h_name)
        c_prev = (lambda cn: lambda bb, kk: ctx.load(cn, (bb, kk)))(c_name)
    return hs, cs


def _pick(choices: list[tuple[list[tuple[I.Lin, int]], E.Expr]]) -> E.Expr:
    """Select chain: the value whose index conditions (var == k for each pair) hold."""
    body = choices[-1][1]
    for conds, value in reversed(choices[:-1]):
        cond = None
        for v, k in conds:
            c = E.binary("eq", E.index_val(v), E.imm(k, DType.I64))
            cond = c if cond is None else E.binary("and", cond, c)
        body = E.select(cond, value, body)
    return body


@register("LSTM")
def convert_lstm(ctx: LowerCtx, node: OnnxNode) -> None:
    x, w, r = node.inputs[:3]
    inp = list(node.inputs) + [""] * 8
    layout = int(ctx.attr(node, "layout", 0))
    xs = ctx.shape(x)
    seq, batch = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    ndir, four_h, isz = ctx.shape(w)
    H = int(ctx.attr(node, "hidden_size", four_h // 4))
    direction = ctx.attr(node, "direction", "forward")
    if int(ctx.attr(node, "input_forget", 0)):
        raise ctx.unsupported("input_forget=1")
    if ctx.has(node, 4):
        lens = ctx.require_const(inp[4], "sequence_lens")
        if (lens != seq).any():
            raise ctx.unsupported("sequence_lens shorter than the sequence")
    acts = list(ctx.attr(node, "activations", ["Sigmoid", "Tanh", "Tanh"] * ndir))
    clip = ctx.attr(node, "clip", None)
    dt = ctx.dtype(x)
    out = next(o for o in node.outputs if o)
    rv = I.var("r0")
    hs_all, cs_all = {}, {}
    for d in range(ndir):
        # The input projection of every step at once, as one (seq * batch) x 4H GEMM (row t * batch
        # + b): a 2-D contraction tiles as a GEMM, a (seq, batch, 4H) one as seq products of a
        # batch-row matrix (one-row dot products at batch 1).
        j, g = I.out_vars(2)
        step, row = (I.floordiv(j, batch), I.mod(j, batch)) if batch > 1 else (j, I.const(0))
        xidx = (step, row, rv) if layout == 0 else (row, step, rv)
        xw = ctx.emit(ctx.tmp(out, f"d{d}.xw"), (seq * batch, 4 * H), dt,
                      E.mul(ctx.load(x, xidx), ctx.load(w, (I.const(d), g, rv))),
                      kind=StageKind.CONTRACTION, op="lstm.input", reduce=(isz,), combine=Combine.SUM)
        p = _Lstm(d, H, xw, r, inp[3] or None, inp[7] or None, None if clip is None else float(clip),
                  tuple(acts[3 * d:3 * d + 3]), dt, batch)

        def init(name: str, d: int = d):
            if not name:
                return None
            return lambda bb, kk: ctx.load(name, (I.const(d), bb, kk) if layout == 0 else (bb, I.const(d), kk))

        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        steps = list(range(seq))[::-1] if reverse else list(range(seq))
        hs, cs = _direction(ctx, node, p, steps, batch, init(inp[5]), init(inp[6]), out)
        hs_all[d], cs_all[d] = (hs, cs, steps[-1]), cs
    outs = list(node.outputs) + ["", "", ""]
    if outs[0]:
        v = I.out_vars(4)
        t_var, d_var, bvar, hvar = (v[0], v[1], v[2], v[3]) if layout == 0 else (v[1], v[2], v[0], v[3])
        choices = [([(t_var, t), (d_var, d)], ctx.load(hs_all[d][0][t], (bvar, hvar)))
                   for d in range(ndir) for t in range(seq)]
        shape = (seq, ndir, batch, H) if layout == 0 else (batch, seq, ndir, H)
        ctx.emit(outs[0], shape, dt, _pick(choices), kind=StageKind.LAYOUT, op="lstm.y")
    for k, table in ((1, {d: hs_all[d][0] for d in hs_all}), (2, cs_all)):
        if outs[k]:
            v = I.out_vars(3)
            d_var, bvar, hvar = (v[0], v[1], v[2]) if layout == 0 else (v[1], v[0], v[2])
            choices = [([(d_var, d)], ctx.load(table[d][hs_all[d][2]], (bvar, hvar))) for d in range(ndir)]
            shape = (ndir, batch, H) if layout == 0 else (batch, ndir, H)
            ctx.emit(outs[k], shape, dt, _pick(choices), kind=StageKind.LAYOUT, op="lstm.state")
