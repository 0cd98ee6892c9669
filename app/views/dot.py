"""Plan → Graphviz DOT text: stages as nodes, kernel groups as clusters (label: kernel name and
modeled time), each edge coloured and styled by its connection level, tensor shapes on edges,
repeated layers optionally collapsed into one node."""

from __future__ import annotations

from app.views.fmt import fmt_shape, fmt_us
from app.views.layers import repeated_layers
from engine.ir.graph import PrimGraph, StageKind
from engine.schedule.plan import Conn, Plan

# connection -> (colour, style, pen width, legend text)
CONN_STYLE: dict[Conn, tuple[str, str, float, str]] = {
    Conn.REGISTER: ("#2e7d32", "bold", 2.6, "register (same thread)"),
    Conn.SHARED: ("#1565c0", "solid", 2.0, "shared (block tile)"),
    Conn.GLOBAL_SYNC: ("#e65100", "dashed", 2.0, "global-sync (grid barrier)"),
    Conn.KERNEL: ("#757575", "dotted", 1.2, "kernel (next launch)"),
}
KIND_FILL = {
    StageKind.ELEMENTWISE: "#e8f5e9", StageKind.REDUCE: "#fff3e0",
    StageKind.CONTRACTION: "#e3f2fd", StageKind.LAYOUT: "#f3e5f5",
}
SELECTED = "#d81b60"


def _q(text: str) -> str:
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + text + '"'


def plan_to_dot(graph: PrimGraph, plan: Plan, *, selected_group: int | None = None,
                selected_edge: tuple[str, str] | None = None, collapse_layers: bool = False,
                show_inputs: bool = True, only_groups: set[int] | None = None) -> str:
    """DOT text for `plan` over `graph`. Node ids are positional (n0, n1, …) so stage names with
    slashes and colons never need escaping outside labels. `only_groups`: draw just those groups'
    stages and the edges among them (one kernel and its neighbours of a large model)."""
    hidden: dict[str, str] = {}  # stage -> id of the node standing for its collapsed layer
    lines = ["digraph tilegraph {", "  rankdir=TB; compound=true; newrank=true;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8];']
    if collapse_layers:
        for k, (first, later) in enumerate(repeated_layers(graph).items()):
            node = f"L{k}"
            scopes = [lay.scope for lay in later]
            label = f"{len(later)} more layer(s) like {first}\n{scopes[0]} … {scopes[-1]}"
            lines.append(f'  {node} [label={_q(label)}, shape=box3d, fillcolor="#eeeeee"];')
            for lay in later:
                for s in lay.stages:
                    hidden[s] = node
    ids = {s.name: f"n{k}" for k, s in enumerate(graph.stages)}
    outputs = set(graph.outputs)

    drawn: set[str] = set()
    for g in plan.groups:
        if only_groups is not None and g.id not in only_groups:
            continue
        visible = [s for s in g.stages if s not in hidden]
        drawn.update(visible)
        if not visible:
            continue
        cost = fmt_us(g.cost.modeled_us) if g.cost else "not modeled"
        pen = f' color="{SELECTED}"; penwidth=3;' if g.id == selected_group else ' color="#9e9e9e";'
        lines.append(f"  subgraph cluster_g{g.id} {{")
        lines.append(f'    label={_q(f"{g.name}  ·  {cost}")}; style="rounded";{pen} fontsize=10;')
        for name in visible:
            s = graph.stage(name)
            label = f"{s.op or s.kind.value}\n{fmt_shape(s.shape)}"
            extra = ", peripheries=2" if name in outputs else ""
            lines.append(f'    {ids[name]} [label={_q(label)}, tooltip={_q(name)}, '
                         f'fillcolor="{KIND_FILL[s.kind]}"{extra}];')
        lines.append("  }")

    if show_inputs:
        for k, t in enumerate(graph.inputs):
            readers = [c for c in graph.consumers.get(t.name, ()) if c not in hidden and c in drawn]
            if not readers:
                continue
            label = _q(t.name + "\n" + fmt_shape(t.shape))
            lines.append(f'  in{k} [label={label}, shape=ellipse, fillcolor="#fffde7"];')
            for c in readers:
                lines.append(f'  in{k} -> {ids[c]} [color="#bdbdbd"];')

    seen: set[tuple[str, str]] = set()
    for e in plan.edges:
        if only_groups is not None and not (e.producer in drawn and e.consumer in drawn):
            continue
        src = hidden.get(e.producer, ids[e.producer])
        dst = hidden.get(e.consumer, ids[e.consumer])
        if src == dst or (src, dst) in seen:
            continue  # inside a collapsed layer, or a duplicate after collapsing
        seen.add((src, dst))
        colour, style, width, _ = CONN_STYLE[e.conn]
        if selected_edge == (e.producer, e.consumer):
            colour, width = SELECTED, 3.5
        shape = fmt_shape(graph.specs[e.producer].shape)
        tip = f"{e.producer} → {e.consumer}: {e.conn.value} ({e.reason})"
        lines.append(f'  {src} -> {dst} [label={_q(shape)}, color="{colour}", style={style}, '
                     f'penwidth={width}, tooltip={_q(tip)}];')
    lines.append("}")
    return "\n".join(lines)


def legend_dot() -> str:
    """A small DOT graph showing one edge per connection level."""
    lines = ["digraph legend {", "  rankdir=LR; node [shape=point, width=0.08];",
             '  edge [fontname="Helvetica", fontsize=9];']
    for k, (colour, style, width, text) in enumerate(CONN_STYLE.values()):
        lines.append(f'  a{k} -> b{k} [label={_q(text)}, color="{colour}", style={style}, penwidth={width}];')
    lines.append("}")
    return "\n".join(lines)
