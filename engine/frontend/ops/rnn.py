"""LSTM, GRU and RNN unrolled over their (static) sequence into primitives: one batched input projection
per direction (X @ Wᵀ for all steps), then per step a recurrent contraction (h_{t-1} @ Rᵀ) and the gate
stages — LSTM: a cell stage (c_t from the i, f, g gates) and a hidden stage (h_t from the o gate); GRU: the
hidden stage from the z, r, h gates (with linear_before_reset 0, r ⊙ h_{t-1} first, then its own
contraction); RNN: the hidden stage — and Y, Y_h (Y_c) gather the steps."""

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


def _clip(x: E.Expr, clip: float | None, dtype: DType) -> E.Expr:
    if clip is None:
        return x
    return E.binary("min", E.binary("max", x, E.imm(-clip, dtype)), E.imm(clip, dtype))


def _input_part(ctx: LowerCtx, p, k: int, ngates: int, t: int, hr: str | None = None, input_bias: bool = True,
                recurrent_bias: bool = True) -> E.Expr:
    """Gate row block k of step t's input projection over the (batch=i0, hidden=i1) grid, plus the same rows
    of the recurrent product `hr` where given, plus the biases asked for (ONNX packs B as the input biases of
    every gate, then the recurrent ones; both: added as one sum)."""
    b, h = I.out_vars(2)
    row = h + k * p.hidden
    x = ctx.load(p.xw, (b + t * p.batch, row))
    if hr is not None:
        x = E.add(x, ctx.load(hr, (b, row)))
    biases = [ctx.load(p.bias, (I.const(p.d), row + off)) for off, want in
              ((0, input_bias), (ngates * p.hidden, recurrent_bias)) if want and p.bias is not None]
    if biases:
        x = E.add(x, biases[0] if len(biases) == 1 else E.add(*biases))
    return x


def _gate(ctx: LowerCtx, p: _Lstm, g: str, t: int, hr: str | None, c: E.Expr | None) -> E.Expr:
    """Pre-activation of LSTM gate g at step t over the (batch=i0, hidden=i1) grid."""
    b, h = I.out_vars(2)
    x = _input_part(ctx, p, GATES[g], 4, t, hr)
    if p.peep is not None and c is not None and g in PEEPHOLES:
        x = E.add(x, E.mul(ctx.load(p.peep, (I.const(p.d), h + PEEPHOLES[g] * p.hidden)), c))
    return _clip(x, p.clip, p.dtype)


def _direction(ctx: LowerCtx, node: OnnxNode, p: _Lstm, steps: list[int], batch: int, h0, c0,
               out: str) -> tuple[dict[int, str], dict[int, str]]:
    """Emit the steps of one direction in execution order; returns step -> h stage, c stage."""
    hs, cs = {}, {}
    b, h = I.out_vars(2)
    h_prev, c_prev = h0, c0  # loads over (b, k) / (b, h), or None for zeros
    H = p.hidden
    for t in steps:
        tag = f"d{p.d}.t{t}"
        hr = _recurrent(ctx, p, h_prev, 4 * H, ctx.tmp(out, f"{tag}.hr"), "lstm.recurrent")
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
        h_prev, c_prev = _loader(h_name, ctx), _loader(c_name, ctx)
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


