"""What the flow table's job scripts share: run the plans the runner sends, each task under a watchdog, and record
them.

A job script is a server (``scripts/servers.py``) that takes plans, one per phase of the flow table, until the runner
says ``quit`` (``serve_plans``). A task writes ``<out>/<flow>.<column>.<part>.rank<N>.json``. One that takes longer
than the plan's ``task_timeout`` records ``hang``; one that raises records ``crash``; either ends the rank when it has
peers (they may wait in a collective it will not join), and the runner (``scripts/flows/run.py``) sends the tasks left
to a new server. A rank alone goes on with its next task after a crash.
"""

import gc
import json
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.rank_worker import end_rank, serve

CRASH_EXIT_CODE, HANG_EXIT_CODE = 3, 4


def record(out: str, name: str, rank: int, result: dict) -> None:
    """Write this rank's record of the task ``name`` (whole or not at all)."""
    path = Path(out) / f"{name}.rank{rank}.json"
    path.with_suffix(".tmp").write_text(json.dumps(result))
    path.with_suffix(".tmp").replace(path)


def end(out: str, name: str, rank: int, result: dict, code: int) -> None:
    """Record ``result`` and end this rank now, its forkserver and DataLoader workers first (they would outlive it)."""
    record(out, name, rank, result)
    print(f"flows: rank {rank}: {name}: {next(iter(result))}", file=sys.stderr, flush=True)
    end_rank(code)


def run_plan(plan: dict, rank: int, world: int, run_task: Callable[[dict], dict],
             after_task: Callable[[], None] = lambda: None) -> None:
    """Run every task of ``plan`` (``scripts/flows/run.py`` sends it: ``out``, ``task_timeout`` in seconds, ``tasks``)
    on this rank: ``run_task(task)`` returns the record.

    After each task ``after_task()`` (stop what it left running), then its garbage is collected and what survives
    moved out of the collector's sight (``gc.freeze``), so that the full collections an upstream makes look only at
    what the next task makes.
    """
    out, timeout = plan["out"], plan["task_timeout"]
    gc.freeze()
    for task in plan["tasks"]:
        name = f"{task['flow']}.{task['column']}.{task['part']}"
        timer = threading.Timer(timeout, end, (out, name, rank, {"hang": f"no result after {timeout:.0f} s"},
                                               HANG_EXIT_CODE))
        timer.start()
        try:
            record(out, name, rank, run_task(task))
        except Exception:
            crash = {"crash": traceback.format_exc()[-3000:]}
            if world > 1:
                end(out, name, rank, crash, CRASH_EXIT_CODE)
            record(out, name, rank, crash)
        finally:
            timer.cancel()
        after_task()
        gc.collect()
        gc.freeze()


def serve_plans(rank: int, world: int, module: str, run_task: Callable[[dict], dict],
                after_task: Callable[[], None] = lambda: None) -> None:
    """Run the plans the runner sends (``scripts/flows/run.py`` through ``scripts/servers.py``: an operation
    ``plan`` whose arguments are a plan, see ``run_plan``) until it says ``quit``; each plan's result is ``{"done":
    true}`` once every task of it is recorded. ``module``: the upstream's ``__init__.py`` as imported, which the
    runner checks against the code the server is meant to run."""
    def handle(op: str, plan: dict) -> dict:
        run_plan(plan, rank, world, run_task, after_task)
        return {"done": True}

    serve(rank, module, handle)
