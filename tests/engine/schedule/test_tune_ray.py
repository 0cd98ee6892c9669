"""engine/schedule/farm.py on an embedded Ray (two CPUs, one host_cpu; one Ray for the module): a real
tune of two samples on the host, a second run served from the database, and a job whose compile worker
and measure worker are each killed mid-task that still completes with every result recorded once and
the plan the in-process run chooses from the same timings."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import ray
from support import sample_path

from engine.device import get_device
from engine.schedule.farm import start_ray, tune_models
from engine.schedule.measure import Compiled
from engine.schedule.tunedb import TuneDB
from engine.schedule.validate import validate

SAMPLES = [str(sample_path("masked_softmax")), str(sample_path("layernorm_residual"))]


@pytest.fixture(scope="module", autouse=True)
def embedded_ray(tmp_path_factory):
    """One embedded Ray for the module (a few seconds to start); its workers inherit this cache folder."""
    if ray.is_initialized():
        ray.shutdown()
    old = os.environ.get("TILEWEAVE_CACHE")
    os.environ["TILEWEAVE_CACHE"] = str(tmp_path_factory.mktemp("ray-cache"))
    address = os.environ.pop("RAY_ADDRESS", None)  # ray.init would join that cluster instead
    ray.init(num_cpus=2, resources={"host_cpu": 1}, include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=128 << 20)
    yield
    ray.shutdown()
    if address is not None:
        os.environ["RAY_ADDRESS"] = address
    if old is None:
        os.environ.pop("TILEWEAVE_CACHE", None)
    else:
        os.environ["TILEWEAVE_CACHE"] = old


def test_tune_on_ray_measures_on_the_host_and_a_second_run_measures_nothing(tmp_path):
    assert "2 CPU(s)" in start_ray() and "1 host_cpu" in start_ray()
    seen: list = []
    with TuneDB(tmp_path / "t.sqlite") as db:
        report = tune_models(SAMPLES, "host", k=2, db=db, progress=lambda *a: seen.append(a))
        assert report.tasks > 0 and report.hits == 0 and "Ray" in report.where
        assert seen[0] == (0, report.tasks, 0) and seen[-1] == (report.tasks, report.tasks, 0)
        device = get_device("host")
        for job, plan in zip(report.jobs, report.plans):
            assert not validate(plan, job.graph, device)
            assert all(g.measured_us is not None and g.measured_us > 0 for g in plan.groups)
        rows = db.rows()
        assert len(rows) == sum(len(t.signatures) for job in report.jobs for t in job.tasks)
        assert len({r.worker for r in rows}) >= 1 and all(r.worker.split(":")[1] != str(os.getpid()) for r in rows)
        again = tune_models(SAMPLES, "host", k=2, db=db)
        assert again.tasks == 0 and again.hits > 0 and db.count() == len(rows)
        assert [p.groups for p in again.plans] == [p.groups for p in report.plans]


def fake_compile(marker: Path):
    """No C compiler (fast): the variant as it is. The first call kills its own worker process."""
    def compile_fn(graph, plan, device):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            os.kill(os.getpid(), signal.SIGKILL)
        except FileExistsError:
            pass
        return Compiled(plan, None)
    return compile_fn


def fake_time(marker: Path | None):
    """Each kernel's modeled time, scaled by its stage count (deterministic). With a marker, the first call
    kills its own process: the measure actor."""
    def time_fn(graph, compiled, device, repeat, **_):
        if marker is not None:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                os.kill(os.getpid(), signal.SIGKILL)
            except FileExistsError:
                pass
        return {g.name: g.cost.modeled_us * (1 + 0.3 * len(g.stages)) for g in compiled.plan.groups}
    return time_fn


def test_a_job_survives_killed_workers_and_records_each_result_once(tmp_path):
    killed_compile, killed_measure = tmp_path / "compile-killed", tmp_path / "measure-killed"
    with TuneDB(tmp_path / "ray.sqlite") as db:
        report = tune_models(SAMPLES, "host", k=2, db=db, policies=("welder", "stitch"),
                             compile_fn=fake_compile(killed_compile), time_fn=fake_time(killed_measure))
        assert killed_compile.exists() and killed_measure.exists()  # both workers really died once
        tasks = [t for job in report.jobs for t in job.tasks]
        rows = db.rows()
        assert len(rows) == sum(len(t.signatures) for t in tasks)  # every task recorded, none twice
        assert {r.task_id for r in rows} == {t.task_id for t in tasks}
        assert len({(r.task_id, r.kernel) for r in rows}) == len(rows)
    with TuneDB(tmp_path / "local.sqlite") as db:
        local = tune_models(SAMPLES, "host", k=2, db=db, policies=("welder", "stitch"), local=True,
                            compile_fn=fake_compile(killed_compile), time_fn=fake_time(None))
    assert local.tasks == report.tasks
    assert [p.groups for p in local.plans] == [p.groups for p in report.plans]


def test_an_engine_error_in_a_task_comes_back_as_its_one_line(tmp_path):
    from engine.errors import CompileError

    def compile_fn(graph, plan, device):
        raise CompileError(f"C program {plan.policy} failed to compile: a test says so")

    with TuneDB(tmp_path / "t.sqlite") as db:
        with pytest.raises(CompileError, match="failed to compile: a test says so"):
            tune_models(SAMPLES[:1], "host", k=1, db=db, compile_fn=compile_fn, time_fn=fake_time(None))
        assert db.count() == 0


def test_a_gpu_device_on_a_ray_without_gpus_is_one_line(tmp_path):
    from engine.errors import BackendError

    with TuneDB(tmp_path / "t.sqlite") as db:
        with pytest.raises(BackendError, match="the Ray cluster has no GPU to measure on"):
            tune_models(SAMPLES[:1], "a100", k=1, db=db)