def _unroll(ctx: LowerCtx, node: OnnxNode, ngates: int, acts_per_dir: list[str], steps_of, cell: bool) -> None:
    """What LSTM, GRU and RNN share: the attributes, each direction's input projection and initial
    state, its steps (`steps_of(p, steps, h0, c0, out)` -> step -> h stage, and -> c stage where `cell`) and
    the outputs Y, Y_h and (LSTM) Y_c gathered from the steps."""
    x, w, r = node.inputs[:3]
    inp = list(node.inputs) + [""] * 8
    layout = int(ctx.attr(node, "layout", 0))
    xs = ctx.shape(x)
    seq, batch = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    ndir, gates_h, isz = ctx.shape(w)
    H = int(ctx.attr(node, "hidden_size", gates_h // ngates))
    direction = ctx.attr(node, "direction", "forward")
    if ctx.has(node, 4):
        lens = ctx.require_const(inp[4], "sequence_lens")
        if (lens != seq).any():
            raise ctx.unsupported("sequence_lens shorter than the sequence")
    acts = list(ctx.attr(node, "activations", acts_per_dir * ndir))
    clip = ctx.attr(node, "clip", None)
    dt = ctx.dtype(x)
    out = next(o for o in node.outputs if o)
    rv = I.var("r0")
    hs_all, cs_all = {}, {}
    for d in range(ndir):
        # The input projection of every step at once, as one (seq * batch) x gates*H GEMM (row t * batch
        # + b): a 2-D contraction tiles as a GEMM, a (seq, batch, gates*H) one as seq products of a
        # batch-row matrix (one-row dot products at batch 1).
        j, g = I.out_vars(2)
        step, row = (I.floordiv(j, batch), I.mod(j, batch)) if batch > 1 else (j, I.const(0))
        xidx = (step, row, rv) if layout == 0 else (row, step, rv)
        xw = ctx.emit(ctx.tmp(out, f"d{d}.xw"), (seq * batch, ngates * H), dt,
                      E.mul(ctx.load(x, xidx), ctx.load(w, (I.const(d), g, rv))),
                      kind=StageKind.CONTRACTION, op=f"{node.op_type.lower()}.input", reduce=(isz,),
                      combine=Combine.SUM)
        k = len(acts_per_dir)
        p = _Lstm(d, H, xw, r, inp[3] or None, inp[7] or None if cell else None,
                  None if clip is None else float(clip), tuple(acts[k * d:k * d + k]), dt, batch)

        def init(name: str, d: int = d):
            if not name:
                return None
            return lambda bb, kk: ctx.load(name, (I.const(d), bb, kk) if layout == 0 else (bb, I.const(d), kk))

        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        steps = list(range(seq))[::-1] if reverse else list(range(seq))
        got = steps_of(p, steps, init(inp[5]), init(inp[6]) if cell else None, out)
        hs, cs = got if cell else (got, {})
        hs_all[d], cs_all[d] = (hs, cs, steps[-1]), cs
    outs = list(node.outputs) + ["", "", ""]
    if outs[0]:
        v = I.out_vars(4)
        t_var, d_var, bvar, hvar = (v[0], v[1], v[2], v[3]) if layout == 0 else (v[1], v[2], v[0], v[3])
        choices = [([(t_var, t), (d_var, d)], ctx.load(hs_all[d][0][t], (bvar, hvar)))
                   for d in range(ndir) for t in range(seq)]
        shape = (seq, ndir, batch, H) if layout == 0 else (batch, seq, ndir, H)
        ctx.emit(outs[0], shape, dt, _pick(choices), kind=StageKind.LAYOUT, op=f"{node.op_type.lower()}.y")
    for k, table in ((1, {d: hs_all[d][0] for d in hs_all}), (2, cs_all)):
        if outs[k]:
            v = I.out_vars(3)
            d_var, bvar, hvar = (v[0], v[1], v[2]) if layout == 0 else (v[1], v[0], v[2])
            choices = [([(d_var, d)], ctx.load(table[d][hs_all[d][2]], (bvar, hvar))) for d in range(ndir)]
            shape = (ndir, batch, H) if layout == 0 else (batch, ndir, H)
            ctx.emit(outs[k], shape, dt, _pick(choices), kind=StageKind.LAYOUT,
                     op=f"{node.op_type.lower()}.state")


def _recurrent(ctx: LowerCtx, p: _Lstm, h_prev, rows: int, name: str, op: str, offset: int = 0) -> str | None:
    """h_{t-1} @ Rᵀ over `rows` gate rows from `offset`, (batch, rows); None while h_{t-1} is zeros."""
    if h_prev is None:
        return None
    b, h = I.out_vars(2)
    r = I.var("r0")
    body = E.mul(h_prev(b, r), ctx.load(p.w_r, (I.const(p.d), h + offset, r)))
    return ctx.emit(name, (p.batch, rows), p.dtype, body, kind=StageKind.CONTRACTION, op=op, reduce=(p.hidden,),
                    combine=Combine.SUM)


def _gru_gate(ctx: LowerCtx, p: _Lstm, k: int, t: int, hr: str | None, act: str) -> E.Expr:
    """GRU gate k (0: update z, 1: reset r) at step t, activated."""
    return _activate(act, _clip(_input_part(ctx, p, k, 3, t, hr), p.clip, p.dtype), ctx)


def _loader(name: str, ctx: LowerCtx):
    return lambda bb, kk: ctx.load(name, (bb, kk))


@register("LSTM")
def convert_lstm(ctx: LowerCtx, node: OnnxNode) -> None:
    if int(ctx.attr(node, "input_forget", 0)):
        raise ctx.unsupported("input_forget=1")

    def steps_of(p, steps, h0, c0, out):
        return _direction(ctx, node, p, steps, p.batch, h0, c0, out)

    _unroll(ctx, node, 4, ["Sigmoid", "Tanh", "Tanh"], steps_of, cell=True)


@register("GRU")
def convert_gru(ctx: LowerCtx, node: OnnxNode) -> None:
    """Gates z, r, h (ONNX's packing): z and r from the input and recurrent projections, the candidate
    h~ = g(x Wh + (r ⊙ h_{t-1}) Rh + biases) — or with linear_before_reset, g(x Wh + Wbh + r ⊙ (h_{t-1} Rh +
    Rbh)) — and h_t = (1 - z) ⊙ h~ + z ⊙ h_{t-1}."""
    before = bool(int(ctx.attr(node, "linear_before_reset", 0)))

    def steps_of(p, steps, h0, _c0, out):
        b, h = I.out_vars(2)
        hs, h_prev = {}, h0
        f_act, g_act = p.acts
        H = p.hidden
        for t in steps:
            tag = f"d{p.d}.t{t}"
            hr = _recurrent(ctx, p, h_prev, 3 * H if before else 2 * H, ctx.tmp(out, f"{tag}.hr"), "gru.recurrent")

            z, rg = (_gru_gate(ctx, p, k, t, hr, f_act) for k in (0, 1))
            cand = _input_part(ctx, p, 2, 3, t, recurrent_bias=not before)
            if before:  # r ⊙ (h_{t-1} Rhᵀ + Rbh)
                rec = [ctx.load(hr, (b, h + 2 * H))] if hr is not None else []
                if p.bias is not None:
                    rec.append(ctx.load(p.bias, (I.const(p.d), h + 5 * H)))
                if rec:
                    cand = E.add(cand, E.mul(rg, rec[0] if len(rec) == 1 else E.add(*rec)))
            elif h_prev is not None:  # (r ⊙ h_{t-1}) Rhᵀ: the reset applied before the product
                gated = ctx.elementwise(ctx.tmp(out, f"{tag}.rh"), (p.batch, H), p.dtype,
                                        E.mul(rg, h_prev(b, h)), op="gru.reset")
                rh = _recurrent(ctx, p, _loader(gated, ctx), H, ctx.tmp(out, f"{tag}.rhr"), "gru.recurrent",
                                offset=2 * H)
                cand = E.add(cand, ctx.load(rh, (b, h)))
            cand = _activate(g_act, _clip(cand, p.clip, p.dtype), ctx)
            new = E.mul(E.sub(E.imm(1.0, p.dtype), z), cand)
            if h_prev is not None:
                new = E.add(new, E.mul(z, h_prev(b, h)))
            hs[t] = ctx.elementwise(ctx.tmp(out, f"{tag}.h"), (p.batch, H), p.dtype, new, op="gru.hidden")
            h_prev = _loader(hs[t], ctx)
        return hs

    _unroll(ctx, node, 3, ["Sigmoid", "Tanh"], steps_of, cell=False)


@register("RNN")
def convert_rnn(ctx: LowerCtx, node: OnnxNode) -> None:
    """h_t = f(x Wᵀ + h_{t-1} Rᵀ + Wb + Rb)."""

    def steps_of(p, steps, h0, _c0, out):
        hs, h_prev = {}, h0
        for t in steps:
            tag = f"d{p.d}.t{t}"
            hr = _recurrent(ctx, p, h_prev, p.hidden, ctx.tmp(out, f"{tag}.hr"), "rnn.recurrent")
            x = _input_part(ctx, p, 0, 1, t, hr)
            hs[t] = ctx.elementwise(ctx.tmp(out, f"{tag}.h"), (p.batch, p.hidden), p.dtype,
                                    _activate(p.acts[0], _clip(x, p.clip, p.dtype), ctx), op="rnn.hidden")
            h_prev = _loader(hs[t], ctx)
        return hs

    _unroll(ctx, node, 1, ["Tanh"], steps_of, cell=False)
