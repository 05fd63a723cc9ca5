"""The history search: Hypothesis' stateful testing draws histories of operations, runs each step on both sides, judges
after every step, and shrinks a history that fails to a minimal one.

The grammar is a ``RuleBasedStateMachine`` per upstream: ``start`` draws the job's configuration, and each rule is
one operation of a user's job with its arguments drawn, under preconditions that keep it a job a user
writes (``set_epoch`` at the top of a pass; a restart loads a folder that a save wrote). The invariant after every
step is ``judge.findings``: a finding whose ``signature`` is not among ``known`` fails the history. Hypothesis then
shrinks it (fewer steps, smaller arguments), replaying each candidate on the live servers.
"""

import shutil
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as use_seed
from hypothesis import strategies as st
from hypothesis.errors import FlakyStrategyDefinition
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    precondition,
    rule,
)

from scripts.histories import judge
from scripts.histories.history import AUTOMATIC, History

DATA = ("shuffled", "epoch-tagged", "level-tagged", "own-random-batches")
CONFIGS = {
    "accelerate": st.fixed_dictionaries({
        "processes": st.sampled_from(["1", "2"]),
        "loader": st.sampled_from(["shard", "dispatcher"]),
        "workers": st.sampled_from(["2", "0", "2-persistent"]),
        "seeding": st.sampled_from(["one-seed", "per-process"]),
        "data": st.lists(st.sampled_from(DATA), min_size=1, max_size=2),
        # ``automatic``: ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=2), tests/histories/
        "naming": st.sampled_from(["folders", "automatic"]),
    }),
    # two ranks are data-parallel, or an mpu of tensor-parallel size 2 whose rank 0 reads and broadcasts (``tensor``)
    # or whose ranks each read their own loader (``tensor-each``), or the 2 stages of a pipeline (``pipeline``):
    # tests/flows/deepspeed_job.py
    "deepspeed": st.fixed_dictionaries({
        "processes": st.sampled_from(["1", "2"]),
        "parallel": st.sampled_from(["data", "tensor", "tensor-each", "pipeline"]),
        "workers": st.sampled_from(["0", "2"]),
        "clusters": st.sampled_from(["single", "schedule", "two-metrics", "shared-path"]),
    }).map(lambda config: config if config["processes"] == "2" else {**config, "parallel": "data"}),
}
STEPS = 14  # steps of a history at most (Hypothesis draws fewer, and shrinks)


class Found(AssertionError):
    """A history with a finding the search did not know; its record and findings."""

    def __init__(self, record: dict, found: list[dict]):
        super().__init__("; ".join(f"step {f['step']}: {f['kind']}: {f['detail']}" for f in found))
        self.record, self.found = record, found


