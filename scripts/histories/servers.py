"""Live job servers of the history search: launches of a job script that take their steps from this process.

A server is one launch (``torch.distributed.run`` for 2 processes, the script itself for one) of
``tests/histories/<upstream>_job.py`` on one code (the release's tree first on ``PYTHONPATH``, or the series as this
Python imports it), kept alive across histories: the start-up (imports, rendezvous, the forkserver) is paid once per
server, not per history. Steps go through a ``torch.distributed.TCPStore`` this process serves on a free loopback
port: ``<prefix>/op/<n>`` one JSON operation, ``<prefix>/res/<n>/<rank>`` each rank's JSON result.

A step that takes longer than its timeout, or a server that dies, ends the server (its whole process tree killed,
``scripts/launch.py``); the step's result says ``hang`` or ``crash``, and the next step starts a new server.
"""

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from scripts import KitError, launch
from scripts.flows import run as flows_run
from scripts.sources import KIT_ROOT

JOBS = {name: KIT_ROOT / "tests" / "histories" / f"{name}_job.py" for name in ("accelerate", "deepspeed")}
SIDES = ("release", "series")
START_TIMEOUT = 180.0  # seconds a server may take to start (imports, rendezvous)
STEP_TIMEOUT = float(os.environ.get("HISTORY_STEP_TIMEOUT", "60"))  # seconds one step may take on every rank


class Store:
    """The TCPStore the servers read their steps from, served by this process on a free loopback port."""

    def __init__(self):
        import torch.distributed as dist

        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=STEP_TIMEOUT))
        self.port = self.store.port  # the kernel's choice: no race with another process for a free port


class Server:
    """One launch of a job script on one code and process count (see the module's docstring)."""

    def __init__(self, store: Store, upstream: str, code: str, nproc: int, pythonpath: str, logs: Path,
                 release: Path):
        self.store, self.upstream, self.code, self.nproc = store, upstream, code, nproc
        self.pythonpath, self.logs, self.release = pythonpath, logs, release
        self.proc, self.generation, self.n, self.log = None, 0, 0, None

    @property
    def prefix(self) -> str:
        return f"{self.upstream}-{self.code}-x{self.nproc}-{self.generation}"

    def start(self) -> None:
        """Launch the server and wait until every rank has started; raises KitError when it does not, or when a rank
        imported the upstream from another code than the server's (the release's tree, or anywhere else for the
        series)."""
        self.generation += 1
        self.n = 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
        env.update(OMP_NUM_THREADS="1", PYTHONPATH=self.pythonpath, DS_ACCELERATOR="cpu",
                   HISTORY_STORE=f"127.0.0.1:{self.store.port}", HISTORY_PREFIX=self.prefix)
        script = str(JOBS[self.upstream])
        if self.nproc == 1:
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(flows_run.free_port()))
            command = [sys.executable, script]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={self.nproc}", script]
        self.logs.mkdir(parents=True, exist_ok=True)
        self.log = self.logs / f"{self.prefix}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=launch.site_env(env), cwd=self.logs, start_new_session=True,
                                         preexec_fn=launch.die_with_parent)
        keys = [f"{self.prefix}/started/{rank}" for rank in range(self.nproc)]
        if not self._wait(keys, START_TIMEOUT):
            tail = self.tail()
            self.stop()
            raise KitError(f"histories: the {self.code} server of {self.upstream} on {self.nproc} processes did not "
                           f"start; its log {self.log}: {tail}")
        for key in keys:
            module = Path(self.store.store.get(key).decode())
            if module.resolve().is_relative_to(self.release.resolve()) != (self.code == "release"):
                self.stop()
                raise KitError(f"histories: the {self.code} server imported {self.upstream} from {module}: check "
                               f"PYTHONPATH and the editable install of upstream/{self.upstream}")

    def tail(self, chars: int = 1500) -> str:
        text = self.log.read_text(errors="replace").strip() if self.log and self.log.exists() else ""
        return text[-chars:] or "(no output)"

    def _wait(self, keys: list[str], timeout: float) -> bool:
        """True once every key is set; False when ``timeout`` seconds pass or the server ends first."""
        deadline = time.monotonic() + timeout
        while True:
            if all(self.store.store.check([key]) for key in keys):
                return True
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def send(self, op: str, args: dict) -> None:
        """Send one step (the server starts first when it is not running)."""
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self.start()
        self.store.store.set(f"{self.prefix}/op/{self.n}", json.dumps({"op": op, "args": args}))

    def receive(self, timeout: float = STEP_TIMEOUT) -> list[dict]:
        """Every rank's result of the step sent last. A step not done in ``timeout`` seconds, or a server that ended,
        gives ``hang`` or ``crash`` for the ranks without a result, and the server is stopped."""
        keys = [f"{self.prefix}/res/{self.n}/{rank}" for rank in range(self.nproc)]
        done = self._wait(keys, timeout)
        results = []
        for key in keys:
            if self.store.store.check([key]):
                results.append(json.loads(self.store.store.get(key)))
            elif self.proc.poll() is None:
                results.append({"hang": f"no result after {timeout:.0f} s"})
            else:
                results.append({"crash": f"the server exited {self.proc.returncode}: {self.tail(600)}"})
        self.n += 1
        if not done:
            self.stop()
        return results

    def stop(self) -> None:
        """End the server and every process below it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.store.store.set(f"{self.prefix}/op/{self.n}", json.dumps({"op": "quit"}))
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
            launch.kill_tree(self.proc)
            self.proc.wait()
            self.proc = None


class Servers:
    """The servers of one search, one per (code, process count), started when first used; ``close()`` ends them."""

    def __init__(self, upstream: str, work: Path, release: Path):
        """``release``: the directory of the release's tree to put first on ``PYTHONPATH``
        (``scripts.flows.run.release_tree``)."""
        self.upstream, self.work, self.release = upstream, work, release
        series = os.environ.get("PYTHONPATH", "")
        self.pythonpath = {"series": series, "release": flows_run.first_on(release, series)}
        self.store = Store()
        self.servers: dict[tuple[str, int], Server] = {}

    def get(self, code: str, nproc: int) -> Server:
        key = (code, nproc)
        if key not in self.servers:
            self.servers[key] = Server(self.store, self.upstream, code, nproc, self.pythonpath[code],
                                       self.work / "logs", self.release)
        return self.servers[key]

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()


def for_sides(upstream: str, work: Path) -> dict[str, Servers]:
    """The servers of each side (``SIDES``) of a search of ``upstream`` under ``work``, the release's tree made once.
    Raises KitError when there is no checkout of the release (``make apply``)."""
    release = flows_run.release_tree(upstream, work / "trees")
    return {side: Servers(upstream, work / side, release) for side in SIDES}
