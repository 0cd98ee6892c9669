"""The workbench on real exported models in Debian's Chromium (Playwright), one shared server: upload a
zoo model, open every page, click a kernel in the overview and see its stages, change one of its edges
from the picture's panel, undo, compare against unfused and see the changed kernels and edges
highlighted, run a tune job and see its candidates, export annotated ONNX and load it back with onnx.
Page times are printed, not asserted (the budgets live in benchmarks/bench_app.py). Screenshots land in
tests/e2e/artifacts/ (git-ignored); with UPDATE_SCREENSHOTS=1 convnext's also replace the README's
(docs/screenshots/, scaled to 2/3 and 256 colours):

    UPDATE_SCREENSHOTS=1 .venv/bin/python -m pytest -m browser tests/e2e/test_overview.py -k convnext
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import onnx
import pytest

from e2e.test_workbench import ARTIFACTS, CHROMIUM, ROOT, open_app, wait_idle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (make sys-deps)")]

ZOO = ROOT / "samples" / "zoo"
PAGES = {  # page -> text its content shows once drawn
    "Tile-graph": "node(s) for", "Plan": "Base policy", "Kernels": "Compile + run", "Timeline": "rProgram makespan",
    "Partition": "Makespan (one request)", "Compare": "differ from", "Tuning": "Tuning database",
    "Export": "Export annotated ONNX", "Model": "Min DRAM traffic",
}
DOCS = ROOT / "docs" / "screenshots"
DOC_MODEL = "convnext"  # the model of the README's screenshots


def shoot(page, model: str, name: str) -> None:
    """Screenshot the viewport to artifacts/MODEL_NAME.png; with UPDATE_SCREENSHOTS=1 and the README's
    model, also to docs/screenshots/NAME.png at 2/3 size in 256 colours (what the README shows)."""
    path = ARTIFACTS / f"{model}_{name}.png"
    page.screenshot(path=str(path))
    if model == DOC_MODEL and os.environ.get("UPDATE_SCREENSHOTS") == "1":
        from PIL import Image

        with Image.open(path) as im:
            small = im.convert("RGB").resize((im.width * 2 // 3, im.height * 2 // 3), Image.Resampling.LANCZOS)
            small.quantize(256).save(DOCS / f"{name}.png", optimize=True)


def cuttable_edge(model: Path) -> tuple[int, str, str]:
    """(index of the kernel, producer, consumer) of the first fused edge of the welder plan that the
    engine lets the user cut (set to kernel): what the test will do through the page."""
    from engine.api import apply_edit, load_graph, plan_model
    from engine.device import get_device
    from engine.errors import PlanError
    from engine.schedule.plan import Edit

    device = get_device("a100")
    graph, plan = plan_model(load_graph(model), "welder", device)
    for k, group in enumerate(plan.groups):
        members = set(group.stages)
        for e in plan.edges:
            if e.conn.fused and e.producer in members and e.consumer in members:
                try:
                    apply_edit(plan, graph, device, Edit.make("set_edge", producer=e.producer, consumer=e.consumer,
                                                              conn="kernel"))
                    return k, e.producer, e.consumer
                except PlanError:
                    continue
    pytest.fail(f"no fused edge of {model.name}'s welder plan can be cut")


def click_point(page, trace_name: str, index: int) -> None:
    """Click point `index` of the overview trace named `trace_name` (plotly draws a trace's points as
    path.point inside g.trace; the figure's traces are the lines, then 'kernels', then 'edges')."""
    chart = page.locator('[data-testid="stPlotlyChart"]').first
    traces = chart.locator(".scatterlayer g.trace")
    names = {"kernels": -2, "edges": -1}
    trace = traces.nth(traces.count() + names[trace_name])
    box = trace.locator("path.point").nth(index).bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    wait_idle(page)


def open_page(page, name: str) -> float:
    start = time.perf_counter()
    page.get_by_role("link", name=name, exact=True).click()
    page.get_by_role("heading", name=name).first.wait_for(timeout=120_000)
    page.get_by_text(PAGES[name]).first.wait_for(timeout=120_000)
    wait_idle(page)
    return time.perf_counter() - start


@pytest.mark.parametrize("model", ["convnext", "resnet"])
def test_real_model_overview_edit_compare_export(server, model, tmp_path):
    from playwright.sync_api import sync_playwright

    path = ZOO / f"{model}.onnx"
    kernel_index, producer, consumer = cuttable_edge(path)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        page = open_app(pw, server, 1400, 900, accept_downloads=True)
        page.get_by_text("Upload .onnx").click()
        wait_idle(page)  # the uploader is drawn by this rerun: a file set before it ends may be dropped
        page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(path))
        page.get_by_text(f"{model}.onnx  ·  hash").wait_for(timeout=120_000)
        wait_idle(page)

        times = {}
        for name in PAGES:  # the first visit plans the model (welder): not a page time
            times[name] = open_page(page, name)
            shoot(page, model, name.lower().replace("-", ""))
        print(f"{model}: first visits (s, the first one plans)", {k: round(v, 2) for k, v in times.items()})
        print(f"{model}: second visits (s)", {k: round(open_page(page, k), 2) for k in PAGES})

        # click a kernel in the overview: its stages and side panel open
        open_page(page, "Tile-graph")
        assert page.locator('[data-testid="stGraphVizChart"]').count() == 0  # no stage-level graph by default
        click_point(page, "kernels", kernel_index)
        page.get_by_text("and its neighbours").wait_for(timeout=60_000)
        page.locator('[data-testid="stGraphVizChart"] svg').first.wait_for(timeout=60_000)
        shoot(page, model, "tilegraph")  # the README's Tile-graph picture: a kernel clicked

        # change one of its edges from the panel, then undo
        box = page.locator('[data-testid="stSelectbox"]').filter(has_text="Internal edge").first
        box.click()
        page.keyboard.type(producer)
        page.get_by_role("option").filter(has_text=f"{producer} → {consumer}").first.click()
        wait_idle(page)
        cut = page.locator(".st-key-tg_inner_conn_kernel button:visible").first
        deadline = time.time() + 60  # the panel re-tries every level of the newly picked edge
        while not cut.is_enabled() and time.time() < deadline:
            page.wait_for_timeout(250)
        assert cut.is_enabled(), "cutting the edge is legal (the engine says so) but the button is disabled"
        cut.click()
        wait_idle(page)
        page.get_by_text("· 1 edit(s) ·").first.wait_for(timeout=60_000)
        page.locator(".st-key-tg_undo button:visible").first.click()
        wait_idle(page)
        page.get_by_text("· 0 edit(s) ·").first.wait_for(timeout=60_000)

        # compare against unfused: A (welder) has kernels that unfused splits; unfused's edges that welder fuses
        open_page(page, "Compare")
        page.get_by_text("differ from unfused").first.wait_for(timeout=60_000)
        caption = page.get_by_text("differ from unfused").first.inner_text()
        assert not caption.startswith("0 of"), caption
        page.get_by_role("tab", name="B: unfused").click()
        wait_idle(page)
        changed = page.get_by_text("differ from current plan").first.inner_text()
        assert " 0 of" not in changed.split("and")[1], changed
        page.get_by_text("changed vs compared plan").last.wait_for(timeout=60_000)  # the highlighted edges' legend
        page.get_by_text("changed vs compared plan").last.scroll_into_view_if_needed()
        shoot(page, model, "compare")

        # a measured tune job (K=1) on this CPU: progress, then every candidate's time
        open_page(page, "Tuning")
        k = page.get_by_label("Candidates per kernel (K)")
        k.fill("1")
        k.press("Enter")
        wait_idle(page)
        page.get_by_role("button", name="Run tune job").click()
        page.get_by_role("heading", name="Candidates").wait_for(timeout=600_000)
        wait_idle(page, 600_000)
        assert page.get_by_text("Decisions: tune:").count() > 0
        shoot(page, model, "tuning")

        # export annotated ONNX and load it back
        open_page(page, "Export")
        button = page.get_by_role("button", name="Export annotated ONNX")
        button.wait_for(state="visible", timeout=120_000)
        out = tmp_path / "annotated.onnx"
        with page.expect_download(timeout=120_000) as download:
            button.click()
        download.value.save_as(out)
        page.context.browser.close()
    loaded = onnx.load(str(out))
    kernels = {p.value for n in loaded.graph.node for p in n.metadata_props if p.key == "tileweave.kernel"}
    assert kernels, "no node carries its kernel"
    assert {p.key for p in loaded.metadata_props} >= {"tileweave.plan_hash", "tileweave.policy"}
