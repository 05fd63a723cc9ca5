"""One rank of the Accelerate history search: a training job that takes its steps one at a time from the controller.

Launched by ``scripts/histories/servers.py`` (2 processes under ``torch.distributed.run``; one process as ``python
accelerate_job.py`` with the environment torch.distributed.run would give it) with the code of one side first on
``sys.path``, and kept alive across histories. It reads operations from the controller's ``TCPStore``
(``HISTORY_STORE`` = host:port, keys ``<HISTORY_PREFIX>/op/<n>``) and writes one result per rank and operation
(``<HISTORY_PREFIX>/res/<n>/<rank>``), JSON both ways.

A rank holds two jobs of the same configuration: the ``subject``, which takes every step of the history (saves,
``state_dict()`` calls, crashes and restarts), and the ``model``, the uninterrupted job: it takes only the steps that
read or change data (train, ``set_epoch``, raising the curriculum level), and after a restart it is built afresh and
replays the steps before the checkpoint the subject loaded. Each job owns its global random states (torch, numpy,
Python): they are swapped in and out when the rank switches jobs, so neither job's draws reach the other's.

What a step changed beyond its data is measured on the subject: DataLoader worker processes it started, and the
user code it ran (sampler ``__iter__``, dataset ``set_epoch``), counted in this process. This script records;
``scripts/histories/judge.py`` judges.
"""

import contextlib
import gc
import json
import logging
import multiprocessing.forkserver
import os
import random
import shutil
import sys
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import accelerate
import numpy as np
import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root
from scripts import launch  # noqa: E402
from tests.rank_worker import stop_forkserver, use_forkserver  # noqa: E402

NUM_SAMPLES = 32
BATCH_SIZE = 4
CALLS = {"sampler_iter": 0, "set_epoch": 0}  # user code run in this process (the subject's counts are taken per step)
# whose warnings count as the restart saying what it could not do (not torch's deprecations)
WARNERS = ("accelerate", "torchdata")


