"""The history search's job servers (``scripts/servers.py``): one per side and process count, each a launch of
``tests/histories/<upstream>_job.py`` on one code (the release's tree first on ``PYTHONPATH``, or the series as this
Python imports it), kept alive across histories: the start-up (imports, rendezvous, the forkserver) is paid once per
server, not per history. A step that takes longer than ``STEP_TIMEOUT``, or a server that dies, ends the server; the
step's result says ``hang`` or ``crash``, and the next step starts a new server. A step that raised on a rank with
peers ends the server's ranks (``tests/histories/server.py``), and its launcher starts new ones for the next step.
"""

import os
from pathlib import Path

from scripts.flows import run as flows_run
from scripts.servers import PRELOAD, Server, Store
from scripts.sources import KIT_ROOT

JOBS = {name: KIT_ROOT / "tests" / "histories" / f"{name}_job.py" for name in ("accelerate", "deepspeed")}
SIDES = ("release", "series")
STEP_TIMEOUT = float(os.environ.get("HISTORY_STEP_TIMEOUT", "60"))  # seconds one step may take on every rank


class Servers:
    """The servers of one search, one per (code, process count), started when first used; ``close()`` ends them."""

    def __init__(self, upstream: str, work: Path, release: Path):
        """``release``: the directory of the release's tree to put first on ``PYTHONPATH``
        (``scripts.flows.run.release_tree``). Raises KitError when the series cannot be imported."""
        self.upstream, self.work, self.release = upstream, work, release
        self.series = flows_run.series_package(upstream)
        series = os.environ.get("PYTHONPATH", "")
        self.pythonpath = {"series": series, "release": flows_run.first_on(release, series)}
        self.store = Store(STEP_TIMEOUT)
        self.servers: dict[tuple[str, int], Server] = {}

    def get(self, code: str, nproc: int) -> Server:
        key = (code, nproc)
        if key not in self.servers:
            self.servers[key] = Server(self.store, JOBS[self.upstream], f"{self.upstream}-{code}", code, nproc,
                                       self.pythonpath[code], self.work / "logs", self.release, self.series,
                                       PRELOAD[self.upstream])
        return self.servers[key]

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()


def for_sides(upstream: str, work: Path) -> dict[str, Servers]:
    """The servers of each side (``SIDES``) of a search of ``upstream`` under ``work``, the release's tree made once.
    Raises KitError when there is no checkout of the release (``make apply``)."""
    release = flows_run.release_tree(upstream, work / "trees")
    return {side: Servers(upstream, work / side, release) for side in SIDES}
