"""Writes the generated section of docs/reliability.md (between `<!-- report:start -->` and
`<!-- report:end -->`): the hostile corpus through the CLI (exit code, one line, the expected phrase),
the edit fuzzer's outcomes and runs per target, and the graph fuzzer's examples when that suite exists.

    python tests/data/reliability_report.py [--sequences 400] [--sim-runs 30]

Not run by CI; takes a few minutes on two cores."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "reliability.md"
START, END = "<!-- report:start -->", "<!-- report:end -->"
GRAPH_FUZZ = ROOT / "tests" / "engine" / "test_fuzz_graphs.py"
sys.path.insert(0, str(ROOT))
for folder in ("tests", "tests/engine", "tests/engine/schedule"):  # after ROOT: tests/engine must not shadow engine
    sys.path.append(str(ROOT / folder))


def run_hostile() -> tuple[list[dict], float]:
    """Every corpus file through `engine.cli.main` in a scratch cwd/HOME/cache: one row per file."""
    from test_hostile import ENTRIES, cli_argv

    from engine.cli import main

    rows, started = [], time.perf_counter()
    saved = os.getcwd(), {k: os.environ.get(k) for k in ("HOME", "TILEWEAVE_CACHE")}
    try:
        for entry in ENTRIES:
            with tempfile.TemporaryDirectory() as tmp:
                for name in ("work", "home", "cache", "out"):
                    Path(tmp, name).mkdir()
                os.chdir(Path(tmp, "work"))
                os.environ.update(HOME=str(Path(tmp, "home")), TILEWEAVE_CACHE=str(Path(tmp, "cache")))
                err, out = io.StringIO(), io.StringIO()
                t0 = time.perf_counter()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                    try:
                        code = main(cli_argv(entry, Path(tmp, "out", "o.npz")))
                    except BaseException as exc:  # noqa: BLE001 - a crash is an outcome to report
                        code = f"raised {type(exc).__name__}"
                lines = err.getvalue().strip().splitlines()
                wrote = any(Path(tmp, "out").iterdir()) or any(Path(tmp, "work").iterdir())
                rows.append({"file": entry["file"], "kind": entry["kind"], "code": code,
                             "one_line": len(lines) == 1 and lines[0].startswith("error: "),
                             "phrase": bool(lines) and entry["expect"] in lines[-1], "wrote": wrote,
                             "line": lines[-1] if lines else "", "seconds": time.perf_counter() - t0})
    finally:
        os.chdir(saved[0])
        for k, v in saved[1].items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return rows, time.perf_counter() - started


def run_edit_fuzz(sequences: int, sim_runs: int):
    """The edit fuzzer with every edited final plan on the CPU backend and the reference, and the first
    `sim_runs` of them on the small graphs through cuda-sim."""
    from edit_fuzz import Tally, fuzz_sequence, sequence_st
    from hypothesis import HealthCheck, given, settings

    from engine.device import get_device

    device, tally, started = get_device("a100"), Tally(), time.perf_counter()

    @settings(max_examples=sequences, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(seq=sequence_st)
    def one(seq):
        small = seq["graph"] in ("attn", "qkv", "masked_softmax")
        sim = ("cuda-sim",) if small and tally.runs["cuda-sim", "pass"] + tally.runs["cuda-sim", "fail"] < sim_runs else ()
        fuzz_sequence(seq, device, tally, ("cpu", "reference") + sim)

    one()
    return tally, time.perf_counter() - started


def run_graph_fuzz() -> tuple[str, float, int]:
    """pytest on the graph fuzzer (if present; default profile) with hypothesis statistics: its summary
    lines, seconds and pytest's exit code."""
    if not GRAPH_FUZZ.exists():
        return "", 0.0, 0
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "--hypothesis-show-statistics",
                           str(GRAPH_FUZZ.relative_to(ROOT))], cwd=ROOT, capture_output=True, text=True, timeout=900)
    keep = [ln.rstrip() for ln in proc.stdout.splitlines()
            if re.search(r"::|passing|failing|invalid|Stopped because| passed| failed", ln)]
    return "\n".join(keep), time.perf_counter() - started, proc.returncode


