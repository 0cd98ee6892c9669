"""Stable text and DOT renderings of a PrimGraph (what DEBUG=5 and DUMP_DIR write, what tests diff).

Text, one stage per line:
    %name: f32[1,128,768] = sum r0<768: (x[i0, i1, r0] * w[r0, i2])   # contraction matmul <- node
"""

from __future__ import annotations

from engine.ir.expr import format_expr
from engine.ir.graph import PrimGraph, Stage, StageKind, TensorSpec

KIND_COLORS = {
    StageKind.ELEMENTWISE: "#e8f5e9",
    StageKind.REDUCE: "#fff3e0",
    StageKind.CONTRACTION: "#e3f2fd",
    StageKind.LAYOUT: "#f3e5f5",
}


def format_spec(t: TensorSpec) -> str:
    return f"{t.dtype.short}[{','.join(map(str, t.shape))}]"


def format_stage(s: Stage) -> str:
    body = format_expr(s.body)
    if s.combine is not None:
        red = ", ".join(f"r{k}<{n}" for k, n in enumerate(s.reduce))
        body = f"{s.combine.value} {red}: {body}"
    origin = f" <- {', '.join(s.origin)}" if s.origin else ""
    return f"%{s.name}: {format_spec(s.spec)} = {body}   # {s.kind.value} {s.op}{origin}"


def format_graph(g: PrimGraph) -> str:
    """The whole graph as text: inputs, constants, stages in order, outputs. Deterministic."""
    lines = [f"graph {g.name}  # hash {g.structural_hash}"]
    lines += [f"input %{t.name}: {format_spec(t)}" for t in g.inputs]
    lines += [f"const %{t.name}: {format_spec(t)}" for t in g.constants]
    lines += [format_stage(s) for s in g.stages]
    lines += [f"output {name} = %{t}" for name, t in zip(g.output_names, g.outputs)]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def graph_to_dot(g: PrimGraph, *, show_constants: bool = False) -> str:
    """DOT of the stage graph: one node per stage (coloured by kind), graph inputs as ellipses,
    edges labelled with tensor shapes."""
    lines = ["digraph primgraph {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fontsize=10];']
    shown = {t.name for t in g.inputs} | ({t.name for t in g.constants} if show_constants else set())
    for t in g.inputs:
        lines.append(f"  {_q(t.name)} [shape=ellipse, fillcolor=\"#fffde7\", label={_q(t.name + chr(10) + format_spec(t))}];")
    if show_constants:
        for t in g.constants:
            lines.append(f"  {_q(t.name)} [shape=note, fillcolor=\"#eeeeee\", label={_q(t.name + chr(10) + format_spec(t))}];")
    for s in g.stages:
        label = f"{s.op or s.kind.value}\n{format_spec(s.spec)}"
        lines.append(f"  {_q(s.name)} [fillcolor=\"{KIND_COLORS[s.kind]}\", label={_q(label)}, tooltip={_q(s.name)}];")
    for s in g.stages:
        for t in s.inputs:
            if t in g.stage_map or t in shown:
                spec = g.specs[t]
                lines.append(f"  {_q(t)} -> {_q(s.name)} [label={_q('x'.join(map(str, spec.shape)) or 'scalar')}];")
    for name, t in zip(g.output_names, g.outputs):
        lines.append(f"  {_q('out:' + name)} [shape=ellipse, fillcolor=\"#fffde7\", label={_q(name)}];")
        lines.append(f"  {_q(t)} -> {_q('out:' + name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"
