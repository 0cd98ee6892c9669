"""The one way a benchmark script writes its table into benchmarks/RESULTS.md: it owns the block between
`<!-- NAME:begin -->` and `<!-- NAME:end -->` and replaces only that (appended when absent)."""

from __future__ import annotations

from pathlib import Path


def replace_block(path: Path, name: str, text: str) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{begin}\n{text.rstrip(chr(10))}\n{end}"
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)