def render(hostile, hostile_s, tally, fuzz_s, graph_text, graph_s, argv) -> str:
    out = [START, "", "## Generated report", "",
           f"Reproduce: `{' '.join(['python tests/data/reliability_report.py', *argv])}` (rewrites this section; "
           f"generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).", "",
           "### Hostile corpus through the CLI", "",
           f"{len(hostile)} files from `tests/data/bad/` through `engine.cli.main` (the commands of "
           f"`tests/engine/test_hostile.py`), {hostile_s:.1f} s in all.", "",
           "| kind | files | exit code 2 | one `error:` line | expected phrase | wrote nothing | slowest |",
           "|---|---|---|---|---|---|---|"]
    for kind in ("model", "plan", "bundle", "device"):
        rows = [r for r in hostile if r["kind"] == kind]
        out.append(f"| {kind} | {len(rows)} | {sum(r['code'] == 2 for r in rows)} | {sum(r['one_line'] for r in rows)} | "
                   f"{sum(r['phrase'] for r in rows)} | {sum(not r['wrote'] for r in rows)} | "
                   f"{max(r['seconds'] for r in rows):.2f} s |")
    bad = [r for r in hostile if r["code"] != 2 or not r["one_line"] or not r["phrase"] or r["wrote"]]
    out += ["", f"Files not refused as expected: {len(bad)}." + "".join(
        f"\n- `{r['file']}`: exit {r['code']}, `{r['line'][:160]}`" for r in bad), "",
        "<details><summary>every file and its line</summary>", "", "| file | kind | exit | line |", "|---|---|---|---|"]
    for r in hostile:
        line = r["line"].replace("|", "\\|")[:200]
        out.append(f"| `{r['file']}` | {r['kind']} | {r['code']} | {line} |")
    out += ["", "</details>", "", "### Edit fuzzer", "",
            "`tests/engine/schedule/edit_fuzz.py` (run by `test_edits.py`: 40 sequences by default, 1500 under "
            "`-m slow`). Random sequences of 1-5 edits (set_edge at each level, split, merge, set_tile) on the "
            "unfused, stitch or welder plan, operator batching on or off, for a100 / v100 / rtx3090 / h100, over "
            + ", ".join(f"{g} ({n})" for g, n in sorted(tally.graphs.items())) + f" sequences; {fuzz_s:.0f} s.", "",
            f"- edits: {tally.edits}; applied {tally.applied} ({100 * tally.applied_share:.0f} %): "
            + ", ".join(f"{k} {v}" for k, v in sorted(tally.kinds.items())),
            "- refused, by rule: " + ", ".join(f"{k} {v}" for k, v in tally.refused.most_common()),
            f"- refusals naming no rule: {len(tally.unnamed)}", "",
            "| target | edited plans run | match onnxruntime (<= 1e-3 rel.) |", "|---|---|---|"]
    for target in ("cpu", "reference", "cuda-sim"):
        n = tally.runs[target, "pass"] + tally.runs[target, "fail"]
        out.append(f"| {target} | {n} | {tally.runs[target, 'pass']} |")
    out += ["", "`reference` runs the graph the plan was made on (operator-batched or not) without the plan; "
            "`cpu` and `cuda-sim` run the edited plan's generated code. Inputs are random normals, never zeros.",
            ""] + [f"- mismatch: {f[:300]}" for f in tally.failures] + [f"- unnamed: {u[:300]}" for u in tally.unnamed]
    out += ["### Graph fuzzer", ""]
    if graph_text:
        out += [f"`{GRAPH_FUZZ.relative_to(ROOT)}` with `--hypothesis-show-statistics` ({graph_s:.0f} s):", "",
                "```", graph_text, "```"]
    else:
        out += [f"`{GRAPH_FUZZ.relative_to(ROOT)}` is not in this checkout; the report lists it once it is."]
    return "\n".join(out + ["", END])


def write_section(text: str) -> None:
    doc = DOC.read_text()
    if START in doc and END in doc:
        doc = doc[:doc.index(START)] + text + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=400, help="edit fuzzer sequences (default 400)")
    ap.add_argument("--sim-runs", type=int, default=30, help="edited plans also run through cuda-sim (default 30)")
    args = ap.parse_args(argv)
    hostile, hostile_s = run_hostile()
    print(f"hostile: {len(hostile)} files, {hostile_s:.1f} s", flush=True)
    tally, fuzz_s = run_edit_fuzz(args.sequences, args.sim_runs)
    print(f"edit fuzz: {tally.edits} edits, {tally.applied_share:.0%} applied, runs {dict(tally.runs)}, {fuzz_s:.0f} s",
          flush=True)
    graph_text, graph_s, graph_rc = run_graph_fuzz()
    given = list(argv if argv is not None else sys.argv[1:])
    graph_text += f"\n(pytest exit code {graph_rc})" if graph_text else ""
    write_section(render(hostile, hostile_s, tally, fuzz_s, graph_text, graph_s, given))
    print(f"wrote {DOC.relative_to(ROOT)}")
    bad = [r for r in hostile if r["code"] != 2 or not r["one_line"] or not r["phrase"] or r["wrote"]]
    return 1 if bad or tally.failures or tally.unnamed or graph_rc else 0


if __name__ == "__main__":
    raise SystemExit(main())
