"""Planning holds Python's cyclic garbage collector off (`policies.gc_paused`) and leaves it as it found it;
the searches make no reference cycles, so nothing planning makes waits for a full collection."""

from __future__ import annotations

import gc
import threading

import pytest
from support import sample_path

from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.memo import Caches
from engine.schedule.pipeline import plan_model
from engine.schedule.policies import gc_paused


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_pause_nests_and_restores(collector):
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer plan is still under way
    assert gc.isenabled()
    gc.disable()  # a caller that turned it off keeps it off
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_pause_counts_plans_on_other_threads(collector):
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other thread's plan is still under way
    release.set()
    t.join(10)
    assert gc.isenabled()


@pytest.mark.parametrize("sample,device", [("bert_layer", "host"), ("mobilenetv2_block", "a100"),
                                           ("lstm", "host")])
def test_planning_leaves_no_cycles(collector, sample, device):
    graph = load_graph(sample_path(sample))
    gc.enable()
    gc.collect()
    with Caches().active():  # every search runs: a cold plan
        _, plan = plan_model(graph, "welder", get_device(device))
    assert gc.isenabled()
    assert plan.groups
    assert gc.collect() == 0
