"""Job servers: launches of a job script kept alive, that take their work from this process, one message at a time.

A server is one launch (``scripts/ranks.py`` for several processes, the script itself for one) of a job script on
one code (the release's tree first on ``PYTHONPATH``, or the series as this Python imports it). Its ranks read
messages from a ``torch.distributed.TCPStore`` this process serves on a port the kernel chose (``JOB_STORE`` =
host:port): ``<JOB_PREFIX>/op/<n>`` one JSON operation, ``<JOB_PREFIX>/res/<n>/<rank>`` each rank's JSON result
(``tests/rank_worker.py``'s ``serve``). The history search runs its steps on them (``scripts/histories/servers.py``),
the flow table its plans (``scripts/flows/run.py``): the start-up (imports, rendezvous, the forkserver) is paid once
per server, not per history or phase.

An operation not done within its timeout, or a server that dies, ends the server (its whole process tree killed,
``scripts/launch.py``); the results say ``hang`` or ``crash`` (marked ``server``: this process wrote them, not the
job), and the next operation starts a new server. A server of several ranks whose rank ended (a task that crashed
ends its rank, ``tests/flows/tasks.py``) gets new ranks from its launcher, which keeps its imports
(``scripts/ranks.py``, ``JOB_RESPAWN``): new processes, as a new server's are, without importing torch and the
upstream again.
"""

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from scripts import KitError, launch, ranks

START_TIMEOUT = 180.0  # seconds a server may take to start (imports, rendezvous)
# What the job scripts of an upstream import first: the ranks of a server fork from one process that imported them
# (scripts/ranks.py, JOB_PRELOAD)
PRELOAD = {"accelerate": ("torch", "torchdata.stateful_dataloader", "accelerate"), "deepspeed": ("torch", "deepspeed")}


class Store:
    """The TCPStore the servers read their steps from, served by this process on a free loopback port; ``timeout``
    in seconds bounds its own calls."""

    def __init__(self, timeout: float):
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=timeout))
        self.port = self.store.port  # the kernel's choice: no race with another process for a free port


