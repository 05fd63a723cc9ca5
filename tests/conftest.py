"""The kit's suite: the ``regression`` marker comes from the kit's pytest plugin.

``make test`` says what it tests: its first lines name each upstream's checkout as imported (version, branch,
whether the series is applied: ``scripts.series.describe``), and when the series is not applied its last line says
that the failures of tests marked ``regression`` are the bugs reproducing. DeepSpeed's mmap loader prints
progress lines ("creating numpy buffer of mmap...") on every load, about 1,400 in a failing run; they are dropped.

A process forked from the test process (the DataLoader workers of the one-process tests with ``num_workers > 0``)
first moves what it inherited out of the garbage collector's sight (``gc.freeze``): a collection there would
otherwise write to, and so copy, every page of the test process's heap (1.4 s of CPU in ``test_io_workers.py``'s
314 workers, issue 31). The worker frees what it makes itself as before. What every DataLoader worker imports
(``tests.rank_worker.WORKER_MODULES``: ``numpy.random``, 13 ms of CPU a worker) is imported here once, as in the
launched ranks' forkservers.
"""

import gc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rank_worker import WORKER_MODULES

pytest_plugins = ["scripts.pytest_regression"]

UPSTREAMS = ("deepspeed", "accelerate")
MMAP_LOADER = "deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset"
CHECKOUTS = pytest.StashKey[dict]()
VERDICT = pytest.StashKey[str]()

os.register_at_fork(after_in_child=gc.freeze)
for _module in WORKER_MODULES:
    importlib.import_module(_module)


def checkout_of(package: str) -> Path | None:
    """The git work tree the package is imported from (None when it is not installed or not in a git checkout)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin:
        return None
    top = subprocess.run(["git", "-C", str(Path(spec.origin).parent), "rev-parse", "--show-toplevel"],
                         capture_output=True, text=True)
    return Path(top.stdout.strip()) if top.returncode == 0 else None


def checkouts() -> dict[str, str]:
    """{upstream: ``series.describe`` of the checkout it is imported from, or why there is none}."""
    from scripts import KitError, series
    from scripts.sources import KIT_ROOT

    found = {}
    for name in UPSTREAMS:
        repo = checkout_of(name)
        try:
            found[name] = (f"{series.describe(repo, KIT_ROOT / 'patches' / name)} ({repo})" if repo else
                           f"{name}: not installed from a checkout (run `make apply`)")
        except KitError as e:
            found[name] = f"{name}: {e}"
    return found


def pytest_configure(config: pytest.Config) -> None:
    """``xdist_group`` (pytest-xdist's marker, which ``make test``'s ``--dist loadgroup`` reads) is known without
    pytest-xdist too: the gate's stages and a plain ``pytest -p no:xdist`` run the same modules."""
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one pytest-xdist worker")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the test modules (and torch, DeepSpeed, Accelerate with them) are imported, move everything alive out of
    the garbage collector's sight (``gc.freeze``): a full collection then looks only at what the tests make, not at a
    million objects of the imported modules again (pytest's ``unraisableexception`` plugin alone makes five at the end
    of each session, about 0.4 s each; issue 31)."""
    gc.freeze()


def pytest_report_header(config: pytest.Config) -> list[str]:
    config.stash[CHECKOUTS] = checkouts()
    return ["checkouts under test:", *(f"  {line}" for line in config.stash[CHECKOUTS].values())]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """How many release and series sides of the flow table and the stored histories were reused (``tests/flows``,
    ``tests/histories``). After a run on
    checkouts without the series: which failures are the bugs reproducing, which are not (kept for
    ``pytest_unconfigure``, which prints it last)."""
    from scripts import plural

    calls = [dict(r.user_properties) for kind in ("passed", "failed") for r in terminalreporter.stats.get(kind, [])
             if r.when == "call"]
    for prop, what, unit, units in (("flow", "the flow table", "flow", "flows"),
                                    ("history", "the stored histories", "history", "histories")):
        sides = {side: [props[f"{prop}_{side}_reused"] for props in calls if f"{prop}_{side}_reused" in props]
                 for side in ("release", "series")}
        if sides["release"]:
            terminalreporter.write_line(
                f"{what}: of {plural(len(sides['release']), unit, units)}, the release side of "
                f"{sum(map(bool, sides['release']))} and the series side of {sum(map(bool, sides['series']))} reused "
                "from build/flows-cache (FLOWS_CACHE=0 runs them)")
    unapplied = [name for name, line in config.stash.get(CHECKOUTS, {}).items() if "series applied" not in line]
    failed = terminalreporter.stats.get("failed", [])
    if not unapplied or not failed:
        return
    bugs = [r for r in failed if dict(r.user_properties).get("regression", "").split("#")[0] in unapplied]
    others = len(failed) - len(bugs)
    config.stash[VERDICT] = (
        f"the series is not applied on {', '.join(unapplied)}: {len(bugs)} of the {plural(len(failed), 'failure')} "
        f"are tests marked `regression`, i.e. the bugs reproducing, not a broken kit"
        + (f"; {plural(others, 'other failure')} not explained by that" if others else "")
        + " (`make apply` applies the series)")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The explanation of the failures is the run's last line, after pytest's own counts."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and config.stash.get(VERDICT, ""):
        reporter.write_line(config.stash[VERDICT])


@pytest.fixture(autouse=True)
def quiet_mmap_loader(monkeypatch):
    """Drop the progress lines that DeepSpeed's MMapIndexedDataset prints (indented ``print`` calls) while a test
    runs; its other prints (errors) still go through."""
    module = sys.modules.get(MMAP_LOADER)
    if module is not None:
        def quiet(*args, **kwargs):
            if not (args and str(args[0]).startswith("    ")):
                print(*args, **kwargs)

        monkeypatch.setattr(module, "print", quiet, raising=False)
