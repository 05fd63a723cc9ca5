"""Run flows of the flow table: each on the release and on the series, as real launches of the upstream's job script.

A flow has two columns. The ``release`` column runs the pristine release's code at save and at load; the ``series``
column runs the series (the upstream as this Python imports it: the kit's checkout, or a gate stage's tree) at both,
except where the flow's ``versions`` factor says ``rollback`` (saved by the series, loaded by the release) or
``upgrade`` (saved by the release, loaded by the series). The release's code is a tree of ``base/<version>`` of the
kit's checkout (``scripts/worktree.py``), put first on ``PYTHONPATH`` of its launches.

Tasks are run in two phases of launches, each launch one code and one process count: first every ``save`` and
``order`` task, then every ``load`` task (its checkpoint folder written in the first phase). The launches of a phase
run side by side. A launch that ends early (a task hung or crashed, see the job scripts) leaves the task it was at
recorded; its later tasks are launched again.
"""

import importlib.metadata
import json
import os
import socket
import sys
from collections import defaultdict
from pathlib import Path

from scripts import KitError, launch, worktree
from scripts.git import rev
from scripts.sources import KIT_ROOT as KIT

JOBS = {"accelerate": KIT / "tests" / "flows" / "accelerate_job.py", "deepspeed": KIT / "tests" / "flows" /
        "deepspeed_job.py"}
# seconds for one launch: start-up, then each task at most TASK_TIMEOUT, which the plan hands to the job (a task that
# takes longer records a hang and ends its launch); the launch's timeout is only the net below that
START_TIMEOUT, TASK_TIMEOUT = 120, float(os.environ.get("FLOWS_TASK_TIMEOUT", "90"))
ROUNDS = 12  # launches of one group at most (each after a task that ended its launch)


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


def release_tree(name: str, work: Path) -> Path:
    """``tree`` of the pristine release of upstream ``name`` that this Python has installed (``base/<version>``, which
    ``make apply`` makes)."""
    version = importlib.metadata.version(name).split("+")[0]
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


def run(name: str, flows: list[dict], work: Path, parallel: int = 2, say=print, at: str = "") -> dict:
    """Run ``flows`` of upstream ``name`` in ``work``; return ``{(flow id, column): {part: [rank records]}}``.
    ``at``: a commit of the checkout to run as the series (default: the upstream as this Python imports it).

    A rank that wrote no record of a task is None in its list. Raises KitError when a tree cannot be made; OSError
    when ``work`` cannot be written.
    """
    work.mkdir(parents=True, exist_ok=True)
    series = os.environ.get("PYTHONPATH", "")
    if at:
        series = first_on(tree(name, at, work / "trees", "make flows AT="), series)
    release = release_tree(name, work / "trees")
    pythonpath = {"series": series, "release": first_on(release, series)}
    out = work / "records"
    out.mkdir(exist_ok=True)
    planned = [t for flow in flows for t in tasks_of(flow, work)]
    results = defaultdict(dict)
    for phase in (1, 2):
        groups = defaultdict(list)
        for task_phase, code, nproc, task in planned:
            if task_phase == phase:
                groups[(code, nproc)].append(task)
        _run_phase(name, phase, groups, out, pythonpath, parallel, say)
        for (code, nproc), tasks in groups.items():
            for task in tasks:
                found = records(out, task, nproc)
                _check_code(name, code, release, found, task)
                results[(task["flow"], task["column"])][task["part"]] = found
    return dict(results)


def _check_code(name: str, code: str, release: Path, found: list[dict | None], task: dict) -> None:
    """Raise KitError when a record of ``task`` was written by another code than its launch's (its ``module``: the
    upstream's ``__init__.py`` it imported): the release's tree for ``release``, any other for ``series``."""
    for record in found:
        module = (record or {}).get("module")
        if module and (Path(module).resolve().is_relative_to(release.resolve())) != (code == "release"):
            raise KitError(f"flows: {task['flow']} ({task['column']}, {task['part']}) ran {name} from {module}, not "
                           f"the {code}'s code: check PYTHONPATH and the editable install of upstream/{name}")


