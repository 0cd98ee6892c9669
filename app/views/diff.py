"""Two plans of one model side by side: headline numbers, per-group differences, and the diff as
Markdown for export. Groups are matched by their stage sets."""

from __future__ import annotations

from dataclasses import dataclass

from app.views.fmt import fmt_bytes, fmt_us
from engine.schedule.plan import Plan


@dataclass(frozen=True)
class PlanDiff:
    a_label: str
    b_label: str
    headline: tuple[tuple[str, str, str], ...]  # (metric, a, b)
    only_a: tuple[str, ...]  # kernels of A whose stage set B does not have
    only_b: tuple[str, ...]
    changed_groups: tuple[tuple[str, str, str], ...]  # same stages, different (kernel, a, b) numbers
    changed_edges: tuple[tuple[str, str, str], ...]  # (edge, conn in a, conn in b)


def _time(plan: Plan, measured_us: float | None) -> str:
    return fmt_us(measured_us) if measured_us is not None else "not run"


def diff_plans(a: Plan, b: Plan, a_label: str = "A", b_label: str = "B",
               measured: tuple[float | None, float | None] = (None, None)) -> PlanDiff:
    headline = (
        ("policy", a.policy, b.policy),
        ("kernels", str(a.kernels), str(b.kernels)),
        ("DRAM bytes (modeled)", fmt_bytes(a.dram_bytes), fmt_bytes(b.dram_bytes)),
        ("modeled time", fmt_us(a.modeled_us), fmt_us(b.modeled_us)),
        ("measured time", _time(a, measured[0]), _time(b, measured[1])),
        ("edits", str(len(a.edits)), str(len(b.edits))),
    )
    ga = {frozenset(g.stages): g for g in a.groups}
    gb = {frozenset(g.stages): g for g in b.groups}
    only_a = tuple(ga[k].name for k in ga if k not in gb)
    only_b = tuple(gb[k].name for k in gb if k not in ga)
    changed = []
    for key in ga.keys() & gb.keys():
        x, y = ga[key], gb[key]
        tx = (x.segments[0].shape, x.threads, x.cost.modeled_us if x.cost else None)
        ty = (y.segments[0].shape, y.threads, y.cost.modeled_us if y.cost else None)
        if tx != ty:
            changed.append((x.name, _group_text(x), _group_text(y)))
    eb = {e.key: e.conn for e in b.edges}
    edges = tuple((f"{e.producer} → {e.consumer}", e.conn.value, eb[e.key].value)
                  for e in a.edges if e.key in eb and eb[e.key] != e.conn)
    return PlanDiff(a_label, b_label, headline, only_a, only_b, tuple(sorted(changed)), edges)


def _group_text(g) -> str:
    tile = "×".join(map(str, g.segments[0].shape))
    cost = fmt_us(g.cost.modeled_us) if g.cost else "—"
    return f"tile {tile}, {g.threads} threads, {cost}"


def _row(cells) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def diff_to_markdown(d: PlanDiff) -> str:
    lines = [f"# Plan comparison: {d.a_label} vs {d.b_label}", "", _row(["metric", d.a_label, d.b_label]),
             "|---|---|---|"]
    lines += [_row(r) for r in d.headline]
    lines += ["", f"## Kernels only in {d.a_label} ({len(d.only_a)})", ""]
    lines += [f"- {n}" for n in d.only_a] or ["- none"]
    lines += ["", f"## Kernels only in {d.b_label} ({len(d.only_b)})", ""]
    lines += [f"- {n}" for n in d.only_b] or ["- none"]
    lines += ["", "## Same stages, different tile or cost", ""]
    if d.changed_groups:
        lines += [_row(["kernel", d.a_label, d.b_label]), "|---|---|---|"] + [_row(r) for r in d.changed_groups]
    else:
        lines.append("none")
    lines += ["", f"## Edge connections that differ ({len(d.changed_edges)})", ""]
    if d.changed_edges:
        lines += [_row(["edge", d.a_label, d.b_label]), "|---|---|---|"] + [_row(r) for r in d.changed_edges]
    else:
        lines.append("none")
    return "\n".join(lines) + "\n"
