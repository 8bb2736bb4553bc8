"""How the suite shares out over pytest-xdist's workers (``-n 2 --dist loadgroup``; without it
nothing here applies).

A unit of work goes whole to one worker: each test module is one (its module-scoped fixtures are
set up once, as in a run without workers), and the real-engine suites are one together
(:data:`ENGINE_UNIT`): their engines are session fixtures that several of their files share, so
they start once, in the worker that runs them, while the other worker runs the rest of the suite.

The units are decided here from the test ids (:func:`unit_of`), by a scheduler of ours
(``pytest_xdist_make_scheduler``), not by ``xdist_group`` marks: xdist carries those in the test
ids, which pytest 9.2's structured ids no longer let it change (pytest-xdist issue 1386).
"""

from __future__ import annotations

from typing import Any

import pytest

#: The unit of work of the real-engine suites (every test under a ``tests/engine`` directory).
ENGINE_UNIT = "engine"
ENGINE_DIR = "/tests/engine/"


def unit_of(nodeid: str) -> str:
    """The unit of work of the test ``nodeid``: :data:`ENGINE_UNIT`, or its module's path."""
    module = nodeid.split("::", 1)[0]
    return ENGINE_UNIT if ENGINE_DIR in f"/{module}" else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling (the units with the most tests first, a worker given more
        when it is almost done) with :func:`unit_of` as the scope, and the engine unit handed
        out first: its engines' start-up is the longest wait of the run, and the other worker
        keeps the CPU busy meanwhile."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if ENGINE_UNIT in self.workqueue:
                self.workqueue.move_to_end(ENGINE_UNIT, last=False)
            super()._assign_work_unit(node)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test marked ``engine`` is in the engine unit, and only those: checked where the
    units are used (in xdist's workers)."""
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        if (item.get_closest_marker("engine") is not None) != (unit_of(item.nodeid) == ENGINE_UNIT):
            raise pytest.UsageError(f"{item.nodeid}: engine tests live in a tests/engine directory, and only they")