class Server:
    """One launch of the job ``script`` (of an upstream) on one code (``release`` or ``series``) and process count,
    ``name`` its keys' prefix (see the module's docstring); ``release``: the release's tree, which the ranks of a
    ``release`` server must import the upstream from, and those of a ``series`` server must not; ``series``: the
    folder of the upstream's package the ranks of a ``series`` server must import (``scripts/flows/run.py``'s
    ``series_package``, whose digest keys the series' stored results); ``preload``: the modules its ranks fork after
    (``PRELOAD``)."""

    def __init__(self, store: Store, script: Path, name: str, code: str, nproc: int, pythonpath: str, logs: Path,
                 release: Path, series: Path, preload: tuple[str, ...] = ()):
        self.store, self.script, self.name, self.code, self.nproc = store, script, name, code, nproc
        self.preload = preload
        self.pythonpath, self.logs = pythonpath, logs
        self.folder = release if code == "release" else series
        self.proc, self.generation, self.n, self.log, self.log_start, self.waiting = None, 0, 0, None, 0, False
        self.outstanding = False  # an operation sent and not received: the server is busy with it
        self.status, self.ended = -1, None  # the launcher's word that the ranks ended (JOB_RESPAWN), and their status

    @property
    def prefix(self) -> str:
        return f"{self.name}-x{self.nproc}-{self.generation}"

    def running(self) -> bool:
        """True while the server launched last has not ended, nor its ranks."""
        return self.proc is not None and self.proc.poll() is None and self._ranks_ended() is None

    def _ranks_ended(self) -> int | None:
        """The exit status of the ranks when their launcher said they ended and it waits to start them again, else
        None."""
        if self.ended is None and self.status >= 0:
            with contextlib.suppress(BlockingIOError):
                said = os.read(self.status, 64).decode().split()
                self.ended = int(said[1]) if said[:1] == ["ended"] else None
        return self.ended

    def launch(self) -> None:
        """Launch the server (a new one, after one that ended; new ranks from its launcher, after ranks that ended),
        without waiting for it: ``send`` waits. Servers launched together start side by side."""
        self.generation += 1
        self.n = 0
        if self.proc is not None and self.proc.poll() is None and self._ranks_ended() is not None:
            self.ended, self.waiting = None, True
            self.log_start = self.log.stat().st_size  # tail() says what the new ranks write
            try:
                self.proc.stdin.write(f"respawn {self.prefix}\n".encode())
                self.proc.stdin.flush()
                return
            except OSError:  # the launcher ended meanwhile: a new one
                pass
        self.stop()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=self.pythonpath, DS_ACCELERATOR="cpu",
                   JOB_STORE=f"127.0.0.1:{self.store.port}", JOB_PREFIX=self.prefix,
                   JOB_PRELOAD=",".join(self.preload))
        script = str(self.script)
        if self.nproc == 1:
            env.update(ranks.rank_env(0, 1, ranks.free_port()))
            command = [sys.executable, script]
        else:  # the ranks without torch.distributed.run's agent (scripts/ranks.py), started again by it
            command = [sys.executable, ranks.__file__, str(self.nproc), script]
            self.status, said = os.pipe()
            os.set_blocking(self.status, False)
            env["JOB_RESPAWN"] = str(said)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.log, self.log_start = self.logs / f"{self.prefix}.log", 0
        try:
            with open(self.log, "wb") as out:
                several = self.nproc > 1  # a launcher that starts its ranks again: its word in, its status out
                self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.PIPE if several else subprocess.DEVNULL,
                                             env=launch.site_env(env), cwd=self.logs, start_new_session=True,
                                             preexec_fn=launch.die_with_parent, pass_fds=(said,) if several else ())
        finally:
            if self.nproc > 1:
                os.close(said)
        self.waiting = True

    def _started(self) -> None:
        """Wait until every rank of the server launched last has started; raises KitError when one does not, or when
        a rank imported the upstream from another code than the server's (the release's tree, or the series'
        package)."""
        self.waiting = False
        for attempt in range(3):
            keys = [f"{self.prefix}/started/{rank}" for rank in range(self.nproc)]
            if self._wait(keys, START_TIMEOUT):
                break
            tail = self.tail()
            if attempt < 2 and not self.running() and "EADDRINUSE" in tail:
                # Its rendezvous port was free when chosen (ranks.free_port) and taken by another process before the
                # server bound it: a new server, on another port
                self.launch()
                self.waiting = False
                continue
            self.stop()
            raise KitError(f"the {self.code} server {self.name} on {self.nproc} processes did not start; its log "
                           f"{self.log}: {tail}")
        for key in keys:
            module = Path(self.store.store.get(key).decode())
            if not module.resolve().is_relative_to(self.folder.resolve()):
                self.stop()
                raise KitError(f"the {self.code} server {self.name} imported its upstream from {module}, not from "
                               f"{self.folder}: check PYTHONPATH and the editable installs of upstream/")

    def tail(self, chars: int = 1500) -> str:
        """The end of what the server's ranks launched last wrote to its log."""
        text = ""
        if self.log and self.log.exists():
            with open(self.log, "rb") as f:
                f.seek(self.log_start)
                text = f.read().decode(errors="replace").strip()
        return text[-chars:] or "(no output)"

    def _wait(self, keys: list[str], timeout: float) -> bool:
        """True once every key is set; False when ``timeout`` seconds pass or the server ends first."""
        deadline, pause = time.monotonic() + timeout, 0.002
        while True:
            if all(self.store.store.check([key]) for key in keys):
                return True
            if not self.running() or time.monotonic() > deadline:
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.05)  # a quick step is seen at once, a plan of minutes costs few looks

    def send(self, op: str, args: dict) -> None:
        """Send one operation; the server is launched first when it is not running, and its start awaited (KitError
        when it does not start, see ``_started``)."""
        if not self.running():
            self.launch()
        if self.waiting:
            self._started()
        self.store.store.set(f"{self.prefix}/op/{self.n}", json.dumps({"op": op, "args": args}))
        self.outstanding = True

    def receive(self, timeout: float) -> list[dict]:
        """Every rank's result of the step sent last. A step not done in ``timeout`` seconds, or a server that ended,
        gives ``hang`` or ``crash`` for the ranks without a result (``server`` marks them as this process's, not the
        job's), and the server is stopped."""
        keys = [f"{self.prefix}/res/{self.n}/{rank}" for rank in range(self.nproc)]
        done = self._wait(keys, timeout)
        self.outstanding = False
        results = []
        for key in keys:
            if self.store.store.check([key]):
                results.append(json.loads(self.store.store.get(key)))
            elif self.running():
                results.append({"hang": f"no result after {timeout:.0f} s", "server": True})
            else:
                status = self.proc.returncode if self.ended is None else self.ended
                results.append({"crash": f"the server exited {status}: {self.tail(600)}", "server": True})
        self.n += 1
        ending = [r.pop("ends_rank", False) for r in results]
        if done and any(ending):
            # a rank that sent its result and then ends (tests/rank_worker.py's ``ends_rank``): the next operation
            # goes to new ranks, not to these
            deadline = time.monotonic() + ranks.GRACE + 10
            while self.running() and time.monotonic() < deadline:
                time.sleep(ranks.POLL)
            done = not self.running()
        if not done and self.ended is None:  # ranks that ended are started again by the next launch()
            self.stop(busy=True)
        return results

    def stop(self, busy: bool = False) -> None:
        """End the server and every process below it: an idle one is told to quit first (its ranks end as a job
        does), a ``busy`` one (an operation it did not finish, or one sent and not received) is killed at once."""
        if self.proc is not None:
            if self.proc.poll() is None and not (busy or self.outstanding):
                if self._ranks_ended() is None:
                    self.store.store.set(f"{self.prefix}/op/{self.n}", json.dumps({"op": "quit"}))
                if self.proc.stdin is not None:  # a launcher waiting to start its ranks again exits
                    with contextlib.suppress(OSError):
                        self.proc.stdin.close()
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            launch.kill_tree(self.proc)
            self.proc.wait()
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):  # a respawn line the launcher did not read: a broken pipe
                    self.proc.stdin.close()
            self.proc, self.outstanding, self.ended = None, False, None
        if self.status >= 0:
            os.close(self.status)
            self.status = -1
