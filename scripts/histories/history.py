"""Run one history: its steps on the release and on the series, side by side, each beside its uninterrupted model.

A history starts with a configuration (``processes`` and what the upstream's job script reads) and goes on with
steps: data steps (``DATA_OPS``: what the uninterrupted job also takes), ``state_dict``, ``save`` (an ``automatic``
one deletes the oldest automatic folders beyond ``TOTAL_LIMIT``), ``keep_last`` (all but the last k saved folders
deleted), ``break_loop`` (the subject leaves its loop over the loader; the
uninterrupted job reads on) and ``restart``.
Each side is one server (``servers.py``) whose ranks hold the subject and the model job
(``tests/histories/<upstream>_job.py``). This module keeps the model's *timeline*: the data steps of the
uninterrupted job so far. A save keeps a copy of the timeline; a restart that loads that save puts the timeline back
to that copy, and the model is rebuilt and replays it, so the subject's next batches are compared with what the
uninterrupted job reads from the checkpoint on. DeepSpeed's only data step is ``train``; the Accelerate job also has
``set_epoch`` (the epoch is the timeline's) and ``raise_level``.

The record (``History.record``) is what ``judge.py`` judges and what a stored flow replays (its ``config``
and its ``steps``' ``op`` and ``args``).
"""

import time
from pathlib import Path

from scripts.histories.servers import SIDES, STEP_TIMEOUT, Servers

DATA_OPS = ("train", "set_epoch", "raise_level")
# Accelerate's automatic naming (the ``naming`` level ``automatic``): a save with ``how`` ``automatic`` is
# ``save_state()`` into ``checkpoints/checkpoint_<n>`` with ``ProjectConfiguration(total_limit=TOTAL_LIMIT)``, which
# deletes the oldest of those folders first (tests/histories/accelerate_job.py)
AUTOMATIC = "checkpoints/"
TOTAL_LIMIT = 2


class History:
    """One history being run (see the module's docstring). ``servers``: side -> Servers; ``root``: where its
    checkpoint folders go (a folder per side)."""

    def __init__(self, servers: dict[str, Servers], root: Path, config: dict):
        self.servers, self.root, self.config = servers, root, config
        self.nproc = int(config["processes"])
        self.timeline: list[dict] = []  # the uninterrupted job's data steps: {"op", "args"}
        self.saved: dict[str, list] = {}  # folder -> the timeline at its last save
        self.saved_how: dict[str, str] = {}  # folder -> how its last save saved (a restart loads it that way)
        self.saves: list[str] = []  # folders in the order of their last save, oldest first
        self.stopped = {side: False for side in SIDES}
        self.failed: dict[str, list] = {}  # side -> the results of a reset or replay that failed, for the next step
        self.record = {"config": config, "steps": []}
        self._all("reset", {"config": config})
        self.step("restart", {})

    def _all(self, op: str, args: dict) -> dict:
        """Send ``op`` to every side that has not stopped, each on its own server, all before any is awaited, and
        collect the results under one deadline; a side that fails (hangs, crashes, refuses) stops."""
        live = [side for side in SIDES if not self.stopped[side]]
        sent = []
        for side in live:
            server = self.servers[side].get(side, self.nproc)  # the side's code is its name
            server.send(op, {**args, "root": str(self.root / side), "config": self.config})
            sent.append(server)
        deadline = time.monotonic() + STEP_TIMEOUT
        results = {side: server.receive(max(deadline - time.monotonic(), 1.0))
                   for side, server in zip(live, sent, strict=True)}
        for side in live:
            if any("hang" in r or "crash" in r or "error" in r for r in results[side]):
                self.stopped[side] = True
                if op in ("reset", "replay"):
                    self.failed[side] = results[side]
        return {side: results.get(side) for side in SIDES}

    def epoch(self, loader: int) -> int:
        """The uninterrupted job's epoch of ``loader``: the passes its timeline ended."""
        return sum(1 for s in self.timeline if s["op"] == "train" and s["args"]["loader"] == loader and s["ended"])

    def open(self, loader: int) -> bool:
        """True when the uninterrupted job is inside a pass of ``loader`` (read from it since its last pass ended)."""
        for s in reversed(self.timeline):
            if s["op"] == "train" and s["args"]["loader"] == loader:
                return not s["ended"]
        return False

    def step(self, op: str, args: dict) -> dict:
        """Run one step on both sides; append it to the record and return it."""
        if op == "set_epoch":
            args = {**args, "epoch": self.epoch(args["loader"])}
        if op == "restart" and args.get("folder"):
            args = {**args, "saved_how": self.saved_how[args["folder"]]}
        if op == "keep_last":
            args = {**args, "folders": self.saves[:-args["k"]]}
        if op == "restart" and self.record["steps"]:  # the model goes back to the checkpoint (or the start: a
            # restart that loads no data state, as DeepSpeed's load_module_only)
            self.timeline = list(self.saved[args["folder"]]) if args.get("folder") and not args.get(
                "module_only") else []
            self._all("replay", {"steps": self.timeline})
        failed = self.failed
        self.failed = {}
        results = self._all(op, args) | failed  # a side whose reset or replay failed: those results, at this step
        step = {"op": op, "args": args, **results}
        self.record["steps"].append(step)
        if op in DATA_OPS:
            ended = False
            for side in SIDES:  # the release's model first: the same passes on both sides
                if results[side] is not None and "model" in results[side][0]:
                    ended = bool(results[side][0]["model"].get("ended"))
                    break
            self.timeline.append({"op": op, "args": args, "ended": ended})
        elif op == "save":
            self.saved[args["folder"]] = list(self.timeline)
            self.saved_how[args["folder"]] = args["how"]
            self.saves = [f for f in self.saves if f != args["folder"]] + [args["folder"]]
            if args["how"] == "automatic":  # total_limit: the oldest automatic folders were deleted
                self._forget([f for f in self.saves if f.startswith(AUTOMATIC)][:-TOTAL_LIMIT])
        elif op == "keep_last":  # the folders before the last k are deleted
            self._forget(self.saves[:-args["k"]])
        return step

    def _forget(self, folders: list[str]) -> None:
        """Deleted folders: a restart no longer loads them."""
        for folder in folders:
            del self.saved[folder], self.saved_how[folder]
        self.saves = [f for f in self.saves if f not in folders]

    def done(self) -> bool:
        """True when both sides have stopped (nothing more to compare)."""
        return all(self.stopped.values())


def replay(servers: dict[str, Servers], root: Path, start: dict, steps: list[dict]) -> dict:
    """Run a stored history (``start``: its configuration; ``steps``: ``{"op", "args"}``) and return its record."""
    history = History(servers, root, start)
    for s in steps:
        if history.done():
            break
        history.step(s["op"], s["args"])
    return history.record
