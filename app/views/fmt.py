"""Number formatting shared by the views: bytes, counts, shapes, microseconds."""

from __future__ import annotations


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def fmt_count(n: float | int | None) -> str:
    if n is None:
        return "—"
    n = float(n)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f}"


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(d) for d in shape) if shape else "scalar"


def fmt_us(us: float | None) -> str:
    if us is None:
        return "—"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"
