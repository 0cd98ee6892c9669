"""Einsum -> one stage: output letters become output axes, the others reduce axes, and the body is the
product of the operands' loads (a contraction for two or more operands; a reduce, layout or
elementwise stage otherwise). Repeated letters (diagonals, traces) and `...` are index expressions too."""

from __future__ import annotations

from engine.frontend.context import LowerCtx, OnnxNode, register
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.graph import Combine, StageKind

_ELLIPSIS_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def parse_einsum(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
    """Operand subscripts and output subscripts with `...` expanded into fresh uppercase letters and
    the implicit output (letters used once, sorted) made explicit."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"equation has {len(terms)} operands but the node has {len(shapes)} inputs")
    ell_rank = 0
    for t, s in zip(terms, shapes):
        if "..." in t:
            ell_rank = max(ell_rank, len(s) - (len(t) - 3))
    ell = _ELLIPSIS_LETTERS[26 - ell_rank:] if ell_rank else ""
    expanded = []
    for t, s in zip(terms, shapes):
        if "..." in t:
            k = len(s) - (len(t) - 3)
            t = t.replace("...", ell[len(ell) - k:] if k else "")
        if len(t) != len(s):
            raise ValueError(f"subscripts '{t}' do not match an operand of rank {len(s)}")
        expanded.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for t in expanded:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
    return expanded, out


@register("Einsum")
def convert_einsum(ctx: LowerCtx, node: OnnxNode) -> None:
    names = [n for n in node.inputs if n]
    shapes = [ctx.shape(n) for n in names]
    try:
        terms, out_sub = parse_einsum(str(node.attrs["equation"]), shapes)
    except ValueError as err:
        raise ctx.unsupported(f"equation '{node.attrs['equation']}': {err}") from None
    extent: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        for ch, d in zip(t, s):
            if d != 1 or ch not in extent:
                if ch in extent and extent[ch] not in (1, d):
                    raise ctx.unsupported(f"subscript '{ch}' with extents {extent[ch]} and {d}")
                extent[ch] = max(extent.get(ch, 1), d)
    red_letters = [ch for ch in dict.fromkeys("".join(terms)) if ch not in out_sub]
    var = {ch: I.var(f"i{k}") for k, ch in enumerate(out_sub)}
    var.update({ch: I.var(f"r{k}") for k, ch in enumerate(red_letters)})
    body = None
    for n, t, s in zip(names, terms, shapes):
        # A size-1 axis broadcast against a longer one reads index 0.
        idx = tuple(I.const(0) if d == 1 and extent[ch] != 1 else var[ch] for ch, d in zip(t, s))
        ld = ctx.load(n, idx)
        body = ld if body is None else E.mul(body, ld)
    out_shape = tuple(extent[ch] for ch in out_sub)
    dt = ctx.dtype(names[0])
    if red_letters:
        kind = StageKind.CONTRACTION if len(names) > 1 else StageKind.REDUCE
        ctx.emit(node.outputs[0], out_shape, dt, body, kind=kind, op="einsum",
                 reduce=tuple(extent[ch] for ch in red_letters), combine=Combine.SUM)
    else:
        kind = StageKind.LAYOUT if len(names) == 1 else StageKind.ELEMENTWISE
        ctx.emit(node.outputs[0], out_shape, dt, body, kind=kind, op="einsum")
