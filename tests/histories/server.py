"""What the history search's job servers share: the rank's two jobs, the steps' loop over the controller's store, and
what a step is measured by.

A job server (``tests/histories/<upstream>_job.py``) is launched by ``scripts/histories/servers.py`` and kept alive
across histories. It reads operations from the controller's ``TCPStore`` and writes one result per rank and
operation (``scripts/servers.py``, ``tests/rank_worker.py``'s ``serve``).

A rank holds two jobs of the same configuration: the ``subject``, which takes every step of the history (saves,
``state_dict()`` calls, crashes and restarts), and the ``model``, the uninterrupted job: it takes only the steps that
read or change data, and after a restart it is built afresh and replays the steps before the checkpoint the subject
loaded. Each job owns its global random states (torch, numpy, Python): they are swapped in and out when the rank
switches jobs, so neither job's draws reach the other's. What a step started is measured on the subject: DataLoader
worker processes (new processes below the rank, its forkserver aside) and the user code counted in ``calls``.
"""

import gc
import multiprocessing.forkserver
import os
import random
import shutil
import traceback

import numpy as np
import torch
import torch.distributed as dist

from scripts import launch
from tests import rank_worker


def rng_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def set_rng_states(states):
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


class Rank:
    """The jobs of this rank and the operations every server takes: ``reset`` (a new history: its checkpoint root
    emptied, the model built), ``replay`` (the model built afresh, then the data steps given), the data steps
    (``DATA_OPS``, on the model and the subject). ``job_class(config, rank, name)`` builds a job with
    ``data_step(op, args)`` and ``close()``; ``other(op, args)`` takes the rest (saves, restarts, ...)."""

    DATA_OPS = ("train",)

    def __init__(self, rank, world, job_class):
        self.rank, self.world, self.job_class = rank, world, job_class
        self.jobs, self.current, self.root = {}, None, None

    def switch(self, name):
        """Make job ``name``'s random states the global ones (the other job's are kept in it)."""
        if self.current != name:
            if self.current in self.jobs:
                self.jobs[self.current].rng = rng_states()
            if self.jobs[name].rng is not None:
                set_rng_states(self.jobs[name].rng)
            self.current = name
        return self.jobs[name]

    def fresh(self, name, config):
        """A new job ``name`` (the old one closed first; its workers stop)."""
        if name in self.jobs:
            self.jobs.pop(name).close()
            gc.collect()
        if self.current in self.jobs:
            self.jobs[self.current].rng = rng_states()
        self.current = name
        self.jobs[name] = self.job_class(config, self, name)
        self.jobs[name].rng = None
        return self.jobs[name]

    def close(self):
        for name in list(self.jobs):
            self.jobs.pop(name).close()
        self.current = None
        gc.collect()

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def folder(self, name):
        return os.path.join(self.root, name)

    def run(self, op, args):
        """One operation; returns this rank's result."""
        if op == "reset":
            self.close()
            self.root = args["root"]
            if self.rank == 0:
                shutil.rmtree(self.root, ignore_errors=True)
                os.makedirs(self.root)
            self.barrier()
            self.fresh("model", args["config"])
            return {}
        if op == "replay":
            job = self.fresh("model", args["config"])
            for step in args["steps"]:
                job.data_step(step["op"], step["args"])
            return {}
        if op in self.DATA_OPS:
            model = self.switch("model").data_step(op, args)
            subject = self.switch("subject").data_step(op, args)
            return {"subject": subject, "model": model}
        return self.other(op, args)

    def other(self, op, args):
        raise ValueError(f"unknown operation {op!r}")


def measured(rank: Rank, op: str, args: dict, calls: dict) -> dict:
    """``rank.run(op, args)`` with what it started and ran as ``effects``: DataLoader workers started (new processes
    below this rank, the forkserver aside) and the change of each count in ``calls``; an exception as ``crash``."""
    before, counted = set(launch.descendants(os.getpid())), dict(calls)
    try:
        result = rank.run(op, args)
    except Exception:
        return {"crash": traceback.format_exc()[-2000:]}
    after = set(launch.descendants(os.getpid())) - {multiprocessing.forkserver._forkserver._forkserver_pid}
    return {**result, "effects": {"workers_started": len(after - before),
                                  **{k: calls[k] - counted[k] for k in calls}}}


def serve(rank: Rank, module: str, calls: dict) -> None:
    """Take the controller's steps until it says ``quit`` (``tests/rank_worker.py``'s ``serve``), each ``measured``;
    ``module``: the upstream's ``__init__.py`` as imported, which the controller checks."""
    # a step that raised on a rank with peers ends it (they may wait in a collective it will not join): the side
    # stops there, as it did when the step's timeout ended the server, and the next history gets new ranks at once
    rank_worker.serve(rank.rank, module, lambda op, args: measured(rank, op, args, calls),
                      ends_rank=lambda result: "crash" in result and rank.world > 1)
    rank.close()
