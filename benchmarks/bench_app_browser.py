"""Workbench page times in a real browser (Debian's Chromium through Playwright) on an uploaded model:
each page's first visit (the first one plans the model) and second visit, click to content drawn.

    .venv/bin/python benchmarks/bench_app_browser.py samples/zoo/mobilevit.onnx

Prints one Markdown table; the budget (issue 14) is <= 3 s per page after the model is loaded and
planned, i.e. the second-visit column and every first visit after the first page.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PAGES = {"Tile-graph": "node(s) for", "Plan": "Base policy", "Kernels": "Compile + run", "Timeline": "rProgram makespan",
         "Compare": "differ from", "Export": "Export annotated ONNX", "Model": "Min DRAM traffic"}


def main() -> int:
    from e2e.test_workbench import ARGS, CHROMIUM, start_app, wait_idle
    from playwright.sync_api import sync_playwright

    model = Path(sys.argv[1]).resolve()
    proc, url = start_app(Path(tempfile.mkdtemp(prefix="tw-bench-browser-")))
    rows = {}
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url, wait_until="networkidle")
            page.get_by_text("Min DRAM traffic").wait_for(timeout=120_000)
            page.get_by_text("Upload .onnx").click()
            page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(model))
            page.get_by_text(f"{model.name}  ·  hash").wait_for(timeout=300_000)
            wait_idle(page)
            for _visit in ("first", "second"):
                for name, marker in PAGES.items():
                    print(f"{_visit} visit: {name}", file=sys.stderr, flush=True)
                    start = time.perf_counter()
                    page.get_by_role("link", name=name, exact=True).click()
                    page.get_by_role("heading", name=name).first.wait_for(timeout=300_000)
                    page.get_by_text(marker).first.wait_for(timeout=300_000)
                    wait_idle(page, 300_000)
                    rows.setdefault(name, []).append(time.perf_counter() - start)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print(f"{model.name}: Chromium (headless), click -> page drawn and idle")
    print("| page | first visit s | second visit s |")
    print("|---|---:|---:|")
    for name, (first, second) in rows.items():
        print(f"| {name} | {first:.2f} | {second:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
