"""Roofline per memory level: each kernel at (flops / bytes from that level, flops / modeled time),
and beside it at flops / measured time when the plan was run, under the device's peak compute and
that level's bandwidth."""

from __future__ import annotations

import plotly.graph_objects as go

from engine.device import Device
from engine.schedule.plan import Plan

LEVEL_BW = {"dram": "dram_bw_bytes_per_s", "l2": "l2_bw_bytes_per_s", "shared": "smem_bw_bytes_per_s"}


def roofline_points(plan: Plan, level: str, measured_us: dict[str, float] | None = None) -> list[dict]:
    """Kernels with a cost and traffic at `level`: intensity (FLOP/B) and FLOP/s at the modeled time,
    plus a "measured" point at the same intensity for each kernel `measured_us` times."""
    out = []
    for g in plan.groups:
        if not g.cost or not g.cost.traffic_bytes.get(level) or not g.cost.flops:
            continue
        intensity = g.cost.flops / g.cost.traffic_bytes[level]
        times = [("modeled", g.cost.modeled_us), ("measured", (measured_us or {}).get(g.name))]
        for source, us in times:
            if us is not None and us > 0:
                out.append({"kernel": g.name, "intensity": intensity, "flops_per_s": g.cost.flops / (us * 1e-6),
                            "source": source})
    return out


def roofline_figure(plan: Plan, device: Device, level: str,
                    measured_us: dict[str, float] | None = None) -> go.Figure:
    bw = getattr(device, LEVEL_BW[level])
    peak = device.peak_fp32_flops
    points = roofline_points(plan, level, measured_us)
    lo = min([p["intensity"] for p in points] + [0.01]) / 2
    hi = max([p["intensity"] for p in points] + [peak / bw * 4])
    ridge = peak / bw
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[lo, ridge, hi], y=[lo * bw, peak, peak], mode="lines", name=f"{level} roof",
                             line={"color": "#455a64"}))
    for src, symbol in (("modeled", "circle"), ("measured", "diamond")):
        pts = [p for p in points if p["source"] == src]
        if pts:
            fig.add_trace(go.Scatter(x=[p["intensity"] for p in pts], y=[p["flops_per_s"] for p in pts],
                                     mode="markers", name=src, text=[p["kernel"] for p in pts],
                                     marker={"symbol": symbol, "size": 9}, hoverinfo="text+x+y"))
    fig.update_layout(title=f"Roofline, {level} level ({device.name}, datasheet figures)",
                      xaxis={"type": "log", "title": f"FLOP per {level} byte"},
                      yaxis={"type": "log", "title": "FLOP/s"}, height=380,
                      margin={"l": 60, "r": 20, "t": 50, "b": 40})
    return fig
