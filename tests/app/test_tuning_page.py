"""The Tuning page under streamlit.testing AppTest: a tune job of the loaded model on this CPU fills the
candidates table and the tuning database, and a second job is served from the database; the views'
tables are checked on their own."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.views.tuning import candidate_rows, headline

APP = str(Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWEAVE_CACHE", str(tmp_path))
    monkeypatch.delenv("TILEWEAVE_TUNE_DB", raising=False)


def no_traceback(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_tuning_page_runs_a_job_and_the_second_is_served_from_the_database():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.selectbox(key="sample").set_value("masked_softmax").run()
    at.switch_page("pages/tuning.py").run()
    no_traceback(at)
    assert at.info and "Run a tune job" in at.info[0].value
    at.selectbox(key="tune_policy").set_value("stitch").run()
    at.button(key="tune_run").click().run()
    no_traceback(at)
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["Tasks measured"]) > 0
    table = at.dataframe[0].value
    assert len(table) > 0 and table["measured µs"].notna().all() and (table["measured µs"] > 0).all()
    assert set(table["from database"]) == {"measured now"}
    db = at.dataframe[-1].value
    assert list(db["device"]) == ["host"] and db["rows"].iloc[0] >= len(table)
    at.button(key="tune_run").click().run()
    no_traceback(at)
    assert {m.label: m.value for m in at.metric}["Tasks measured"] == "0"
    assert set(at.dataframe[0].value["from database"]) == {"yes"}


def test_a_tune_job_past_its_time_limit_stops_and_says_so_and_the_next_one_finishes():
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.selectbox(key="sample").set_value("masked_softmax").run()
    at.switch_page("pages/tuning.py").run()
    at.selectbox(key="tune_policy").set_value("stitch").run()
    at.number_input(key="tune_run_limit").set_value(0.01).run()
    at.button(key="tune_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    stopped = [e.value for e in at.error]
    assert len(stopped) == 1 and "over its 0.01 s limit" in stopped[0] and "tasks measured" in stopped[0], stopped
    at.number_input(key="tune_run_limit").set_value(600.0).run()
    at.button(key="tune_run").click().run()
    no_traceback(at)
    assert int({m.label: m.value for m in at.metric}["Tasks measured"]) > 0

def test_candidate_rows_put_each_kernels_fastest_first():
    cands = [{"model": "m", "policy": "welder", "candidate": j, "kernel": k, "tiles": f"{j}x4", "measured_us": us,
              "from_db": j == 0, "signature": f"{k}{j}"}
             for k, times in (("k01_b", (3.5, 1.25, None)), ("k00_a", (2.0, 7.0, 4.0))) for j, us in enumerate(times)]
    rows = candidate_rows(cands)
    assert [(r["kernel"], r["candidate"]) for r in rows] == [("k00_a", 0), ("k00_a", 2), ("k00_a", 1),
                                                            ("k01_b", 1), ("k01_b", 0), ("k01_b", 2)]
    assert [r["fastest"] for r in rows] == [True, False, False, True, False, False]
    assert rows[0]["from database"] == "yes" and rows[1]["from database"] == "measured now"
    shown = dict(headline({"untuned_us": 30.0, "tuned_us": 20.0}, 4, 2, 1.5))
    assert shown["Tuned, measured"] == "20.0 µs (1.50×)" and shown["Database hits"] == "2 kernel(s)"
