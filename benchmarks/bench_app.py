"""Workbench speed, measured through Streamlit's AppTest (the real pages, no browser): every page's
render time after the model is loaded and planned, and the edit -> recompile -> run round trip on the
CPU backend (the plan run once first, as a user would; then a Tile-graph edge edit through the same
validated path as a click and the Kernels page's "Compile + run", recompiling the kernels that changed).

    .venv/bin/python benchmarks/bench_app.py [--sample bert_layer | --model samples/zoo/mobilevit.onnx] [--repeat 3]

A --model file is opened as an upload is (AppTest cannot drive a file uploader: the state the upload
would make is set directly). Cold = first render of the page (its first plan and layout), warm = the same
page again (Streamlit caches keyed on model hash + plan hash). Budgets (issue 14): every page <= 3 s
after load and plan; edit -> recompile -> run <= 10 s. The load + plan time is reported apart.
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
PAGES = ["tilegraph", "plan", "kernels", "timeline", "compare", "export", "model"]
PAGE_BUDGET_S = 3.0
EDIT_RUN_BUDGET_S = 10.0


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
    raise SystemExit("no edge of this plan can be changed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", default="bert_layer")
    ap.add_argument("--model", help="an .onnx file (e.g. samples/zoo/mobilevit.onnx), opened as an upload")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ["TILEWEAVE_CACHE"] = tempfile.mkdtemp(prefix="tw-bench-app-")  # cold compile cache
    import dataclasses

    from streamlit.testing.v1 import AppTest

    from app import services
    from app.state import KEY

    at = AppTest.from_file(APP, default_timeout=900)

    def check(at):
        if at.exception:
            raise SystemExit(f"page raised: {[e.value for e in at.exception]}")
        bad = [e.value for e in at.error if "failed unexpectedly" in e.value]
        if bad:
            raise SystemExit(f"page failed: {bad}")

    if not args.model:
        at.run()
    name = open_model(at, args)
    load_plan = timed(lambda: at.switch_page("pages/plan.py").run())  # import, lower, plan
    check(at)
    rows = [("load + plan (welder)", load_plan, None, None)]
    for page in PAGES:
        if page == "model" and args.model:
            continue  # the Model page's sample picker would replace an uploaded model (its radio is on upload)
        cold = timed(lambda page=page: at.switch_page(f"pages/{page}.py").run())
        check(at)
        warm = [timed(lambda: at.run()) for _ in range(args.repeat)]
        rows.append((f"{page} page", cold, statistics.median(warm), PAGE_BUDGET_S))

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
            raise SystemExit(f"{conn} is not offered for {producer} -> {consumer}")
        button.click().run()

    t_edit = timed(edit)
    check(at)
    if len(at.session_state[KEY].edits) != 1:
        raise SystemExit(f"the edit was not applied: {[e.value for e in at.error]}")
    at.switch_page("pages/kernels.py").run()
    t_run = timed(lambda: at.button(key="kernels_run").click().run())
    check(at)
    verdict = [s.value for s in at.success] + [e.value for e in at.error]
    rows.append((f"edit ({producer} -> {consumer} = {conn}) -> recompile -> run (CPU)", t_edit + t_run, None,
                 EDIT_RUN_BUDGET_S))
    state = at.session_state[KEY]
    after = services.build_plan(loaded.graph, state.model_hash, state.base_policy, state.device,
                                services.edits_key(state.edits), state.batching).plan
    print(f"{name}; AppTest (no browser); {planned.plan.kernels} kernels -> {after.kernels} after the edit; "
          f"median of {args.repeat} warm runs")
    print("| step | cold s | warm s | budget s |")
    print("|---|---:|---:|---:|")
    over = []
    for step, cold, hot, budget in rows:
        warm = "" if hot is None else f"{hot:.2f}"
        print(f"| {step} | {cold:.2f} | {warm} | {'' if budget is None else f'{budget:g}'} |")
        if budget is not None and cold > budget:
            over.append(step)
    print("verdict:", "; ".join(verdict) or "(none shown)")
    print("over budget:", ", ".join(over) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
