"""What the worker scripts of the multi-process suites share: run scenarios on this rank and write their results.

Imported by ``tests/accelerate/accelerate_worker.py`` and ``tests/deepspeed/engine_worker.py``, which run under
``torch.distributed.run``; the parent tests read the files with ``tests/launched.py``.
"""

import contextlib
import gc
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterable

from scripts import launch

ABORT_EXIT_CODE = 3  # this rank's exit status when one of its scenarios raised


def use_forkserver(preload: list[str]) -> None:
    """Make multiprocessing start new processes (the DataLoader workers) from a forkserver with the modules
    ``preload`` imported. The forkserver starts with the first worker (a launch without workers pays nothing for
    it), by fork and exec in C (``_posixsubprocess``), which no Python thread state of the rank's can deadlock.

    CPython 3.11 before 3.11.10 can deadlock a child forked while another thread creates a Python thread state
    (gh-112275). torch's Gloo threads do that when they free a finished collective's tensors, which is right before an
    epoch forks its workers (``DataLoaderShard.__iter__`` synchronizes the RNGs by a broadcast first): about one
    2-process launch in 60 hung so. The forkserver has no such threads. Where the workers start from changes nothing
    the suites check (sample order, generator states, workers counted as new descendants of the rank).

    ``preload`` names every module the worker script imports: a worker, forked from the forkserver, runs the script
    again as ``__mp_main__`` (``multiprocessing.spawn.prepare``; in CPython 3.11 preloading ``"__main__"`` does not
    help, ``ForkServer.ensure_running`` never passes the script's path), and with its imports already loaded that is
    a few milliseconds instead of importing Accelerate anew in every worker (0.73 s against 0.03 s of CPU to start
    a worker of the Accelerate suite, issue 23).
    """
    multiprocessing.set_start_method("forkserver")
    multiprocessing.set_forkserver_preload(preload)


def run_scenarios(out_dir: str, names: Iterable[str], rank: int, call: Callable[[str], dict], **recorded) -> None:
    """Run ``call(name)`` for each scenario and write ``OUT_DIR/<name>.rank<RANK>.json``: its result dict plus
    ``scenario``, ``rank`` and ``recorded`` (world size, the upstream's import path).

    A scenario that raises writes ``{"error": <traceback>}`` instead, prints the traceback to standard error and ends
    this rank at once (``os._exit(ABORT_EXIT_CODE)``, its own child processes killed first, which would outlive it):
    its peers may be waiting in a collective it will never join, and ``torch.distributed.run`` stops them when a rank
    fails, so the launch ends now rather than at its timeout.
    The later scenarios then have no result, which the parent's tests report with the launch log.

    After each scenario its garbage is collected (its DataLoaders stop their workers now, not during the next
    scenario), and what survives it is moved out of the garbage collector's sight (``gc.freeze``), as is everything
    alive before the first (the imported modules): the full collections that the upstreams' own code makes
    (Accelerate's ``free_memory``) then look only at what the running scenario made, not at torch's and the
    upstream's objects (0.15 s a collection otherwise, half the Accelerate launch; issue 23).
    """
    gc.freeze()
    for name in names:
        try:
            result = call(name)
        except Exception:
            result = {"error": traceback.format_exc()}
        gc.collect()
        gc.freeze()
        result.update(scenario=name, rank=rank, **recorded)
        path = os.path.join(out_dir, f"{name}.rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
        if "error" in result:
            print(f"rank {rank}: scenario {name!r} raised; ending the launch\n{result['error']}", file=sys.stderr)
            sys.stderr.flush()
            for pid in launch.descendants(os.getpid()):  # the forkserver and workers would outlive this rank
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(ABORT_EXIT_CODE)
    stop_forkserver()


def stop_forkserver() -> None:
    """Stop this rank's forkserver, if it started, and wait for it: it reaps the DataLoader workers it forked, so their
    CPU time then counts in this rank's (``getrusage(RUSAGE_CHILDREN)`` of the processes above: the launcher's and the
    bench's figures). Left to stop by itself after the rank exits, it would be an orphan and take that time with it.
    ``_stop`` is CPython's own way to stop it (its tests use it)."""
    multiprocessing.forkserver._forkserver._stop()
