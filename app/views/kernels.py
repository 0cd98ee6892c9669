"""Per-kernel rows for the Kernels page: what each kernel computes, its launch shape and the terms of
its modeled time next to the measured one."""

from __future__ import annotations

from app.views.fmt import fmt_bytes
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Plan


def kernel_rows(graph: PrimGraph, plan: Plan, measured_us: dict[str, float] | None = None) -> list[dict]:
    rows = []
    for g in plan.groups:
        cost = g.cost
        dram = int(cost.traffic_bytes.get("dram", 0)) if cost else None
        got = (measured_us or {}).get(g.name)
        origins = sorted({o for s in g.stages for o in graph.stage(s).origin})
        rows.append({
            "kernel": g.name,
            "stages": ", ".join(graph.stage(s).op or graph.stage(s).kind.value for s in g.stages),
            "ONNX nodes": ", ".join(origins),
            "grid": g.blocks, "block": g.threads,
            "shared": fmt_bytes(cost.footprint.get("shared", 0)) if cost else "—",
            "DRAM traffic": fmt_bytes(dram) if cost else "—",
            "modeled µs": round(cost.modeled_us, 2) if cost else None,
            "measured µs": round(got, 2) if got is not None else None,
            # Achieved bandwidth only means something against a measured time.
            "achieved GB/s": round(dram / (got * 1e-6) / 1e9, 1) if got and dram else None,
        })
    return rows


def kernel_sources(source: str) -> dict[str, str]:
    """Kernel name -> its code (comment, index tables, function) cut out of a whole printed program;
    {} when the source does not split (the page then shows it whole). The browser highlights one
    kernel at a time: a 20,000-line program in one code block takes it seconds."""
    from engine.codegen.ccompile import split_kernels

    split = split_kernels(source)
    return dict(split[1]) if split else {}


SOURCE_LINES_SHOWN = 300  # per code block unless the user asks for the whole kernel


def clip_source(code: str, lines: int = SOURCE_LINES_SHOWN) -> tuple[str, int]:
    """(the first `lines` lines of `code`, how many lines were left out). The browser highlights a code
    block line by line: efficientnet's and mobilevit's largest kernels are 4,000-5,700 lines of C and as
    many of CUDA, and the Kernels page took 2.7-4.5 s to draw in Chromium on this machine."""
    parts = code.splitlines(keepends=True)
    return "".join(parts[:lines]), max(len(parts) - lines, 0)
