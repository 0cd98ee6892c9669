"""Tuning page tables: a tune report's candidates (per kernel, every measured tile candidate, fastest
first, with whether the tuning database already held it) and its headline numbers. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence


def candidate_rows(candidates: Sequence[dict]) -> list[dict]:
    """One row per (policy, candidate, kernel), grouped by policy and kernel, fastest candidate first;
    `chosen` marks each kernel's fastest."""
    rows = sorted(candidates, key=lambda c: (c["policy"], c["kernel"],
                                             float("inf") if c["measured_us"] is None else c["measured_us"]))
    out, seen = [], set()
    for c in rows:
        key = (c["model"], c["policy"], c["kernel"])
        out.append({"policy": c["policy"], "kernel": c["kernel"], "candidate": c["candidate"], "tiles": c["tiles"],
                    "measured µs": None if c["measured_us"] is None else round(c["measured_us"], 2),
                    "fastest": key not in seen and c["measured_us"] is not None,
                    "from database": "yes" if c["from_db"] else "measured now"})
        seen.add(key)
    return out


def headline(row: dict, tasks: int, hits: int, seconds: float) -> list[tuple[str, str]]:
    """(label, value) metrics of one model/policy row of a tune report."""
    def us(v):
        return "—" if v is None else f"{v:.1f} µs"

    gain = ""
    if row["untuned_us"] and row["tuned_us"]:
        gain = f" ({row['untuned_us'] / row['tuned_us']:.2f}×)"
    return [("Tasks measured", str(tasks)), ("Database hits", f"{hits} kernel(s)"),
            ("Untuned, measured", us(row["untuned_us"])), ("Tuned, measured", us(row["tuned_us"]) + gain),
            ("Wall time", f"{seconds:.1f} s")]
