"""The Partition page under AppTest (the current plan over N devices and a link), and its pure views."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))


def test_partition_page_shows_devices_transfers_and_timeline():
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    at.selectbox(key="sample").set_value("bert_layer").run()
    at.switch_page("pages/partition.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert {"Makespan (one request)", "One device", "Period (a stream)"} <= {m.label for m in at.metric}
    devices = at.dataframe[0].value
    assert list(devices["device"]) == [0, 1]
    transfers = at.dataframe[2].value
    assert len(transfers) >= 1 and set(transfers["from"]) | set(transfers["to"]) <= {0, 1}
    at.number_input(key="partition_devices").set_value(3).run()
    at.selectbox(key="partition_link").set_value("ethernet").run()
    assert not at.exception, [e.value for e in at.exception]
    assert list(at.dataframe[0].value["device"]) == [0, 1, 2]
    assert "ethernet" in at.caption[0].value


def test_partition_figure_has_a_lane_per_device_and_link():
    from support import sample_path

    from app.views.partition import partition_figure
    from engine.frontend.importer import load_graph
    from engine.partition.plan import partition_model
    from engine.schedule.pipeline import plan_model

    graph, plan = plan_model(load_graph(sample_path("bert_layer"), {}), "welder", "a100")
    part = partition_model(graph, plan, "a100", 2, "pcie")[2]
    fig = partition_figure(part)
    lanes = {y for t in fig.data for y in t.y}
    assert lanes == {"device 0", "device 1"} | {f"link {t.src}→{t.dst}" for t in part.transfers}
    assert len(fig.data) == len(part.kernels) + len(part.transfers)
