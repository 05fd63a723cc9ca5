"""Run flows of the flow table: each on the release and on the series, as real launches of the upstream's job script.

A flow has two columns. The ``release`` column runs the pristine release's code at save and at load; the ``series``
column runs the series (the upstream as this Python imports it: the kit's checkout, or a gate stage's tree) at both,
except where the flow's ``versions`` factor says ``rollback`` (saved by the series, loaded by the release) or
``upgrade`` (saved by the release, loaded by the series). The release's code is a tree of ``base/<version>`` of the
kit's checkout (``scripts/worktree.py``), put first on ``PYTHONPATH`` of its launches.

Tasks are run in two phases by job servers (``scripts/servers.py``), one per code and process count, each launched
once for both phases (``parallel`` of them at work at once): first every ``save`` and ``order`` task, then every
``load`` task (its checkpoint folder written in the first phase); a server takes a phase's tasks as one plan
(``tests/flows/tasks.py``). A server that ends early (a task hung or crashed, see the job scripts) leaves the task
it was at recorded; its later tasks go to a new server.

A column of a flow is reused from ``build/flows-cache/`` when what it runs is unchanged (``cache.py``): the release
column while the release and the job code are, the series column while also the series' code is. Only the columns
not reused are launched.
"""

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path

from scripts import KitError, worktree
from scripts.flows import cache
from scripts.git import rev
from scripts.servers import PRELOAD, START_TIMEOUT, Server, Store
from scripts.sources import KIT_ROOT as KIT

JOBS = {"accelerate": KIT / "tests" / "flows" / "accelerate_job.py", "deepspeed": KIT / "tests" / "flows" /
        "deepspeed_job.py"}
# seconds for each task at most, which the plan hands to the job (a task that takes longer records a hang and ends its
# server); a plan's own timeout (START_TIMEOUT + TASK_TIMEOUT per task) is only the net below that
TASK_TIMEOUT = float(os.environ.get("FLOWS_TASK_TIMEOUT", "90"))


def codes(column: str, versions: str) -> tuple[str, str]:
    """The code that saves and the code that loads in one column of a flow whose ``versions`` factor is ``versions``
    (``series``, ``rollback``, ``upgrade``; a flow without the factor: ``series``)."""
    if column == "release":
        return "release", "release"
    return {"series": ("series", "series"), "rollback": ("series", "release"),
            "upgrade": ("release", "series")}[versions]


def processes(flow: dict) -> tuple[int, int]:
    """Processes (or data-parallel ranks) at save and at load: ``"2-4"`` is (2, 4), ``"1"`` is (1, 1)."""
    levels = flow["factors"].get("processes", flow["factors"].get("ranks", "1"))
    save, _, load = levels.partition("-")
    return int(save), int(load or save)


def tasks_of(flow: dict, work: Path) -> list[dict]:
    """The tasks of one flow's two columns: ``(phase, code, nproc, task)`` tuples; ``task`` as the job scripts read
    it."""
    out = []
    save_n, load_n = processes(flow)
    for column in ("release", "series"):
        save_code, load_code = codes(column, flow["factors"].get("versions", "series"))
        base = {"flow": flow["id"], "column": column, "factors": flow["factors"],
                "folder": str(work / "checkpoints" / f"{flow['id']}.{column}")}
        if flow["kind"] in ("order", "release-order"):
            out.append((1, save_code, save_n, {**base, "part": "order"}))
        else:
            out.append((1, save_code, save_n, {**base, "part": "save"}))
            out.append((2, load_code, load_n, {**base, "part": "load"}))
    return out


def tree(name: str, revision: str, work: Path, what: str) -> Path:
    """A tree of commit ``revision`` of the kit's checkout of ``name`` under ``work``; returns the directory to put on
    ``PYTHONPATH``. Raises KitError, saying what to do (``what``: whose commit it is), when there is no checkout or
    git does not know the commit."""
    repo = KIT / "upstream" / name
    if not (repo / ".git").exists():
        raise KitError(f"no checkout upstream/{name}: run make apply first")
    try:
        commit = rev(repo, revision)
    except KitError:
        raise KitError(f"upstream/{name} has no commit {revision!r} ({what}): name one of `git -C upstream/{name} "
                       "log`, e.g. HEAD~1") from None
    return worktree.package_dir(worktree.add(repo, work / f"{name}-{commit[:12]}", commit), name)


