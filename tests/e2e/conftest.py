"""The browser tests' shared fixture: one workbench server per test module (its own compile cache)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from e2e.test_workbench import start_app

    proc, url = start_app(tmp_path_factory.mktemp("cache"))
    yield url
    proc.terminate()
    proc.wait(timeout=20)
