"""Partition → plotly figure and tables: one lane per device (its kernels) and one per directed link (its
transfers) over one request's modeled time; the stage, kernel and transfer tables."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative

from engine.partition.model import Partition


def partition_figure(part: Partition) -> go.Figure:
    """Device lanes then link lanes × time (µs); each kernel or transfer a bar with its hover."""
    palette = qualitative.Plotly + qualitative.D3
    pairs = sorted({(t.src, t.dst) for t in part.transfers})
    lanes = [f"device {d}" for d in range(part.devices)] + [f"link {a}→{b}" for a, b in pairs]
    fig = go.Figure()
    for k, slot in enumerate(part.kernels):
        tp = " (tensor-parallel slice)" if slot.tensor_parallel else ""
        fig.add_trace(go.Bar(x=[slot.end_us - slot.start_us], base=[slot.start_us], y=[f"device {slot.device}"],
                             orientation="h", name=slot.kernel, marker_color=palette[k % len(palette)],
                             hovertext=f"{slot.kernel}{tp}<br>{slot.start_us:.2f} → {slot.end_us:.2f} µs",
                             hoverinfo="text", showlegend=False))
    for t in part.transfers:
        fig.add_trace(go.Bar(x=[t.end_us - t.start_us], base=[t.start_us], y=[f"link {t.src}→{t.dst}"],
                             orientation="h", name=t.tensor, marker_color="#888",
                             hovertext=f"{t.tensor}<br>{t.bytes:,} B, {t.us:.2f} µs", hoverinfo="text",
                             showlegend=False))
    fig.update_layout(
        title=f"{part.model_name} on {part.devices} × {part.device} over {part.link.name}: makespan "
              f"{part.makespan_us:.1f} µs vs one device {part.single_device_us:.1f} µs",
        xaxis_title="time (µs, one request, modeled)", barmode="overlay",
        yaxis={"categoryorder": "array", "categoryarray": lanes, "autorange": "reversed"},
        height=200 + 40 * len(lanes), margin={"l": 90, "r": 20, "t": 60, "b": 40})
    return fig


def stage_rows(part: Partition) -> list[dict]:
    return [{"device": s.device, "kernels": len(s.kernels), "weights B": s.weight_bytes, "peak B": s.peak_bytes,
             "budget B": part.budget_bytes, "busy µs": round(s.busy_us, 2)} for s in part.stages]


def kernel_rows(part: Partition) -> list[dict]:
    return [{"kernel": k.kernel, "device": k.device, "start µs": round(k.start_us, 2), "end µs": round(k.end_us, 2),
             "weights B": k.weight_bytes, "tensor parallel": k.tensor_parallel} for k in part.kernels]


def transfer_rows(part: Partition) -> list[dict]:
    return [{"tensor": t.tensor, "from": t.src, "to": t.dst, "bytes": t.bytes, "µs": round(t.us, 3),
             "start µs": round(t.start_us, 2)} for t in part.transfers]