def _run_phase(name, phase, groups, out, pythonpath, parallel, say):
    """Launch every group of one phase side by side, again for the tasks after one that ended a launch."""
    pending = {key: list(tasks) for key, tasks in groups.items()}
    for round_ in range(ROUNDS):
        pending = {key: tasks for key, tasks in pending.items() if tasks}
        if not pending:
            return
        jobs, keys, plans = [], list(pending), {}
        for code, nproc in keys:
            tag = f"{name}-phase{phase}-{code}-x{nproc}-{round_}"
            plans[(code, nproc)] = tag
            plan = out.parent / f"plan-{tag}.json"
            plan.write_text(json.dumps({"out": str(out), "name": tag, "task_timeout": TASK_TIMEOUT,
                                        "tasks": pending[(code, nproc)]}))
            env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
            env.update(OMP_NUM_THREADS="1", PYTHONPATH=pythonpath[code], DS_ACCELERATOR="cpu")
            if nproc == 1:  # what torch.distributed.run sets for one process, without its agent (1 s of CPU)
                env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
                command = [sys.executable, str(JOBS[name]), str(plan)]
            else:
                command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", str(JOBS[name]), str(plan)]
            timeout = START_TIMEOUT + TASK_TIMEOUT * len(pending[(code, nproc)])
            jobs.append(launch.Job(command, out.parent / "logs" / f"{tag}.log", timeout, cwd=out.parent, env=env))
        sizes = ", ".join(f"{c} x{n}: {len(pending[(c, n)])} tasks" for c, n in keys)
        say(f"flows: {name}: phase {phase}, round {round_ + 1}: launching {len(jobs)} ({sizes})")
        launches = launch.run_all(jobs, parallel)
        say(f"flows: {name}: " + ", ".join(f"{c} x{n}: {r.seconds:.0f} s, {r.cpu_s or 0:.0f} s CPU"
                                           for (c, n), r in zip(keys, launches, strict=True)))
        for key, result in zip(keys, launches, strict=True):
            started = [out / f"{plans[key]}.rank{rank}.started" for rank in range(key[1])]
            if not all(path.exists() for path in started):
                raise KitError(f"flows: the launch of {name}'s {key[0]} on {key[1]} processes ended before its first "
                               f"task ({'timed out' if result.timed_out else f'exit {result.returncode}'}); its log "
                               f"{result.log}: {result.tail(400)}")
            pending[key] = _left(out, pending[key], key[1], result)


def _left(out, tasks, nproc, result):
    """The tasks of a launch to launch again: those after the one that ended it. That one is the last task with a
    ``hang`` or ``crash`` record (it recorded itself on every rank), else the first without a record of every rank
    (the rest of its ranks are recorded as ``_record_missing`` says)."""
    done = 0
    while done < len(tasks) and all(r is not None for r in records(out, tasks[done], nproc)):
        done += 1
    if done == len(tasks):
        return []
    if done and any(r and ("hang" in r or "crash" in r) for r in records(out, tasks[done - 1], nproc)):
        return tasks[done:]
    _record_missing(out, tasks[done], nproc, result)
    return tasks[done + 1:]


def free_port() -> int:
    """A TCP port of the loopback interface that is free now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record_missing(out, task, nproc, result):
    """Write a record for every rank of ``task`` that wrote none: ``hang`` when the launch timed out, else ``crash``
    with the launch's exit status and the tail of its log."""
    for rank in range(nproc):
        path = record_path(out, task, rank)
        if not path.exists():
            what = ({"hang": f"the launch timed out after {result.seconds:.0f} s"} if result.timed_out else
                    {"crash": f"no record; the launch exited {result.returncode}: {result.tail(1500)}"})
            path.write_text(json.dumps(what))
