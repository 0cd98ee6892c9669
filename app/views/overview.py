"""Plan → kernel-level overview: one node per kernel (repeated kernels folded into one ×N node), edges
between kernels with tensor shapes and bytes; its DOT for Graphviz's layout, `dot -Tplain` positions
parsed back, and the plotly figure (nodes coloured by an overlay, edge midpoints clickable)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import plotly.graph_objects as go

from app.views.dot import SELECTED
from app.views.fmt import fmt_bytes, fmt_shape, fmt_us
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Conn, Group, Plan
from engine.schedule.tiles import group_signature

CHANGED = "#ff6f00"  # kernels and edges that differ from the compared plan
VISIBLE_RANKS = 12  # layout rows shown before the user pans


@dataclass(frozen=True)
class KernelNode:
    key: str  # "g3", or "g3x4" for kernel 3 standing for 4 repeats
    groups: tuple[int, ...]  # the plan's group ids it stands for (one unless folded)
    name: str  # first group's kernel name
    stages: int  # stages of one repeat
    conns: str  # connection-level summary of its internal edges: "5 register · 2 shared"

    @property
    def repeat(self) -> int:
        return len(self.groups)


@dataclass(frozen=True)
class KernelEdge:
    src: str  # KernelNode keys
    dst: str
    stage_edges: tuple[tuple[str, str], ...]  # the plan's edges it stands for (producer, consumer)
    shapes: tuple[str, ...]  # distinct tensor shapes crossing
    nbytes: int  # bytes of the distinct tensors crossing (one repeat when folded)


@dataclass(frozen=True)
class Overview:
    nodes: tuple[KernelNode, ...]
    edges: tuple[KernelEdge, ...]

    def node(self, key: str) -> KernelNode:
        return next(n for n in self.nodes if n.key == key)

    def node_of_group(self, group_id: int) -> KernelNode:
        return next(n for n in self.nodes if group_id in n.groups)


def conn_summary(plan: Plan, group: Group) -> str:
    """'5 register · 2 shared' over the group's internal edges; 'single stage' when it has none."""
    members = set(group.stages)
    counts = Counter(e.conn for e in plan.edges if e.producer in members and e.consumer in members)
    if not counts:
        return "single stage" if len(group.stages) == 1 else "no internal edges"
    return " · ".join(f"{counts[c]} {c.value}" for c in Conn if counts[c])


def _signatures(graph: PrimGraph, plan: Plan) -> dict[int, str]:
    conns = {e.key: e.conn for e in plan.edges}
    return {g.id: group_signature(graph, g.stages, conns) for g in plan.groups}