def release_version(name: str) -> str:
    """The version of upstream ``name`` this Python has installed, without a local part (``1.16.0``)."""
    return importlib.metadata.version(name).split("+")[0]


def series_package(name: str, at_tree: Path | None = None) -> Path:
    """The folder of upstream ``name``'s package as the series' launches import it: under ``at_tree`` (``make flows
    AT=``'s tree), else the first on ``PYTHONPATH`` (theirs), else as this Python finds it (the editable install).
    Raises KitError when it finds none."""
    if at_tree is not None:
        return at_tree / name
    entries = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    spec = importlib.machinery.PathFinder.find_spec(name, entries) or importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise KitError(f"{name} cannot be imported: run make apply first")
    return Path(spec.origin).resolve().parent


def release_tree(name: str, work: Path) -> Path:
    """``tree`` of the pristine release of upstream ``name`` that this Python has installed (``base/<version>``, which
    ``make apply`` makes)."""
    version = release_version(name)
    return tree(name, f"base/{version}", work, f"the pristine {version}: run make apply")


def record_path(out: Path, task: dict, rank: int) -> Path:
    """Where a job writes the record of ``task`` on ``rank`` (``tests/flows/tasks.py``)."""
    return out / f"{task['flow']}.{task['column']}.{task['part']}.rank{rank}.json"


def records(out: Path, task: dict, nproc: int) -> list[dict | None]:
    """Every rank's record of a task (None where a rank wrote none)."""
    paths = [record_path(out, task, rank) for rank in range(nproc)]
    return [json.loads(path.read_text()) if path.exists() else None for path in paths]


def first_on(path: Path, pythonpath: str) -> str:
    """``pythonpath`` with ``path`` first."""
    return os.pathsep.join(p for p in (str(path), pythonpath) if p)


def run(name: str, flows: list[dict], work: Path, parallel: int = 2, say=print, at: str = "",
        reuse: bool = True, stored: Path | None = None) -> tuple[dict, dict]:
    """Run ``flows`` of upstream ``name`` in ``work``; return ``({(flow id, column): {part: [rank records]}}``,
    ``{(flow id, column): when its reused records ran}``). ``at``: a commit of the checkout to run as the series
    (default: the upstream as this Python imports it). Columns are read from ``stored`` (default ``cache.CACHE``)
    when ``reuse`` and their key is there; every column run now is stored there when its records allow
    (``cache.py``).

    A rank that wrote no record of a task is None in its list. Raises KitError when a tree cannot be made, or a
    server does not start or its ranks import the upstream from another folder than its column's (the release's
    tree, or the series' package whose digest its key holds: ``scripts/servers.py``); OSError when ``work`` cannot
    be written (a column ``stored`` cannot keep is said through ``say``).
    """
    work.mkdir(parents=True, exist_ok=True)
    series = os.environ.get("PYTHONPATH", "")
    at_tree = tree(name, at, work / "trees", "make flows AT=") if at else None
    if at_tree:
        series = first_on(at_tree, series)
    package = series_package(name, at_tree)
    release = release_tree(name, work / "trees")
    pythonpath = {"series": series, "release": first_on(release, series)}
    out = work / "records"
    shutil.rmtree(out, ignore_errors=True)  # a record left by an earlier run would count as done
    out.mkdir()
    stored = stored or cache.CACHE
    shared = cache.release_inputs(KIT / "upstream" / name, release_version(name), JOBS[name], TASK_TIMEOUT)
    digest = cache.series_code(package)
    keys = {(flow["id"], column): cache.key(shared, flow, digest if column == "series" else "")
            for flow in flows for column in ("release", "series")}
    results, reused = defaultdict(dict), {}
    for column_key in keys if reuse else ():
        entry = cache.load(stored, keys[column_key])
        if entry:
            results[column_key], reused[column_key] = entry["parts"], entry["run"]
    planned = [t for flow in flows for t in tasks_of(flow, work) if (t[3]["flow"], t[3]["column"]) not in reused]
    store, servers = Store(START_TIMEOUT), {}

    def server(code: str, nproc: int) -> Server:
        if (code, nproc) not in servers:
            servers[(code, nproc)] = Server(store, JOBS[name], f"{name}-{code}", code, nproc, pythonpath[code],
                                            work / "logs", release, package, PRELOAD[name])
        return servers[(code, nproc)]

    try:
        for phase in (1, 2):
            groups = defaultdict(list)
            for task_phase, code, nproc, task in planned:
                if task_phase == phase:
                    groups[(code, nproc)].append(task)
            for key in set(servers) - set(groups):  # not needed in this phase: its memory back
                servers[key].stop()
            _run_phase(name, phase, groups, out, server, parallel, say)
            for (_, nproc), tasks in groups.items():
                for task in tasks:
                    results[(task["flow"], task["column"])][task["part"]] = records(out, task, nproc)
    finally:
        for each in servers.values():
            each.stop()
    for column_key, entry_key in keys.items():
        parts = results[column_key]
        if column_key not in reused and cache.storable(parts):
            try:
                cache.store(stored, entry_key, parts)
            except OSError as e:  # the table stands; the next run runs the column again
                say(f"flows: {name}: the {column_key[1]} column of {column_key[0]} is not kept in {stored}: {e}")
    return dict(results), reused


