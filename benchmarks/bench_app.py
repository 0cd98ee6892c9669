"""Workbench speed, measured through Streamlit's AppTest (the real pages, no browser): every page's
render time after the model is loaded and planned, and the edit -> recompile -> run round trip on the
CPU backend (the plan run once first, as a user would; then a Tile-graph edge edit through the same
validated path as a click, the Kernels page opened on the edited plan and its "Compile + run",
recompiling the kernels that changed).

    .venv/bin/python benchmarks/bench_app.py [--sample bert_layer | --model samples/zoo/*.onnx] [--repeat 3]

A --model file is opened as an upload is (AppTest cannot drive a file uploader: the state the upload
would make is set directly). Several --model files run one after another, each in a process of its own
(cold Streamlit caches and a cold compile cache, as a fresh server would have), and a page x model table
follows their tables. Cold = first render of the page (its first plan and layout), warm = the same page
again (Streamlit caches keyed on model hash + plan hash). Budgets (issue 14): every page <= 2.5 s cold
and warm after load and plan; edit -> recompile -> run <= 10 s. The load + plan time and the first
compile + run are reported apart (no budget).

Exit status: 0 when every step is within its budget; 1 when any is over (those rows are marked
**OVER** in the tables and listed on the last line, "over budget: ..."); 2 for bad arguments (a
--model that is not a file); 3 when a page raised or showed an unexpected failure (the model's table
is not printed; other models still run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
APP = str(ROOT / "app" / "streamlit_app.py")
PAGES = ["tilegraph", "plan", "kernels", "timeline", "partition", "compare", "tuning", "export", "model"]
PAGE_BUDGET_S = 2.5
EDIT_RUN_BUDGET_S = 10.0
EXIT_OVER, EXIT_USAGE, EXIT_FAILED = 1, 2, 3


class PageFailed(Exception):
    """A page raised or showed an unexpected failure."""


def over_budget(row) -> bool:
    _step, cold, warm, budget = row
    return budget is not None and max(cold, warm or 0.0) > budget


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def open_model(at, args) -> str:
    """Make the sample or model file current; its name."""
    if args.model:
        import dataclasses

        import engine.api as api
        from app.state import KEY, AppState

        path = str(Path(args.model).resolve())
        model_hash = api.lower(api.import_onnx(path)).structural_hash
        at.session_state[KEY] = dataclasses.replace(AppState(), model_name=Path(path).name, model_path=path,
                                                    model_hash=model_hash, restored_for=model_hash)
        return Path(path).name
    at.selectbox(key="sample").set_value(args.sample).run()
    return args.sample


def first_legal_edit(at, graph, plan, model_hash: str):
    """The first edge between kernels a click could fuse (a legal non-kernel level), else the first
    fused edge set to kernel: (producer, consumer, conn)."""
    from app import services
    from engine.errors import TileweaveError
    from engine.schedule.plan import Edit

    state = at.session_state["tileweave_state"]
    group_at = {s: g.id for g in plan.groups for s in g.stages}
    for e in plan.edges:
        if group_at[e.producer] != group_at[e.consumer]:
            for conn, rule in services.legal_connections(graph, model_hash, state.base_policy, state.device, (),
                                                         state.batching, e.producer, e.consumer):
                if not rule and conn != "kernel":
                    return e.producer, e.consumer, conn
    for e in plan.edges:
        if e.conn.fused:
            try:
                services.check_edits(graph, model_hash, state.base_policy, state.device, (Edit.make(
                    "set_edge", producer=e.producer, consumer=e.consumer, conn="kernel"),), state.batching)
                return e.producer, e.consumer, "kernel"
            except TileweaveError:
                continue
    raise PageFailed("no edge of this plan can be changed")


def bench_model(args, model: str | None) -> tuple[str, list[tuple]]:
    """(title line, rows (step, cold s, warm s or None, budget s or None)) of one sample or model file."""
    import dataclasses

    from streamlit.testing.v1 import AppTest

    from app import services
    from app.state import KEY

    args = argparse.Namespace(**(vars(args) | {"model": model}))
    at = AppTest.from_file(APP, default_timeout=900)

    def check(at):
        if at.exception:
            raise PageFailed(f"page raised: {[e.value for e in at.exception]}")
        bad = [e.value for e in at.error if "failed unexpectedly" in e.value]
        if bad:
            raise PageFailed(f"page failed: {bad}")

    if not args.model:
        at.run()
    name = open_model(at, args)
    load_plan = timed(lambda: at.switch_page("pages/plan.py").run())  # import, lower, plan
    check(at)
    rows = [("load + plan (welder)", load_plan, None, None)]
    for page in PAGES:
        cold = timed(lambda page=page: at.switch_page(f"pages/{page}.py").run())
        check(at)
        warm = [timed(lambda: at.run()) for _ in range(args.repeat)]
        rows.append((f"{page} page", cold, statistics.median(warm), PAGE_BUDGET_S))
    if args.model and at.session_state[KEY].model_path != str(Path(args.model).resolve()):
        raise PageFailed("the Model page replaced the uploaded model")

    # Edit -> recompile -> run: an edge edit as the Tile-graph click makes it, then Compile + run.
    state = at.session_state[KEY]
    loaded = services.load_model(state.model_path, services.file_digest(state.model_path))
    planned = services.build_plan(loaded.graph, state.model_hash, state.base_policy, state.device, "[]",
                                  state.batching)
    producer, consumer, conn = first_legal_edit(at, loaded.graph, planned.plan, state.model_hash)
    # A user runs the plan before editing it: the edit's run recompiles only the kernels that changed.
    at.switch_page("pages/kernels.py").run()
    t_first = timed(lambda: at.button(key="kernels_run").click().run())
    check(at)
    rows.append(("first compile + run of the plan (CPU, cold compile cache)", t_first, None, None))
    at.switch_page("pages/tilegraph.py").run()

    def edit():
        if conn != "kernel":  # an edge between kernels: the click selects it, its panel offers the levels
            at.session_state[KEY] = dataclasses.replace(at.session_state[KEY], selection=("edge", producer, consumer))
            at.run()
            button = at.button(key=f"tg_conn_{conn}")
        else:  # no fusable edge between kernels: cut a fused one from its kernel's panel
            at.session_state[KEY] = dataclasses.replace(at.session_state[KEY], selection=("kernel", producer))
            at.run()
            inner = at.selectbox(key="tg_inner")
            inner.set_value(next(o for o in inner.options if o.startswith(f"{producer} → {consumer}  ["))).run()
            button = at.button(key="tg_inner_conn_kernel")
        if button.disabled:
            raise PageFailed(f"{conn} is not offered for {producer} -> {consumer}")
        button.click().run()

    t_edit = timed(edit)
    check(at)
    if len(at.session_state[KEY].edits) != 1:
        raise PageFailed(f"the edit was not applied: {[e.value for e in at.error]}")
    t_open = timed(lambda: at.switch_page("pages/kernels.py").run())  # the edited plan's kernel table and source
    check(at)
    t_run = timed(lambda: at.button(key="kernels_run").click().run())
    check(at)
    verdict = [s.value for s in at.success] + [e.value for e in at.error]
    rows.append((f"edit ({producer} -> {consumer} = {conn}) -> recompile -> run (CPU)", t_edit + t_open + t_run,
                 None, EDIT_RUN_BUDGET_S))
    print(f"edit round trip: edit {t_edit:.2f} s, Kernels page {t_open:.2f} s, compile + run {t_run:.2f} s",
          file=sys.stderr)
    state = at.session_state[KEY]
    after = services.build_plan(loaded.graph, state.model_hash, state.base_policy, state.device,
                                services.edits_key(state.edits), state.batching).plan
    title = (f"{name}; AppTest (no browser); {planned.plan.kernels} kernels -> {after.kernels} after the edit; "
             f"median of {args.repeat} warm runs; verdict: {'; '.join(verdict) or '(none shown)'}")
    return title, rows


def print_rows(title: str, rows: list[tuple]) -> None:
    print(title)
    print("| step | cold s | warm s | budget s |")
    print("|---|---:|---:|---:|")
    for row in rows:
        step, cold, hot, budget = row
        mark = " **OVER**" if over_budget(row) else ""
        warm = "" if hot is None else f"{hot:.2f}"
        print(f"| {step}{mark} | {cold:.2f} | {warm} | {'' if budget is None else f'{budget:g}'} |")
    print(flush=True)


def short_step(step: str) -> str:
    return step.split(" (")[0].removesuffix(" page")


def print_summary(results: dict[str, list[tuple] | str]) -> None:
    """One row per model: each page's cold / warm s, then load + plan, first run and the edit round trip."""
    steps = [short_step(s) for s, *_ in next((r for r in results.values() if not isinstance(r, str)), [])]
    print("| model | " + " | ".join(steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for model, rows in results.items():
        if isinstance(rows, str):
            print(f"| {model} | {rows} |" + " |" * (len(steps) - 1))
            continue
        cells = []
        for row in rows:
            _step, cold, hot, _budget = row
            cell = f"{cold:.2f}" if hot is None else f"{cold:.2f} / {hot:.2f}"
            cells.append(f"**{cell} OVER**" if over_budget(row) else cell)
        print(f"| {model} | " + " | ".join(cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", default="bert_layer")
    ap.add_argument("--model", nargs="+", metavar="ONNX",
                    help=".onnx files (e.g. samples/zoo/*.onnx), each opened as an upload in a process of its own")
    ap.add_argument("--repeat", type=int, default=3, help="warm runs per page (the median is reported)")
    ap.add_argument("--rows-json", help=argparse.SUPPRESS)  # a child's rows for the parent's summary
    args = ap.parse_args()
    for path in args.model or []:
        if not Path(path).is_file():
            print(f"error: --model {path}: no such file", file=sys.stderr)
            return EXIT_USAGE
    if args.model and len(args.model) > 1:
        return bench_many(args)
    os.environ["TILEWEAVE_CACHE"] = tempfile.mkdtemp(prefix="tw-bench-app-")  # cold compile cache
    try:
        title, rows = bench_model(args, args.model[0] if args.model else None)
    except PageFailed as err:
        print(f"{args.model[0] if args.model else args.sample}: {err}", file=sys.stderr)
        return EXIT_FAILED
    print_rows(title, rows)
    if args.rows_json:
        Path(args.rows_json).write_text(json.dumps(rows))
    over = [step for step, *rest in rows if over_budget((step, *rest))]
    print("over budget:", ", ".join(over) or "none")
    return EXIT_OVER if over else 0


def bench_many(args) -> int:
    """Each model in a child process of its own; their tables as they finish, then the summary."""
    results: dict[str, list[tuple] | str] = {}
    failed = False
    for path in args.model:
        name = Path(path).stem
        out = Path(tempfile.mkdtemp(prefix="tw-bench-rows-")) / "rows.json"
        print(f"## {name}", flush=True)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--model", path, "--repeat", str(args.repeat),
                               "--rows-json", str(out)], check=False)
        print(f"({name}: {time.perf_counter() - start:.0f} s in all)\n", flush=True)
        if done.returncode in (0, EXIT_OVER) and out.exists():
            results[name] = [tuple(r) for r in json.loads(out.read_text())]
        else:
            results[name] = f"failed (exit {done.returncode})"
            failed = True
    print(f"cold / warm s per page (budget {PAGE_BUDGET_S:g} s each), edit -> recompile -> run "
          f"(budget {EDIT_RUN_BUDGET_S:g} s); load + plan and the first compile + run have no budget")
    print_summary(results)
    over = [f"{m}: {short_step(r[0])}" for m, rows in results.items() if not isinstance(rows, str)
            for r in rows if over_budget(r)]
    print("over budget:", ", ".join(over) or "none")
    if failed:
        print("failed:", ", ".join(m for m, r in results.items() if isinstance(r, str)))
        return EXIT_FAILED
    return EXIT_OVER if over else 0


if __name__ == "__main__":
    sys.exit(main())
