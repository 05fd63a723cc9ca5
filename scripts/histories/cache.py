"""The release side of the stored histories, reused by content (issue 52): replayed again only when what it runs
changed.

A stored history (``tests/histories/<upstream>.json``) replays the same steps on the release and on the series; the
release side's exchanges (each operation ``history.py`` sent it and every rank's result) are a function of

- the release: ``version`` and the git tree id of ``base/<version>`` of the kit's checkout;
- the history: its configuration and steps;
- the job code: ``tests/histories/<upstream>_job.py`` and every module of the kit it imports, ``SENDERS``
  (``history.py`` and the servers, which send the steps, the launcher of their ranks and the sitecustomize each
  launched process loads), and the step timeout;
- the environment: the lock, every installed distribution, the Python and torch (``scripts.cache``).

A replay whose release side is stored answers that side from the recording (``Recorded``): no release server starts;
the series side runs live, and ``judge.py`` judges the record as it judges a live one. A release side is stored only
when every result in it came from the job (no hang, no crash this process wrote for a server that ended); entries live
beside the flow table's in ``build/flows-cache/``, and ``FLOWS_CACHE=0`` replays every release side and stores anew.
"""

from pathlib import Path

from scripts import KitError, cache
from scripts.histories import history
from scripts.histories.servers import JOBS, STEP_TIMEOUT, Servers
from scripts.sources import KIT_ROOT

SENDERS = [KIT_ROOT / "scripts" / "histories" / name for name in ("history.py", "servers.py")] + [
    KIT_ROOT / "scripts" / name for name in ("servers.py", "ranks.py", "launch_site/sitecustomize.py")]


class Recording:
    """The release side's servers (``Servers``), keeping every exchange: ``[op, results]`` in the order sent."""

    def __init__(self, servers: Servers):
        self.servers, self.exchanges, self.server, self.op = servers, [], None, ""

    def get(self, code: str, nproc: int) -> "Recording":
        self.server = self.servers.get(code, nproc)
        return self

    def send(self, op: str, args: dict) -> None:
        self.op = op
        self.server.send(op, args)

    def receive(self, timeout: float = STEP_TIMEOUT) -> list[dict]:
        results = self.server.receive(timeout)
        self.exchanges.append([self.op, results])
        return results


class Recorded:
    """A release side answered from a recording (``Recording.exchanges``), in order. Raises KitError when an
    operation is not the one recorded (the history's steps or ``history.py`` differ from the recording's: its key
    should have changed)."""

    def __init__(self, exchanges: list):
        self.exchanges, self.op = list(exchanges), ""

    def get(self, code: str, nproc: int) -> "Recorded":
        return self

    def send(self, op: str, args: dict) -> None:
        self.op = op

    def receive(self, timeout: float = STEP_TIMEOUT) -> list[dict]:
        if not self.exchanges or self.exchanges[0][0] != self.op:
            raise KitError(f"histories: the stored release side has no {self.op!r} here: remove build/flows-cache "
                           "and run again")
        return self.exchanges.pop(0)[1]


def release_inputs(repo: Path, version: str, upstream: str) -> dict:
    """What every stored history of ``upstream`` shares in its key (see the module's docstring)."""
    return cache.run_inputs(repo, version, JOBS[upstream], SENDERS, STEP_TIMEOUT)


def storable(exchanges: list) -> bool:
    """Whether a release side may be reused: some exchange, and every result the job's own."""
    return bool(exchanges) and all(r is not None and "server" not in r for _, results in exchanges for r in results)


def load(folder: Path, entry_key: str) -> dict | None:
    """The release side stored under ``entry_key``: {"run": when it ran, "exchanges": [[op, results], ...]}; None when
    there is none or it is not of that shape (then the side runs)."""
    entry = cache.read(folder, entry_key)
    exchanges = (entry or {}).get("exchanges")
    shaped = isinstance(exchanges, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[1], list) for e in exchanges)
    return entry if shaped and isinstance(entry.get("run"), str) else None


def replay_stored(servers: dict[str, Servers], work: Path, entries: list[dict], shared: dict, folder: Path,
                  reuse: bool = True, say=print) -> tuple[dict, dict]:
    """Replay the stored ``entries`` (``stored.load``) on ``servers`` (side -> Servers) in ``work``, each release side
    read from ``folder`` when ``reuse`` and its key (``shared``: ``release_inputs``; the entry's config and steps) is
    there, else recorded and stored there when it may be. Returns ({entry id: record}, {entry id: when its reused
    release side ran}). A side that cannot be stored (the disk refuses) is said so through ``say``."""
    records, reused = {}, {}
    for entry in entries:
        entry_key = cache.key({**shared, "history": {"config": entry["config"], "steps": entry["steps"]}})
        stored = load(folder, entry_key) if reuse else None
        release = Recorded(stored["exchanges"]) if stored else Recording(servers["release"])
        records[entry["id"]] = history.replay({**servers, "release": release}, work / "checkpoints" / entry["id"],
                                              entry["config"], entry["steps"])
        if stored:
            reused[entry["id"]] = stored["run"]
        elif storable(release.exchanges):
            try:
                cache.write(folder, entry_key, {"run": cache.now(), "exchanges": release.exchanges})
            except OSError as e:  # the record stands; the next replay runs the side again
                say(f"histories: the release side of {entry['id']} is not kept in {folder}: {e}")
    return records, reused