class Level:
    """A curriculum level registered with ``register_for_checkpointing``, which the level-tagged data reads."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state_dict):
        self.value = state_dict["value"]


class Tagged(Dataset):
    """Sample ``i`` read as ``i + 1000 * epoch`` (``epoch-tagged``: the epoch ``set_epoch`` gave it, as augmentations
    by epoch are) or ``i + 100 * level`` (``level-tagged``: the registered curriculum level), or ``i``."""

    def __init__(self, tag, level):
        self.tag, self.level, self.epoch = tag, level, 0

    def __len__(self):
        return NUM_SAMPLES

    def __getitem__(self, index):
        if self.tag == "epoch-tagged":
            return index + 1000 * self.epoch
        if self.tag == "level-tagged":
            return index + 100 * self.level.value
        return index


class EpochTagged(Tagged):
    """``Tagged`` with ``set_epoch`` (Accelerate forwards ``DataLoaderShard.set_epoch`` to it)."""

    def set_epoch(self, epoch):
        CALLS["set_epoch"] += 1
        self.epoch = epoch


class OwnRandomBatches:
    """A batch sampler of consecutive ids whose batch order is shuffled at every ``__iter__`` with a ``random.Random``
    it holds (as aspect-ratio bucket samplers do)."""

    def __init__(self):
        self.batch_size, self.drop_last, self.rng = BATCH_SIZE, False, random.Random(7)

    def __iter__(self):
        CALLS["sampler_iter"] += 1
        batches = [list(range(i, i + BATCH_SIZE)) for i in range(0, NUM_SAMPLES, BATCH_SIZE)]
        self.rng.shuffle(batches)
        yield from batches

    def __len__(self):
        return NUM_SAMPLES // BATCH_SIZE


class Job:
    """One training job of a configuration: its accelerator, prepared loaders, open iterators, curriculum level and
    (while another job runs) its global random states."""

    def __init__(self, config, rank):
        self.config, self.rank = config, rank
        self.level = Level()
        self.accelerator = Accelerator(cpu=True)
        self.accelerator.dataloader_config = DataLoaderConfiguration(
            use_stateful_dataloader=True, dispatch_batches=config["loader"] == "dispatcher")
        seeding = config["seeding"]
        set_seed(1234 if seeding == "one-seed" else 1000 + rank)
        self.loaders = [self.accelerator.prepare(self._loader(data)) for data in config["data"]]
        self.accelerator.register_for_checkpointing(self.level)
        self.iterators = [None] * len(self.loaders)
        self.rng = None

    def _loader(self, data):
        workers = int(self.config["workers"])
        if data == "own-random-batches":
            return DataLoader(list(range(NUM_SAMPLES)), batch_sampler=OwnRandomBatches(), num_workers=workers)
        dataset = (EpochTagged if data == "epoch-tagged" else Tagged)(data, self.level)
        return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=workers)

    def close(self):
        self.iterators = [None] * len(self.loaders)
        self.accelerator.free_memory()
        self.loaders = []

    def train(self, loader, k):
        """Read at most ``k`` batches of ``loader`` (a training step each, drawing from torch's RNG as dropout does);
        the epoch ends, and the next read starts a new one, when its iterator is exhausted."""
        if self.iterators[loader] is None:
            self.iterators[loader] = iter(self.loaders[loader])
        read = []
        for _ in range(k):
            try:
                batch = next(self.iterators[loader])
            except StopIteration:
                self.iterators[loader] = None
                return {"batches": read, "ended": True}
            read.append([int(i) for i in batch])
            torch.rand(1)
        return {"batches": read, "ended": False}

    def data_step(self, op, args):
        """A step of the uninterrupted job: ``train``, ``set_epoch`` or ``raise_level``."""
        if op == "train":
            return self.train(args["loader"], args["k"])
        if op == "set_epoch":
            self.loaders[args["loader"]].set_epoch(args["epoch"])
        elif op == "raise_level":
            self.level.value += 1
        return {}


def _rng_states():
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def _set_rng_states(states):
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


class Rank:
    """The jobs of this rank and the operations the controller sends."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.jobs, self.current = {}, None
        self.root = None

    def switch(self, name):
        """Make job ``name``'s random states the global ones (the other job's are kept in it)."""
        if self.current == name:
            return self.jobs[name]
        if self.current in self.jobs:
            self.jobs[self.current].rng = _rng_states()
        job = self.jobs[name]
        if job.rng is not None:
            _set_rng_states(job.rng)
        self.current = name
        return job

    def fresh(self, name, config):
        """A new job ``name`` (the old one closed first; its workers stop)."""
        if name in self.jobs:
            self.jobs.pop(name).close()
            gc.collect()
        if self.current == name:
            self.current = None
        if self.current in self.jobs:
            self.jobs[self.current].rng = _rng_states()
        self.current = name
        self.jobs[name] = Job(config, self.rank)
        return self.jobs[name]

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def folder(self, name):
        return os.path.join(self.root, name)

    def save(self, job, how, folder):
        """Checkpoint ``job`` into ``folder``: ``every``: every process ``save_state()``s, ``main-only``: the main
        process alone (as diffusers' scripts do). Returns the files of the folder that an earlier save wrote."""
        path = Path(self.folder(folder))

        def files():
            return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file()}

        self.barrier()
        before = files() if path.exists() else {}
        self.barrier()
        if how == "every" or self.rank == 0:
            job.accelerator.save_state(str(path))
        self.barrier()
        after = files()
        stale = sorted(name for name, mtime in after.items() if before.get(name) == mtime)
        return {"stale": stale}

    def restart(self, config, folder):
        """Crash and restart the subject: a new job of the same configuration (seeded again, as a restarted script
        is), then ``load_state(folder)`` (None: a fresh start). A raise in the load is recorded as ``error``, with the
        warnings the restart logged."""
        job = self.fresh("subject", config)
        if folder is None:
            return {}
        said = []

        class Said(logging.Handler):
            def emit(self, record):
                if record.levelno >= logging.WARNING and record.name.startswith(WARNERS):
                    said.append(record.getMessage()[:300])

        handler = Said()
        logging.getLogger().addHandler(handler)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    job.accelerator.load_state(self.folder(folder))
                    error = None
                except Exception as e:
                    error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        finally:
            logging.getLogger().removeHandler(handler)
        said += [str(w.message)[:300] for w in caught if any(f"/{n}/" in w.filename for n in WARNERS)]
        return {"warnings": said, **({"error": error} if error else {})}

    def run(self, op, args):
        """One operation (see the module's docstring); returns this rank's result."""
        if op == "reset":
            for name in list(self.jobs):
                self.jobs.pop(name).close()
            self.current = None
            gc.collect()
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
        if op in ("train", "set_epoch", "raise_level"):
            model = self.switch("model").data_step(op, args)
            subject = self.switch("subject").data_step(op, args)
            return {"subject": subject, "model": model}
        if op == "restart":
            return self.restart(args["config"], args.get("folder"))
        job = self.switch("subject")
        if op == "state_dict":
            job.loaders[args["loader"]].state_dict()
            return {}
        if op == "save":
            return self.save(job, args["how"], args["folder"])
        raise ValueError(f"unknown operation {op!r}")


def measured(rank, op, args):
    """``rank.run(op, args)`` with what it started and ran: DataLoader workers started (new processes below this
    rank, the forkserver aside) and user code called, as ``effects``; an exception as ``crash``."""
    before = set(launch.descendants(os.getpid()))
    calls = dict(CALLS)
    try:
        result = rank.run(op, args)
    except Exception:
        return {"crash": traceback.format_exc()[-2000:]}
    after = set(launch.descendants(os.getpid())) - {multiprocessing.forkserver._forkserver._forkserver_pid}
    effects = {"workers_started": len(after - before), **{k: CALLS[k] - calls[k] for k in CALLS}}
    return {**result, "effects": effects}


def main():
    use_forkserver(["torch", "torchdata.stateful_dataloader", "accelerate"])
    host, port = os.environ["HISTORY_STORE"].rsplit(":", 1)
    prefix = os.environ["HISTORY_PREFIX"]
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(hours=4))
    accelerator = Accelerator(cpu=True)
    rank = Rank(accelerator.process_index, accelerator.num_processes)
    store.set(f"{prefix}/started/{rank.rank}", accelerate.__file__)
    n = 0
    while True:
        message = json.loads(store.get(f"{prefix}/op/{n}"))
        if message["op"] == "quit":
            break
        result = measured(rank, message["op"], message.get("args", {}))
        store.set(f"{prefix}/res/{n}/{rank.rank}", json.dumps(result))
        n += 1
    for name in list(rank.jobs):
        rank.jobs.pop(name).close()
    with contextlib.suppress(Exception):
        accelerator.end_training()
    stop_forkserver()


if __name__ == "__main__":
    main()
