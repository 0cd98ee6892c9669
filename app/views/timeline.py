"""RProgram → plotly figure: one horizontal bar per rTask on its vEU row, coloured by kernel, the
hover naming the rTask; many rTasks are drawn as line segments (one trace per kernel) to stay fast."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative

from engine.rprogram.model import RProgram

MAX_VEUS_SHOWN = 256  # rows beyond this are left out (the caption says so)


def timeline_figure(rp: RProgram, *, max_veus: int = MAX_VEUS_SHOWN) -> go.Figure:
    """vEU × time (µs from the launch). Each kernel is one trace of segments separated by None."""
    palette = qualitative.Plotly + qualitative.D3 + qualitative.Set2
    launch = rp.launch_us
    per_op: dict[str, tuple[list, list, list]] = {op.name: ([], [], []) for op in rp.operators}
    for v, tasks in enumerate(rp.veus[:max_veus]):
        for t in tasks:
            xs, ys, hover = per_op[t.op]
            text = (f"{t.op} block {t.block}<br>vEU {v}<br>{launch + t.start_us:.2f} → "
                    f"{launch + t.end_us:.2f} µs ({t.dur_us:.2f} µs)")
            xs.extend([launch + t.start_us, launch + t.end_us, None])
            ys.extend([v, v, None])
            hover.extend([text, text, None])
    # SVG traces draw everywhere (WebGL needs a GPU-backed browser); WebGL only when SVG would crawl.
    trace = go.Scattergl if sum(len(v[0]) for v in per_op.values()) > 60_000 else go.Scatter
    fig = go.Figure()
    for k, op in enumerate(rp.operators):
        xs, ys, hover = per_op[op.name]
        if not xs:
            continue
        fig.add_trace(trace(x=xs, y=ys, mode="lines", name=op.name, hovertext=hover, hoverinfo="text",
                                   line={"width": 6, "color": palette[k % len(palette)]}))
    shown = min(len(rp.veus), max_veus)
    fig.update_layout(
        title=f"{rp.model_name} · {rp.policy} rProgram on {rp.vdevice.device}: makespan {rp.makespan_us:.1f} µs "
              f"vs sequential {rp.sequential_us:.1f} µs",
        xaxis_title="time (µs from launch)", yaxis_title=f"vEU (showing {shown} of {len(rp.veus)})",
        yaxis={"autorange": "reversed"}, height=min(900, 240 + 3 * shown), legend_title="kernel",
        margin={"l": 60, "r": 20, "t": 60, "b": 40},
    )
    return fig


def makespan_rows(rp: RProgram) -> list[dict]:
    return [
        {"schedule": "sequential kernels (launch each)", "µs": round(rp.sequential_us, 2)},
        {"schedule": "rProgram (one launch, wavefront)", "µs": round(rp.makespan_us, 2)},
    ]
