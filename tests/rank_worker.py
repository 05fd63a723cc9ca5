"""What the worker scripts of the multi-process suites and the job servers share: run scenarios on this rank and
write their results, the DataLoader workers' forkserver, what a call logged, and a job server's loop (``serve``).

Imported by ``tests/accelerate/accelerate_worker.py`` and ``tests/deepspeed/engine_worker.py``, which run under
``torch.distributed.run`` (the parent tests read the files with ``tests/launched.py``), and by the flow table's and the
history search's job scripts (``tests/flows/``, ``tests/histories/``), which ``scripts/servers.py`` launches.
"""

import contextlib
import gc
import importlib
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import re
import signal
import socket
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable
from multiprocessing import connection, resource_tracker

from scripts import launch

ABORT_EXIT_CODE = 3  # this rank's exit status when one of its scenarios raised
# What every DataLoader worker started from the forkserver imports (a rank imports them only with its first workers;
# numpy.random: torch's worker loop seeds numpy's global RNG, torch/utils/data/_utils/worker.py `np.random.seed`, and
# imported in each worker it took 13 of the 32 ms of CPU a worker costs, issue 31)
WORKER_MODULES = ("multiprocessing.popen_forkserver", "multiprocessing.queues", "multiprocessing.synchronize",
                  "numpy.random")


def use_forkserver(preload: list[str]) -> None:
    """Make multiprocessing start new processes (the DataLoader workers) from a forkserver, and start it now, as a
    fork of this process with the modules ``preload`` imported. Call it before anything starts a thread (before
    ``init_process_group``, ``deepspeed.init_distributed``, ``Accelerator()``); raises RuntimeError when this
    process has a thread besides the main one then (the fork could copy a lock that thread holds).

    CPython 3.11 before 3.11.10 can deadlock a child forked while another thread creates a Python thread state
    (gh-112275). torch's Gloo threads do that when they free a finished collective's tensors, which is right before an
    epoch forks its workers (``DataLoaderShard.__iter__`` synchronizes the RNGs by a broadcast first): about one
    2-process launch in 60 hung so. The forkserver has no thread but its main one, ever: it is forked from this
    process while it has no other, and then only forks. Where the workers start from changes nothing the suites
    check (sample order, generator states, workers counted as new descendants of the rank).

    The forkserver is a fork, not CPython's own (a new interpreter that imports ``preload`` again, 2.4 s of CPU per
    rank for torch and DeepSpeed, issue 31): it holds this process's modules, and a worker it forks finds the
    script already as ``__main__`` (``multiprocessing.spawn.prepare`` does not run it again when the main module's
    file is the script's). ``preload`` names every module a worker needs; each is imported here if it is not yet, as
    are ``WORKER_MODULES``. The forkserver moves what it holds out of the garbage collector's sight (``gc.freeze``):
    a worker's collections then do not write to, and so copy, every page of the heap it shares with the forkserver.
    """
    for name in [*preload, *WORKER_MODULES]:
        importlib.import_module(name)
    threads = os.listdir("/proc/self/task")
    if len(threads) > 1:
        raise RuntimeError(f"use_forkserver: this process runs {len(threads)} threads; call it before any starts "
                           "(numpy's OpenBLAS starts a pool at import unless OMP_NUM_THREADS=1)")
    multiprocessing.set_start_method("forkserver", force=True)
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_pid is not None:
        raise RuntimeError("use_forkserver: a forkserver runs already")
    resource_tracker.ensure_running()  # its pipe is inherited, as CPython's forkserver gets it
    listener = socket.socket(socket.AF_UNIX)
    address = connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()  # the forkserver ends when every holder of alive_w has ended (as CPython's)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(alive_w)
            gc.freeze()
            multiprocessing.forkserver.main(listener.fileno(), alive_r, [])
        except SystemExit:
            pass
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(alive_r)
    listener.close()
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


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
            end_rank(ABORT_EXIT_CODE)
    stop_forkserver()


def end_rank(code: int) -> None:
    """End this rank now with exit status ``code``, the processes below it killed first (the forkserver and the
    DataLoader workers would outlive it)."""
    sys.stderr.flush()
    for pid in launch.descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(code)


def stop_forkserver() -> None:
    """Stop this rank's forkserver, if it started, and wait for it: it reaps the DataLoader workers it forked, so their
    CPU time then counts in this rank's (``getrusage(RUSAGE_CHILDREN)`` of the processes above: the launcher's and the
    bench's figures). Left to stop by itself after the rank exits, it would be an orphan and take that time with it.
    ``_stop`` is CPython's own way to stop it (its tests use it)."""
    multiprocessing.forkserver._forkserver._stop()


def said_while(call, warners: tuple[str, ...]) -> dict:
    """Run ``call()``; return ``{"warnings": [...]}`` with what it logged at WARNING or above through a logger of
    ``warners`` (or warned from a file of those packages), and ``error`` when it raised (one line)."""
    said, error = [], None

    class Said(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING and record.name.lower().startswith(warners):
                said.append(record.getMessage()[:300])

    handler = Said()
    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in logging.root.manager.loggerDict
                                       if n.lower().startswith(warners) and not logging.getLogger(n).propagate]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call()
            except Exception as e:
                text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # torch's weights-only message has colours
                error = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    said += [str(w.message)[:300] for w in caught if any(f"/{n}/" in w.filename for n in warners)]
    return {"warnings": said, **({"error": error} if error else {})}


def serve(rank: int, module: str, handle: Callable[[str, dict], dict],
          ends_rank: Callable[[dict], bool] = lambda result: False) -> None:
    """Take the controller's operations until it says ``quit`` (``scripts/servers.py``: ``JOB_STORE`` = host:port,
    ``<JOB_PREFIX>/op/<n>`` in, ``<JOB_PREFIX>/res/<n>/<rank>`` out, JSON both ways); each result is
    ``handle(op, args)``. ``module``: the upstream's ``__init__.py`` as imported, which the controller checks against
    the code the server is meant to run. A result for which ``ends_rank`` is true is sent marked ``ends_rank``, and
    ends this rank (``end_rank``, ``ABORT_EXIT_CODE``): a peer may wait in a collective this rank will not join; the
    controller waits for the ranks' end, and the server's launcher starts new ones (``scripts/ranks.py``)."""
    from datetime import timedelta

    import torch.distributed as dist

    host, port = os.environ["JOB_STORE"].rsplit(":", 1)
    prefix = os.environ["JOB_PREFIX"]
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(hours=4))
    store.set(f"{prefix}/started/{rank}", module)
    n = 0
    while True:
        message = json.loads(store.get(f"{prefix}/op/{n}"))
        if message["op"] == "quit":
            return
        result = handle(message["op"], message.get("args", {}))
        ends = ends_rank(result)
        store.set(f"{prefix}/res/{n}/{rank}", json.dumps(result | ({"ends_rank": True} if ends else {})))
        if ends:
            end_rank(ABORT_EXIT_CODE)
        n += 1
