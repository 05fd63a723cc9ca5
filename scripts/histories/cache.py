"""The sides of the stored histories, reused by content (issue 52): replayed again only when what they run changed.

A stored history (``tests/histories/<upstream>.json``) replays the same steps on the release and on the series; the
release side's exchanges (each operation ``history.py`` sent it and every rank's result) are a function of

- the release: ``version`` and the git tree id of ``base/<version>`` of the kit's checkout;
- the history: its configuration and steps;
- the job code: ``tests/histories/<upstream>_job.py`` and every module of the kit it imports, ``SENDERS``
  (``history.py`` and the servers, which send the steps, the launcher of their ranks and the sitecustomize each
  launched process loads), and the step timeout;
- the environment: the lock, every installed distribution, the Python and torch (``scripts.cache``).

The series side's exchanges are a function of the same and of the series' code (the digest of the upstream's package
as the series imports it, ``scripts.flows.cache.series_code``). A side that is stored is answered from the recording
(``Recorded``): no server of that side starts, and ``judge.py`` judges the record as it judges a live one. A side is
stored only when every result in it came from the job (no hang, no crash this process wrote for a server that ended);
entries live beside the flow table's in ``build/flows-cache/``, and ``FLOWS_CACHE=0`` replays every side and stores
anew.
"""

from pathlib import Path

from scripts import KitError, cache
from scripts.histories import history
from scripts.histories.servers import JOBS, SIDES, STEP_TIMEOUT, Servers
from scripts.sources import KIT_ROOT

SENDERS = [KIT_ROOT / "scripts" / "histories" / name for name in ("history.py", "servers.py")] + [
    KIT_ROOT / "scripts" / name for name in ("servers.py", "ranks.py", "launch_site/sitecustomize.py")]


class Recording:
    """A side's servers (``Servers``), keeping every exchange: ``[op, results]`` in the order sent."""

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
    """A side answered from a recording (``Recording.exchanges``), in order. Raises KitError when an
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
            raise KitError(f"histories: the stored side has no {self.op!r} here: remove build/flows-cache "
                           "and run again")
        return self.exchanges.pop(0)[1]


def release_inputs(repo: Path, version: str, upstream: str) -> dict:
    """What every stored history of ``upstream`` shares in its key (see the module's docstring)."""
    return cache.run_inputs(repo, version, JOBS[upstream], SENDERS, STEP_TIMEOUT)


def storable(exchanges: list) -> bool:
    """Whether a side may be reused: some exchange, and every result the job's own."""
    return bool(exchanges) and all(r is not None and "server" not in r for _, results in exchanges for r in results)


def load(folder: Path, entry_key: str) -> dict | None:
    """The side stored under ``entry_key``: {"run": when it ran, "exchanges": [[op, results], ...]}; None when
    there is none or it is not of that shape (then the side runs)."""
    entry = cache.read(folder, entry_key)
    exchanges = (entry or {}).get("exchanges")
    shaped = isinstance(exchanges, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[1], list) for e in exchanges)
    return entry if shaped and isinstance(entry.get("run"), str) else None


def replay_stored(servers: dict[str, Servers], work: Path, entries: list[dict], shared: dict, series: str,
                  folder: Path, reuse: bool = True, say=print) -> tuple[dict, dict]:
    """Replay the stored ``entries`` (``stored.load``) on ``servers`` (side -> Servers) in ``work``, each side read
    from ``folder`` when ``reuse`` and its key is there (``shared``: ``release_inputs``; the entry's config and steps;
    for the series side also ``series``, the digest of its code, ``scripts.flows.cache.series_code``), else recorded
    and stored there when it may be. Returns ({entry id: record}, {side: {entry id: when its reused exchanges ran}}).
    A side that cannot be stored (the disk refuses) is said so through ``say``."""
    records, reused = {}, {side: {} for side in SIDES}
    for entry in entries:
        inputs = {**shared, "history": {"config": entry["config"], "steps": entry["steps"]}}
        keys = {"release": cache.key(inputs), "series": cache.key({**inputs, "series": series})}
        found = {side: load(folder, keys[side]) if reuse else None for side in SIDES}
        sides = {side: Recorded(found[side]["exchanges"]) if found[side] else Recording(servers[side])
                 for side in SIDES}
        records[entry["id"]] = history.replay(sides, work / "checkpoints" / entry["id"], entry["config"],
                                              entry["steps"])
        for side in SIDES:
            if found[side]:
                reused[side][entry["id"]] = found[side]["run"]
            elif storable(sides[side].exchanges):
                try:
                    cache.write(folder, keys[side], {"run": cache.now(), "exchanges": sides[side].exchanges})
                except OSError as e:  # the record stands; the next replay runs the side again
                    say(f"histories: the {side} side of {entry['id']} is not kept in {folder}: {e}")
    return records, reused