def repeat_runs(sigs: list[str], max_period: int = 64) -> list[tuple[int, int, int]]:
    """(start, period, count) covering `sigs` in order: at each position the block of `period`
    signatures repeated most times back to back (count >= 2, most kernels covered, shortest period on
    a tie); (start, 1, 1) where nothing repeats. Kernel sequences of stacked layers repeat this way."""
    runs, i = [], 0
    while i < len(sigs):
        best = (1, 1)  # (period, count)
        for period in range(1, min(max_period, (len(sigs) - i) // 2) + 1):
            block = sigs[i:i + period]
            count = 1
            while sigs[i + count * period:i + (count + 1) * period] == block:
                count += 1
            if count >= 2 and period * count > best[0] * best[1]:
                best = (period, count)
        runs.append((i, *best))
        i += best[0] * best[1]
    return runs


def build_overview(graph: PrimGraph, plan: Plan, *, fold_repeats: bool = True) -> Overview:
    """Kernels in plan order; with `fold_repeats`, a block of kernels repeated back to back with the
    same canonical signatures (engine.schedule.tiles.group_signature: stages, shapes and connections
    up to tensor names — stacked identical layers) is drawn once: each kernel of the first block
    stands for its N copies (×N badge), and the edge from one copy to the next becomes a loop back."""
    group_at = {s: g.id for g in plan.groups for s in g.stages}
    groups = list(plan.groups)
    if fold_repeats:
        sigs = _signatures(graph, plan)
        runs = repeat_runs([sigs[g.id] for g in groups])
    else:
        runs = [(k, 1, 1) for k in range(len(groups))]
    nodes = []
    node_at: dict[int, str] = {}
    for start, period, count in runs:
        for j in range(period):
            copies = [groups[start + j + k * period] for k in range(count)]
            first = copies[0]
            key = f"g{first.id}" + (f"x{count}" if count > 1 else "")
            nodes.append(KernelNode(key, tuple(g.id for g in copies), first.name, len(first.stages),
                                    conn_summary(plan, first)))
            for g in copies:
                node_at[g.id] = key
    crossing: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for e in plan.edges:
        src, dst = node_at[group_at[e.producer]], node_at[group_at[e.consumer]]
        if src != dst:
            crossing.setdefault((src, dst), []).append(e.key)
    edges = []
    for (src, dst), pairs in crossing.items():
        tensors = dict.fromkeys(p for p, _ in pairs)
        edges.append(KernelEdge(src, dst, tuple(pairs),
                                tuple(dict.fromkeys(fmt_shape(graph.specs[t].shape) for t in tensors)),
                                sum(graph.specs[t].nbytes for t in tensors)))
    return Overview(tuple(nodes), tuple(edges))


def overview_dot(ov: Overview) -> str:
    """DOT for Graphviz's layout only (positions); labels sized like the drawn ones. An edge spanning many
    ranks adds a virtual node per rank it crosses: lstm's 199-kernel unfused plan had 19,000, and dot's
    exact x placement over them took 22-70 s. `concentrate` lets edges leaving one kernel share their
    path (2,300 virtual nodes), `nslimit` caps the placement at 2 network-simplex passes per node: 0.7 s."""
    lines = ["digraph overview {", "  rankdir=TB; nodesep=0.3; ranksep=0.45; nslimit=2; concentrate=true;",
             '  node [shape=box, fontsize=10, width=2.2, height=0.6, fixedsize=true];']
    lines += [f'  "{n.key}";' for n in ov.nodes]
    lines += [f'  "{e.src}" -> "{e.dst}";' for e in ov.edges]
    lines.append("}")
    return "\n".join(lines)


def parse_plain(text: str) -> dict[str, tuple[float, float]]:
    """Node positions (inches, y up) from `dot -Tplain` output."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "node":
            out[parts[1].strip('"')] = (float(parts[2]), float(parts[3]))
    return out


# ---- overlays -----------------------------------------------------------------------------------

OVERLAYS = {  # name -> (unit for the legend, what it shows)
    "modeled time": ("µs", "the cost model's time of the kernel on the plan's device"),
    "measured time": ("µs", "time measured by the last run of this plan (CPU backend, or GPU)"),
    "measured / modeled": ("×", "measured time over modeled time (1 = the model is right)"),
    "DRAM bytes": ("MiB", "modeled bytes the kernel moves from DRAM"),
    "emulated traffic": ("MiB", "bytes the kernel's threads loaded and stored under the cuda-sim emulator"),
    "recompute factor": ("×", "flops including register recompute over flops of the stages once"),
}


def overlay_values(plan: Plan, overlay: str, measured_us: dict[str, float] | None = None,
                   emulated_bytes: dict[str, int] | None = None) -> dict[int, float]:
    """Group id -> the overlay's value (missing when the plan has no such number for it)."""
    measured_us = measured_us or {}
    emulated_bytes = emulated_bytes or {}
    out: dict[int, float] = {}
    for g in plan.groups:
        cost = g.cost
        measured = measured_us.get(g.name, g.measured_us)
        value = None
        if overlay == "modeled time" and cost:
            value = cost.modeled_us
        elif overlay == "measured time":
            value = measured
        elif overlay == "measured / modeled" and cost and measured is not None and cost.modeled_us > 0:
            value = measured / cost.modeled_us
        elif overlay == "DRAM bytes" and cost:
            value = cost.traffic_bytes.get("dram", 0) / 2**20
        elif overlay == "emulated traffic" and g.name in emulated_bytes:
            value = emulated_bytes[g.name] / 2**20
        elif overlay == "recompute factor" and cost:
            value = cost.recompute_factor
        if value is not None:
            out[g.id] = float(value)
    return out


def node_value(node: KernelNode, values: dict[int, float], overlay: str) -> float | None:
    """A folded node's value: the sum over its repeats for times and bytes, the mean for ratios."""
    got = [values[g] for g in node.groups if g in values]
    if not got:
        return None
    return sum(got) / len(got) if OVERLAYS[overlay][0] == "×" else sum(got)


def node_text(node: KernelNode, plan: Plan, measured_us: dict[str, float] | None = None) -> str:
    """Hover text: kernel, stage count, connection summary, modeled and measured time."""
    groups = [g for g in plan.groups if g.id in node.groups]
    modeled = sum(g.cost.modeled_us for g in groups if g.cost)
    measured = [(measured_us or {}).get(g.name, g.measured_us) for g in groups]
    badge = f" ×{node.repeat}" if node.repeat > 1 else ""
    lines = [f"<b>{node.name}</b>{badge}", f"{node.stages} stage(s) · {node.conns}", f"modeled {fmt_us(modeled)}"]
    if all(m is not None for m in measured):
        lines.append(f"measured {fmt_us(sum(measured))}")
    return "<br>".join(lines)


def _label(node: KernelNode) -> str:
    name = node.name if len(node.name) <= 26 else node.name[:25] + "…"
    badge = f" ×{node.repeat}" if node.repeat > 1 else ""
    return f"{name}{badge}<br>{node.stages} st · {node.conns}"


def overview_figure(ov: Overview, positions: dict[str, tuple[float, float]], plan: Plan, *,
                    overlay: str = "modeled time", values: dict[int, float] | None = None,
                    measured_us: dict[str, float] | None = None, selected: str | None = None,
                    selected_edge: int | None = None, changed_nodes: frozenset[str] = frozenset(),
                    changed_edges: frozenset[int] = frozenset()) -> go.Figure:
    """Trace 0: kernel nodes (customdata = node key); trace 1: edge midpoints (customdata = edge
    index); then edge lines. Nodes coloured by `values` (group id -> value) with a colour bar in the
    overlay's unit; grey where the overlay has no value."""
    unit = OVERLAYS[overlay][0]
    values = values or {}
    xs, ys, colours, texts, hovers, borders, widths = [], [], [], [], [], [], []
    for n in ov.nodes:
        x, y = positions.get(n.key, (0.0, 0.0))
        xs.append(x)
        ys.append(y)
        v = node_value(n, values, overlay)
        colours.append(v)
        texts.append(_label(n))
        extra = f"<br>{overlay}: {v:.3g} {unit}" if v is not None else f"<br>{overlay}: —"
        hovers.append(node_text(n, plan, measured_us) + extra)
        chosen = n.key == selected
        borders.append(SELECTED if chosen else CHANGED if n.key in changed_nodes else "#616161")
        widths.append(4 if chosen or n.key in changed_nodes else 1)
    have = [c for c in colours if c is not None]
    lo, hi = (min(have), max(have)) if have else (0.0, 1.0)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="markers+text", text=texts, textposition="middle right",
        textfont={"size": 9}, hovertext=hovers, hoverinfo="text", customdata=[n.key for n in ov.nodes],
        name="kernels", showlegend=False,
        marker={"symbol": "square", "size": 26, "color": [c if c is not None else lo for c in colours],
                "colorscale": "YlOrRd", "cmin": lo, "cmax": hi if hi > lo else lo + 1e-9,
                "showscale": bool(have), "opacity": 0.85,
                "colorbar": {"title": {"text": f"{overlay} ({unit})"}, "thickness": 12},
                "line": {"color": borders, "width": widths}}))
    mids_x, mids_y, mid_text = [], [], []
    for e in ov.edges:
        (x0, y0), (x1, y1) = positions.get(e.src, (0, 0)), positions.get(e.dst, (0, 0))
        mids_x.append((x0 + x1) / 2)
        mids_y.append((y0 + y1) / 2)
        shapes = ", ".join(e.shapes[:3]) + (" …" if len(e.shapes) > 3 else "")
        mid_text.append(f"{len(e.stage_edges)} tensor edge(s): {shapes}<br>{fmt_bytes(e.nbytes)}")
    mid_colour = [SELECTED if k == selected_edge else CHANGED if k in changed_edges else "#424242"
                  for k in range(len(ov.edges))]
    fig.add_trace(go.Scatter(x=mids_x, y=mids_y, mode="markers", hovertext=mid_text, hoverinfo="text",
                             customdata=list(range(len(ov.edges))), name="edges", showlegend=False,
                             marker={"symbol": "diamond", "size": 10, "color": mid_colour}))
    styles = {"plain": ("#757575", 1.2, "kernel edge"), "changed": (CHANGED, 3.5, "changed vs compared plan"),
              "selected": (SELECTED, 3.5, "selected")}
    for kind, (line_colour, line_width, legend) in styles.items():
        lx, ly = [], []
        for k, e in enumerate(ov.edges):
            which = "selected" if k == selected_edge else "changed" if k in changed_edges else "plain"
            if which == kind:
                (x0, y0), (x1, y1) = positions.get(e.src, (0, 0)), positions.get(e.dst, (0, 0))
                lx += [x0, x1, None]
                ly += [y0, y1, None]
        if lx:
            fig.add_trace(go.Scatter(x=lx, y=ly, mode="lines", hoverinfo="skip", name=legend,
                                     line={"color": line_colour, "width": line_width}))
    fig.data = fig.data[2:] + fig.data[:2]  # lines underneath; nodes and midpoints stay on top
    # Graphviz ranks are rows: show at most VISIBLE_RANKS of them at first (readable labels); the
    # rest is a drag (pan) or scroll (zoom) away.
    rows = sorted(set(ys), reverse=True)
    y_range = None
    if len(rows) > VISIBLE_RANKS:
        y_range = [rows[VISIBLE_RANKS - 1] - 0.4, rows[0] + 0.4]
    height = max(360, min(900, 75 * min(len(rows), VISIBLE_RANKS)))
    fig.update_layout(height=height, margin={"l": 10, "r": 10, "t": 10, "b": 10}, dragmode="pan",
                      clickmode="event+select", hovermode="closest", plot_bgcolor="white",
                      legend={"orientation": "h", "y": -0.02},
                      xaxis={"visible": False, "range": [min(xs) - 0.6, max(xs) + 2.6] if xs else None},
                      yaxis={"visible": False, "range": y_range})
    return fig