def _run_phase(name, phase, groups, out, server, parallel, say):
    """Send every group of one phase its tasks as one plan, ``parallel`` servers at work at once (each batch launched
    first, to start side by side), and again the tasks after one that ended a server."""
    pending, round_ = {key: list(tasks) for key, tasks in groups.items()}, 0
    while pending := {key: tasks for key, tasks in pending.items() if tasks}:  # each round records a task at least
        keys, round_ = list(pending), round_ + 1
        sizes = ", ".join(f"{c} x{n}: {len(pending[(c, n)])} tasks" for c, n in keys)
        say(f"flows: {name}: phase {phase}, round {round_}: {len(keys)} servers ({sizes})")
        for at in range(0, len(keys), parallel):
            batch, started = keys[at:at + parallel], time.monotonic()
            for key in batch:
                if not server(*key).running():
                    server(*key).launch()
            for code, nproc in batch:
                server(code, nproc).send("plan", {"out": str(out), "task_timeout": TASK_TIMEOUT,
                                                  "tasks": pending[(code, nproc)]})
            for key in batch:
                results = server(*key).receive(START_TIMEOUT + TASK_TIMEOUT * len(pending[key]))
                ended = next((r for r in results if "done" not in r), None)
                pending[key] = _left(out, pending[key], key[1], ended)
            say(f"flows: {name}: " + ", ".join(f"{c} x{n}" for c, n in batch)
                + f": {time.monotonic() - started:.0f} s")


def _left(out, tasks, nproc, ended):
    """The tasks of a plan to send again: those after the one that ended its server (``ended``: the result that
    says how, None when the plan was done). That one is the last task with a ``hang`` or ``crash`` record (it
    recorded itself on every rank), else the first without a record of every rank (the rest of its ranks are recorded
    as ``_record_missing`` says)."""
    done = 0
    while done < len(tasks) and all(r is not None for r in records(out, tasks[done], nproc)):
        done += 1
    if done == len(tasks):
        return []
    if done and any(r and ("hang" in r or "crash" in r) for r in records(out, tasks[done - 1], nproc)):
        return tasks[done:]
    _record_missing(out, tasks[done], nproc, ended or {"crash": "the server answered the plan, but no rank recorded "
                                                                "this task"})
    return tasks[done + 1:]


def _record_missing(out, task, nproc, ended):
    """Write a record for every rank of ``task`` that wrote none: the server's result that says how it ended
    (``hang`` or ``crash``, with the tail of its log); ``runner`` marks it as the runner's, not the job's."""
    why = {k: v for k, v in ended.items() if k in ("hang", "crash")} or {"crash": f"the server ended: {ended}"}
    for rank in range(nproc):
        path = record_path(out, task, rank)
        if not path.exists():
            path.write_text(json.dumps(why | {"runner": True}))
