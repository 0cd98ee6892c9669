"""Workbench speed on a sample (default bert_layer), measured through Streamlit's AppTest (the real
pages, no browser): Model page and Tile-graph page render times, and the edit -> recompile -> run
round trip on the CPU backend (Plan page edit, then the Kernels page's "Compile + run" button).

    .venv/bin/python benchmarks/bench_app.py [--sample bert_layer] [--repeat 3]

Cold = first render in a fresh process with an empty compile cache (what a new user sees); warm =
the same page again (Streamlit caches keyed on model hash + plan hash). Targets (issue 6): Model and
Tile-graph pages <= 3 s; edit -> recompile -> run <= 10 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
APP = str(ROOT / "app" / "streamlit_app.py")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", default="bert_layer")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ["TILEWEAVE_CACHE"] = tempfile.mkdtemp(prefix="tw-bench-app-")  # cold compile cache
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=600)
    rows = []

    def check(at):
        if at.exception:
            raise SystemExit(f"page raised: {[e.value for e in at.exception]}")

    cold_model = timed(lambda: at.run())
    t = timed(lambda: at.selectbox(key="sample").set_value(args.sample).run())
    check(at)
    rows.append(("Model page (app start + load sample)", cold_model + t, None))
    warm = [timed(lambda: at.run()) for _ in range(args.repeat)]
    rows[-1] = (rows[-1][0], rows[-1][1], statistics.median(warm))

    cold_tg = timed(lambda: at.switch_page("pages/tilegraph.py").run())
    check(at)
    warm = [timed(lambda: at.run()) for _ in range(args.repeat)]
    rows.append(("Tile-graph page (welder plan, DOT)", cold_tg, statistics.median(warm)))

    # Edit -> recompile -> run: switch one fused edge to kernel on the Plan page, then run on the CPU.
    at.switch_page("pages/plan.py").run()
    check(at)
    plan_caption = at.caption[0].value
    edge = at.selectbox(key="plan_edge")

    def edit():
        edge.set_value(edge.options[0].split("  [")[0])  # options are "p → c  [conn]" labels
        at.selectbox(key="plan_conn").set_value("kernel")
        at.button[0].click().run()

    t_edit = timed(edit)
    check(at)
    if "1 edit(s)" not in at.caption[0].value:
        raise SystemExit(f"the edit was not applied: {[e.value for e in at.error]}")
    at.switch_page("pages/kernels.py").run()
    t_run = timed(lambda: at.button(key="kernels_run").click().run())
    check(at)
    verdict = [s.value for s in at.success] + [e.value for e in at.error]
    rows.append(("edit -> recompile -> run (CPU backend)", t_edit + t_run, None))

    print(f"sample {args.sample}; AppTest (no browser); plan: {plan_caption}; "
          f"median of {args.repeat} warm runs")
    print("| step | cold s | warm s | target s |")
    print("|---|---:|---:|---:|")
    targets = [3, 3, 10]
    for (name, cold, hot), target in zip(rows, targets):
        print(f"| {name} | {cold:.2f} | {'' if hot is None else f'{hot:.2f}'} | {target} |")
    print("verdict:", "; ".join(verdict) or "(none shown)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