def pick_from_selection(fig: go.Figure, selection: dict | None) -> tuple[str, object] | None:
    """('kernel', node key) or ('edge', edge index) for the first clicked point of `fig`, else None.
    Points name their trace by curve_number, which is the figure's trace order."""
    for point in (selection or {}).get("points", []) or []:
        curve = point.get("curve_number")
        if curve is None or curve >= len(fig.data):
            continue
        trace = fig.data[curve]
        data = point.get("customdata")
        if isinstance(data, list):
            data = data[0] if data else None
        if data is None and trace.customdata is not None:
            data = trace.customdata[point.get("point_index", 0)]
        if trace.name == "kernels":
            return "kernel", str(data)
        if trace.name == "edges":
            return "edge", int(data)
    return None


def search_stages(graph: PrimGraph, plan: Plan, query: str, limit: int = 20) -> list[tuple[str, str]]:
    """(match text, kernel name) for stages whose name or ONNX node name contains `query` (case-blind)."""
    q = query.strip().lower()
    if not q:
        return []
    out = []
    for s in graph.stages:
        hits = [o for o in s.origin if q in o.lower()]
        if q in s.name.lower() or hits:
            text = s.name + (f"  (ONNX {hits[0]})" if hits else "")
            out.append((text, plan.group_of(s.name).name))
            if len(out) >= limit:
                break
    return out