def machine(upstream: str, servers: dict, root: Path, known: set, ran: list) -> type:
    """The state machine of ``upstream``'s histories on ``servers`` (side -> ``servers.Servers``), its checkpoint
    folders under ``root``; a finding whose signature is in ``known`` does not fail a history; each history's record
    is appended to ``ran``."""

    class Histories(RuleBasedStateMachine):
        @initialize(config=CONFIGS[upstream])
        def start(self, config):
            shutil.rmtree(root / f"h{len(ran) - 1}", ignore_errors=True)  # the history before this one's folders
            self.history = History(servers, root / f"h{len(ran)}", config)
            ran.append(self.history.record)

        @precondition(lambda self: self.history.saves)
        @rule(older=st.integers(0, 2), iterator_first=st.booleans(), module_only=st.booleans())
        def restart(self, older, iterator_first, module_only):
            saves = self.history.saves
            args = {"folder": saves[max(len(saves) - 1 - older, 0)]}
            if upstream == "deepspeed":  # the training iterator built before the load, as RepeatingLoader and the
                # pipeline engine do (a pipeline's always is); an engine's checkpoint loaded with load_module_only (the
                # data begins again)
                args |= {"iterator_first": True} if iterator_first and not self.pipeline() else {}
                args |= {"module_only": True} if module_only and self.history.saved_how[args["folder"]] == "engine" \
                    else {}
            self.history.step("restart", args)

        @invariant()
        def no_regression(self):
            if not hasattr(self, "history"):
                return
            new = [f for f in judge.findings(self.history.record) if f["signature"] not in known]
            if new:
                raise Found(self.history.record, new)

    class AccelerateHistories(Histories):
        def _loader(self, index):
            return index % len(self.history.config["data"])

        def _automatic(self):
            return self.history.config.get("naming") == "automatic"

        @rule(loader=st.integers(0, 1), k=st.sampled_from([9, 2, 1, 3, 5]))
        def train(self, loader, k):
            self.history.step("train", {"loader": self._loader(loader), "k": k})

        @rule(loader=st.integers(0, 1))
        def set_epoch(self, loader):
            if not self.history.open(self._loader(loader)):  # at the top of a pass, as a training loop calls it
                self.history.step("set_epoch", {"loader": self._loader(loader)})

        @rule()
        def raise_level(self):
            self.history.step("raise_level", {})

        @rule(loader=st.integers(0, 1))
        def state_dict(self, loader):
            self.history.step("state_dict", {"loader": self._loader(loader)})

        @rule(how=st.sampled_from(["every", "main-only", "torch-save", "dcp"]), folder=st.integers(0, 2))
        def save(self, how, folder):
            if self._automatic() and how in ("every", "main-only"):  # save_state() names the folder:
                # checkpoint_<iteration> under checkpoints/, the iteration counted over the history (a restarted job
                # sets it, as Accelerate's error asks); with automatic naming save_state() waits for every process:
                # none saves alone
                n = sum(s["op"] == "save" and s["args"]["how"] == "automatic" for s in self.history.record["steps"])
                self.history.step("save", {"how": "automatic", "folder": f"{AUTOMATIC}checkpoint_{n}"})
            else:
                self.history.step("save", {"how": how, "folder": f"checkpoint_{folder}"})

    class DeepSpeedHistories(Histories):
        def pipeline(self):
            return self.history.config.get("parallel") == "pipeline"

        @rule(k=st.integers(1, 3))
        def train(self, k):
            self.history.step("train", {"k": k})

        @rule(how=st.sampled_from(["engine", "sampler"]), folder=st.integers(0, 2),
              shape=st.sampled_from(["native", "pr8406", "legacy"]))
        def save(self, how, folder, shape):
            args = {"how": how, "folder": f"step_{folder}"}
            self.history.step("save", args | ({"shape": shape} if how == "sampler" else {}))

        @precondition(lambda self: not self.pipeline())  # the pipeline engine reads its own: no loop of the user's
        @rule()
        def break_loop(self):
            self.history.step("break_loop", {})

        @precondition(lambda self: len(self.history.saves) > 2)
        @rule()
        def keep_last_2(self):
            self.history.step("keep_last", {"k": 2})

    return {"accelerate": AccelerateHistories, "deepspeed": DeepSpeedHistories}[upstream]


# histories a round of Hypothesis draws at most: the budget is checked between rounds, so a search ends at most a
# round after it, or, when the round found a failure, after its shrinking (which Hypothesis stops after 300 s)
ROUND = 10


def search(upstream: str, servers: dict, root: Path, seconds: float, seed: int, known: set, say=print,
           first: bool = False, rounds: int | None = None) -> dict:
    """Run histories for about ``seconds`` from ``seed`` (round r of Hypothesis gets seed + r); a failing history is
    shrunk, reported, its signatures added to ``known``, and the search goes on with the next round (``first``: it
    ends there; ``rounds``: at most that many rounds).

    Returns ``{"histories": n run (shrinking's replays included), "found": [{"record", "findings", "after": the
    histories run by then, shrinking included, "seconds"}], "rounds", "seconds"}``."""
    started, found, ran, round_ = time.monotonic(), [], [], 0
    deadline = started + seconds
    while time.monotonic() < deadline and (rounds is None or round_ < rounds):
        test = get_state_machine_test(machine(upstream, servers, root, known, ran), settings=settings(
            max_examples=ROUND, stateful_step_count=STEPS, deadline=None, database=None,
            suppress_health_check=list(HealthCheck), phases=[Phase.generate, Phase.shrink],
            report_multiple_bugs=False, print_blob=False))
        test = use_seed(seed + round_)(test)
        round_ += 1
        try:
            test()
        except (Found, ExceptionGroup) as e:  # a group: Hypothesis saw the failure go away once (FlakyFailure)
            e = e if isinstance(e, Found) else next((x for x in e.exceptions if isinstance(x, Found)), None)
            if e is None:
                raise
            found.append({"record": e.record, "findings": e.found, "after": len(ran),
                          "seconds": round(time.monotonic() - started)})
            known.update(f["signature"] for f in e.found)
            say(f"fuzz: round {round_}, {len(ran)} histories, {time.monotonic() - started:.0f} s: found "
                f"{str(e)[:300]}")
            if first:
                break
        except FlakyStrategyDefinition:  # a replay drew other steps than its first run: the system under test varied
            say(f"fuzz: round {round_}: a history ran otherwise when Hypothesis replayed it; the round is dropped")
    return {"histories": len(ran), "found": found, "rounds": round_, "seconds": round(time.monotonic() - started)}
