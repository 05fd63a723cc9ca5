"""The flow table's columns, reused by content (issue 52): run again only when what they run changed.

A flow's release column (its save and load runs, or its order run) runs the pristine release at both ends, so its
records are a function of neither the series nor the checkout: only of

- the release: the git tree id of ``base/<version>`` of the kit's checkout (its code, whatever the version says);
- the flow: its id, kind and factors;
- the job code: the upstream's job script and every module of the kit it imports (``scripts.cache.kit_files``, found
  from their import statements, so a new import is in the key without a list to keep), ``RUNNERS`` (the runner,
  which writes the plan and the launch's environment, the job servers and the launcher of their ranks) and the task
  timeout;
- the environment: the lock, every installed distribution, the Python and torch (``scripts.cache``).

A flow's series column runs the series (and the release where the flow's ``versions`` says so): its key holds the
same inputs and ``series``, the digest of the upstream's package as the series imports it (every file of the folder of
its ``__init__.py``: the checkout with its uncommitted edits, a gate stage's tree or ``make flows AT=``'s), so an edit
to one upstream's series runs that upstream's series columns again and reuses the other's.

The records are stored, not the verdicts: ``judge.py`` judges reused records as it judges new ones, so the judge's code
is not an input. A column is stored only when every rank recorded every part, none hung, and every crash is the code's
(``code_crash``): a traceback of the job's own, ending in an exception that is not a lost peer or a timeout, or in a
part where another rank's crash is the code's, a lost peer or a rank its launcher ended. A crash that may be the
machine's (a rank killed, so its record is the runner's; a reset connection or a timeout alone) runs again each time.
Entries live in ``build/flows-cache/<key>/entry.json`` (``scripts.cache``); ``make flows FLOWS_CACHE=0`` and ``make
test FLOWS_CACHE=0`` run every column and store anew."""

import os
import re
from pathlib import Path

from scripts import cache
from scripts.flows.judge import PEER_LOST, crash_line, lost_peer
from scripts.sources import KIT_ROOT

CACHE = KIT_ROOT / "build" / "flows-cache"
# What runs a plan besides the job script: the runner (the plan, the launch's environment), the job servers, the
# launcher of their ranks and the sitecustomize every launched process loads
RUNNERS = tuple(KIT_ROOT / "scripts" / name for name in ("flows/run.py", "servers.py", "ranks.py",
                                                         "launch_site/sitecustomize.py"))


def reuse_on() -> bool:
    """Whether stored columns are reused: not when the environment says ``FLOWS_CACHE=0`` (or no, false)."""
    return os.environ.get("FLOWS_CACHE", "").strip().lower() not in ("0", "no", "false")


def release_inputs(repo: Path, version: str, job: Path, task_timeout: float) -> dict:
    """What every column of every flow shares: the release (``version`` and the tree of ``base/<version>`` in the
    checkout ``repo``), the job code (``job`` and what it imports, ``RUNNERS``) and the environment. Raises KitError
    when ``repo`` has no ``base/<version>`` (run make apply)."""
    return cache.run_inputs(repo, version, job, RUNNERS, task_timeout, KIT_ROOT)


def series_code(package: Path) -> str:
    """The digest of the series' code: sha256 of every file (names and contents) under ``package``, the folder of the
    upstream's ``__init__.py`` as the series imports it."""
    return cache.files_digest(cache.source_files(package), package)


def key(shared: dict, flow: dict, series: str = "") -> str:
    """The key of ``flow``'s release column (``series`` empty) or series column (``series``: ``series_code``):
    sha256 of ``shared`` (``release_inputs``), the flow and the series' code."""
    return cache.key({**shared, "flow": {k: flow[k] for k in ("id", "kind", "factors")},
                      **({"series": series} if series else {})})


def load(folder: Path, column_key: str) -> dict | None:
    """The stored column of ``column_key``: {"run": when it ran, "parts": {part: [rank records]}}; None
    when there is none."""
    entry = cache.read(folder, column_key)
    return entry if entry and isinstance(entry.get("parts"), dict) else None


# The last line of a traceback that may be the machine's rather than the code's: a peer lost (Gloo), a timeout, memory,
# a DataLoader worker killed
MACHINE_CRASH = re.compile(PEER_LOST.pattern + r"|timed out|Timed out|Timeout|MemoryError|killed by signal|"
                           r"exited unexpectedly")


def code_crash(record: dict) -> bool:
    """Whether ``record`` is a crash the job recorded (its traceback; not the runner's note of a rank that wrote none)
    whose exception is the code's: its last line names no lost peer, timeout, memory error or killed worker."""
    line = crash_line(record)
    return not record.get("runner") and bool(line) and not MACHINE_CRASH.search(line)


def storable(parts: dict) -> bool:
    """Whether a column's records may be reused: every rank recorded every part, none hung, and each part's
    crashes are the code's (``code_crash``), or beside one that is, a lost peer or a rank the launcher ended (the
    runner's note: a rank that exits ends the others of its job). Anything else may be the machine's and runs again
    each time."""
    records = [r for found in parts.values() for r in found]
    if not records or any(r is None or "hang" in r for r in records):
        return False
    for found in parts.values():
        crashes = [r for r in found if "crash" in r]
        others = [r for r in crashes if not code_crash(r)]
        if crashes and (len(others) == len(crashes)
                        or not all(r.get("runner") or lost_peer(r) for r in others)):
            return False
    return True


def store(folder: Path, column_key: str, parts: dict) -> None:
    """Store a column's ``parts`` under ``column_key`` with the time it ran (UTC). Raises OSError when the
    disk refuses."""
    cache.write(folder, column_key, {"run": cache.now(), "parts": parts})