def neighbour_groups(plan: Plan, group_id: int) -> set[int]:
    """The group and every group it reads from or writes to."""
    group_at = {s: g.id for g in plan.groups for s in g.stages}
    out = {group_id}
    for e in plan.edges:
        if group_at[e.producer] == group_id:
            out.add(group_at[e.consumer])
        if group_at[e.consumer] == group_id:
            out.add(group_at[e.producer])
    return out


# ---- compare -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OverviewDiff:
    changed_nodes: frozenset[str]  # nodes of A's overview whose stages are grouped or connected differently in B
    changed_edges: frozenset[int]  # A's kernel edges with a tensor edge connected differently in B
    rows: tuple[dict, ...]  # per kernel of A: modeled µs in A, B's share over the same stages, delta


def diff_overview(ov: Overview, a: Plan, b: Plan) -> OverviewDiff:
    """Where plan B differs from plan A, on A's overview. B's time for an A kernel is the stage-weighted
    share of the B kernels covering its stages (B may group those stages differently)."""
    conn_b = {e.key: e.conn for e in b.edges}
    changed = {e.key for e in a.edges if conn_b.get(e.key, e.conn) != e.conn}
    groups_a = {g.id: g for g in a.groups}
    b_sets = {frozenset(g.stages) for g in b.groups}
    b_at = {s: g for g in b.groups for s in g.stages}
    nodes, rows = set(), []
    for n in ov.nodes:
        members = {s for gid in n.groups for s in groups_a[gid].stages}
        regrouped = any(frozenset(groups_a[gid].stages) not in b_sets for gid in n.groups)
        inner = any(p in members and c in members for p, c in changed)
        if regrouped or inner:
            nodes.add(n.key)
        mod_a = sum(groups_a[gid].cost.modeled_us for gid in n.groups if groups_a[gid].cost)
        share: dict[int, float] = {}
        for s in members:
            g = b_at.get(s)
            if g is not None and g.cost:
                share[g.id] = share.get(g.id, 0.0) + g.cost.modeled_us / len(g.stages)
        mod_b = sum(share.values())
        rows.append({"kernel (A)": n.name + (f" ×{n.repeat}" if n.repeat > 1 else ""),
                     "B kernels over its stages": len(share), "modeled µs A": round(mod_a, 2),
                     "modeled µs B (share)": round(mod_b, 2), "Δ µs (B − A)": round(mod_b - mod_a, 2),
                     "differs": n.key in nodes})
    edges = frozenset(k for k, e in enumerate(ov.edges) if any(pair in changed for pair in e.stage_edges))
    return OverviewDiff(frozenset(nodes), edges, tuple(rows))
