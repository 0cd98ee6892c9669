"""The Kernels page's "Verify on the SIMT emulator" result as a verdict line and table rows: the findings
with the printed CUDA line each names, and the bytes each kernel moved under the emulator beside the plan's
modeled traffic. Pure: a services.SimVerifyResult in, strings and plain dicts out."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from app.views.fmt import fmt_bytes
from engine.runtime.simt.report import KINDS

if TYPE_CHECKING:
    from app.services import SimVerifyResult

FINDING_COLUMNS = ("kind", "kernel", "line", "source", "count", "description")
TRAFFIC_COLUMNS = ("kernel", "launches", "global loaded", "global stored", "shared moved", "modeled L2",
                   "modeled DRAM", "modeled shared", "emulated / modeled L2")


def finding_counts(result: SimVerifyResult) -> list[tuple[str, int]]:
    """(kind, distinct findings) in the engine's order of kinds (the CLI's), kinds without findings left out."""
    counts = Counter(f.kind for f in result.findings)
    return [(kind, counts[kind]) for kind in (*KINDS, *sorted(set(counts) - set(KINDS))) if counts[kind]]


def simt_verdict(result: SimVerifyResult, tolerance: float) -> tuple[bool, str]:
    """(ok, one line): launches run, findings per kind (or none), whether the outputs match the reference."""
    launches = f"{result.launches} launch{'es' if result.launches != 1 else ''}"
    if result.stopped:
        launches += f" of {result.planned_launches} (stopped: {result.stopped})"
    counts = finding_counts(result)
    found = ("findings: " + ", ".join(f"{n} {kind}" for kind, n in counts)) if counts else "no findings"
    if result.outputs_match:
        outputs = f"outputs match (max rel err {result.max_rel_err:.2e})"
    else:
        outputs = f"outputs do NOT match (max rel err {result.max_rel_err:.2e} > tolerance {tolerance:.0e})"
    return result.ok, f"cuda-sim: {launches}, {found}, {outputs}"


def simt_finding_rows(result: SimVerifyResult) -> list[dict]:
    """One row per finding: kind, kernel, the printed line (KERNEL.cu:N and its text), occurrences, message."""
    return [{"kind": f.kind, "kernel": f.kernel, "line": f"{f.file}:{f.line}" if f.line else "—",
             "source": f.source.strip(), "count": f.count, "description": f.describe()}
            for f in result.findings]


def simt_traffic_rows(result: SimVerifyResult) -> list[dict]:
    """One row per kernel: global bytes loaded/stored and shared bytes moved under the emulator (requests,
    all launches), the plan's modeled L2/DRAM/shared traffic (every global load and store the model counts
    goes through L2), and emulated global / modeled L2."""
    rows = []
    for k in result.kernels:
        l2 = k.modeled.get("l2")
        rows.append({"kernel": k.kernel, "launches": k.launches,
                     "global loaded": fmt_bytes(k.global_load_bytes), "global stored": fmt_bytes(k.global_store_bytes),
                     "shared moved": fmt_bytes(k.shared_load_bytes + k.shared_store_bytes),
                     "modeled L2": fmt_bytes(l2), "modeled DRAM": fmt_bytes(k.modeled.get("dram")),
                     "modeled shared": fmt_bytes(k.modeled.get("shared")),
                     "emulated / modeled L2": round(k.global_bytes / l2, 3) if l2 else None})
    return rows
