"""One rank of the Accelerate flows: training jobs that save and restart, run as the flow table's factors say.

Run by ``scripts/flows`` as a job server (``scripts/servers.py``: ``python scripts/ranks.py N accelerate_job.py``, the
environment torch.distributed.run would give each rank; one process: ``python accelerate_job.py`` with that
environment) with the code of one side on ``sys.path`` (the release's tree first, or the series as installed). It
takes plans, ``{"out", "task_timeout", "tasks": [...]}`` (``tests/flows/tasks.py``); each task writes
``<out>/<flow>.<column>.<part>.rank<N>.json``. Parts:

- ``save``: the uninterrupted job (``truth``: every epoch to the one after the checkpoint's, as batches of sample
  ids), then the same job again from the start up to the checkpoint, saved into ``folder`` as ``saver`` says, and on
  to the end of that epoch (``before`` the checkpoint, ``after`` it: a checkpoint must not change the run).
- ``load``: a restarted job (seeded again, as a restarted script is), loaded from ``folder``, reading what the job
  reads next (``loops``: the rest of the checkpoint's epoch, unless it was saved at its end, then the next epoch).
  A raise before the first batch is recorded as ``error``; after it, as ``crash``.
- ``order``: the job uninterrupted for 3 epochs (``stateful``) and the same job through a non-stateful prepared loader
  and, on one process, a plain ``DataLoader`` (``references``).

The restart is a new set of objects in this process (``free_memory``, new loader, the seed set again), as in
``tests/accelerate``; a task that hangs or crashes is recorded as ``tests/flows/tasks.py`` says, and the
runner launches the tasks left. This script records; ``scripts/flows/judge.py`` judges.
"""

import os
import random
import sys
from pathlib import Path

import accelerate
import numpy as np
import torch
import torch.distributed as dist
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    WeightedRandomSampler,
    get_worker_info,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root, for tests.rank_worker
from tests.flows.tasks import serve_plans  # noqa: E402
from tests.rank_worker import said_while, stop_forkserver, use_forkserver  # noqa: E402

NUM_SAMPLES = 32
BATCH_SIZE = 4
WARNERS = ("accelerate", "torchdata")  # whose warnings at load say what the restart could not restore


class ShardedStream(IterableDataset):
    """The sample ids, split between the loader's workers, each worker's share shuffled with its own torch RNG (which
    the DataLoader seeds from its base seed), as PyTorch's ``IterableDataset`` documentation splits a range."""

    def _ids(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        ids = list(range(start, NUM_SAMPLES, step))
        return [ids[i] for i in torch.randperm(len(ids)).tolist()]


class Generated(ShardedStream):
    """``__iter__`` is a generator function."""

    def __iter__(self):
        yield from self._ids()


class Returned(ShardedStream):
    """``__iter__`` returns an iterator."""

    def __iter__(self):
        return iter(self._ids())


class Offset(Dataset):
    """Sample ``i`` is ``offset + i``; ``state_dict()`` holds the offset, as torchdata's README writes a dataset with a
    state of its own (a job that moved on to another part of its data)."""

    def __init__(self, offset):
        self.offset = offset

    def __len__(self):
        return NUM_SAMPLES

    def __getitem__(self, index):
        return self.offset + index

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state_dict):
        self.offset = state_dict["offset"]


class PythonRandomBatches(BatchSampler):
    """Batches of consecutive ids, the batch order shuffled with Python's ``random`` at every ``__iter__`` (as the
    bucket samplers of diffusers' DreamBooth scripts do)."""

    def __init__(self):
        self.batch_size, self.drop_last = BATCH_SIZE, False

    @staticmethod
    def batches():
        return [list(range(i, i + BATCH_SIZE)) for i in range(0, NUM_SAMPLES, BATCH_SIZE)]

    def __iter__(self):
        batches = self.batches()
        random.shuffle(batches)
        yield from batches

    def __len__(self):
        return NUM_SAMPLES // BATCH_SIZE


class GeneratorBatches(PythonRandomBatches):
    """Batches of consecutive ids, the batch order shuffled at every ``__iter__`` with a ``torch.Generator`` that the
    batch sampler holds, seeded once when it is built (as samplers that keep their own generator do)."""

    def __init__(self):
        super().__init__()
        self.generator = torch.Generator().manual_seed(7)

    def __iter__(self):
        batches = self.batches()
        yield from (batches[i] for i in torch.randperm(len(batches), generator=self.generator).tolist())


def seed(seeding, rank):
    """The random state a (re)started process has before it builds the job: ``one-seed``: ``set_seed(1234)`` on every
    process; ``per-process``: ``set_seed(1000 + rank)``; ``none``: as a fresh process, whose torch, numpy and Python
    generators torch and the OS seed at random, another seed per process (here fixed per process, 9000 + rank, so
    that runs repeat; unlike ``set_seed`` nothing else is seeded);
    ``own-generator``: ``set_seed(1234)``, and the loader gets a generator of its own (``loader_of``)."""
    if seeding in ("one-seed", "own-generator"):
        set_seed(1234)
    elif seeding == "per-process":
        set_seed(1000 + rank)
    elif seeding == "none":
        torch.manual_seed(9000 + rank)
        random.seed(9000 + rank)
        np.random.seed(9000 + rank)
    else:
        raise ValueError(seeding)


def loader_of(factors, restarted=False):
    """The user's plain ``DataLoader`` of a flow (``restarted``: as the restarted job builds it)."""
    data, workers = factors["data"], factors["workers"]
    options = {"num_workers": int(workers[0]), "persistent_workers": workers.endswith("persistent")}
    if factors["seeding"] == "own-generator":
        options["generator"] = torch.Generator().manual_seed(3)
    ids = list(range(NUM_SAMPLES))
    if data in ("shuffled", "sequential"):
        return DataLoader(ids, batch_size=BATCH_SIZE, shuffle=data == "shuffled", **options)
    if data == "weighted":
        weights = [1.0 + (i % 4) for i in ids]
        sampler = WeightedRandomSampler(weights, NUM_SAMPLES, replacement=False)
        return DataLoader(ids, batch_size=BATCH_SIZE, sampler=sampler, **options)
    if data == "stateful-dataset":
        return DataLoader(Offset(0 if restarted else 100), batch_size=BATCH_SIZE, shuffle=True, **options)
    if data == "python-random-batches":
        return DataLoader(ids, batch_sampler=PythonRandomBatches(), **options)
    if data == "generator-batches":
        return DataLoader(ids, batch_sampler=GeneratorBatches(), **options)
    dataset = Generated() if data == "iterable-generator" else Returned()
    return DataLoader(dataset, batch_size=BATCH_SIZE, **options)


def prepared(accelerator, factors, stateful=True, restarted=False):
    """The flow's loader through ``accelerator.prepare()`` (the accelerator's only one; ``restarted``: in the
    restarted job)."""
    loader = factors["loader"]
    accelerator.free_memory()
    accelerator.dataloader_config = DataLoaderConfiguration(
        use_stateful_dataloader=stateful and loader != "skip-first-batches",
        dispatch_batches=loader == "dispatcher",
        split_batches=loader == "split-batches",
        use_seedable_sampler=loader == "seedable",
    )
    return accelerator.prepare(loader_of(factors, restarted))


def ids(batches):
    return [[int(i) for i in batch] for batch in batches]


def epoch(loader, factors):
    """The batches of one pass of ``for batch in loader``; a training step per batch (``dropout``: it draws from
    torch's global RNG, as a dropout layer does)."""
    out = []
    for batch in loader:
        out.append(batch)
        step(factors)
    return ids(out)


def step(factors):
    if factors.get("training") == "dropout":
        torch.rand(1)


def checkpoint_step(factors):
    """Batches of the checkpoint's epoch each saving process read before it: 0, half of them, or all."""
    processes = 1 if factors["loader"] == "split-batches" else int(factors["processes"].split("-")[0])
    per_epoch = NUM_SAMPLES // BATCH_SIZE // processes
    return {"first-batch": 0, "mid-epoch": per_epoch // 2, "epoch-end": per_epoch}[factors["when"]]


def batches_read(factors):
    """Batches of the checkpoint's epoch each restarted process skips: the batches all saving processes read before
    the checkpoint, shared among the loading processes (a user's script counts the steps it saved at; with
    ``split_batches`` a step is one batch on any number of processes)."""
    saves, _, loads = factors["processes"].partition("-")
    if factors["loader"] == "split-batches":
        return checkpoint_step(factors)
    return checkpoint_step(factors) * int(saves) // int(loads or saves)


def save(accelerator, factors, loader, folder, rank):
    """Checkpoint the job into ``folder`` the way the flow's ``saver`` does."""
    saver = factors["saver"]
    if saver == "own-folder":
        accelerator.save_state(os.path.join(folder, f"process{rank}"))
    elif saver == "main-only":
        if accelerator.is_main_process:
            accelerator.save_state(folder)
    elif saver.startswith("shared-"):
        last = int(saver[len("shared-")])
        for writer in sorted(range(accelerator.num_processes), key=lambda r: r == last):
            if writer == rank:
                accelerator.save_state(folder)
            dist.barrier()
    elif saver == "torch-save":
        os.makedirs(folder, exist_ok=True)
        torch.save(loader.state_dict(), os.path.join(folder, f"loader{rank}.pt"))
    elif saver == "dcp":
        import torch.distributed.checkpoint as dcp

        dcp.save({"loader": loader.state_dict()}, checkpoint_id=folder)
    else:
        raise ValueError(saver)
    if accelerator.num_processes > 1:
        dist.barrier()


def load(accelerator, factors, loader, folder, rank):
    """Load the checkpoint in ``folder`` into the restarted job the way the flow's ``saver`` saved it."""
    saver = factors["saver"]
    if factors["probe"] == "state-dict-first":
        loader.state_dict()
    if saver == "own-folder":
        accelerator.load_state(os.path.join(folder, f"process{rank}"))
    elif saver == "torch-save":
        loader.load_state_dict(torch.load(os.path.join(folder, f"loader{rank}.pt"), weights_only=True))
    elif saver == "dcp":
        import torch.distributed.checkpoint as dcp

        state = {"loader": loader.state_dict()}
        dcp.load(state, checkpoint_id=folder)
        loader.load_state_dict(state["loader"])
    else:
        accelerator.load_state(folder)


def save_part(accelerator, factors, folder, rank):
    """The uninterrupted job, then the job checkpointed (see the module's docstring)."""
    last_epoch = int(factors["epoch"])
    seed(factors["seeding"], rank)
    loader = prepared(accelerator, factors)
    truth = [epoch(loader, factors) for _ in range(last_epoch + 2)]
    seed(factors["seeding"], rank)
    loader = prepared(accelerator, factors)
    for _ in range(last_epoch):
        epoch(loader, factors)
    at = checkpoint_step(factors)
    if factors["when"] == "epoch-end":
        before, after = epoch(loader, factors), []
        save(accelerator, factors, loader, folder, rank)
    else:
        iterator = iter(loader) if at else None
        before = []
        while len(before) < at:
            before.append(next(iterator))
            step(factors)
        before = ids(before)
        save(accelerator, factors, loader, folder, rank)
        after = epoch(iterator, factors) if iterator is not None else epoch(loader, factors)
    accelerator.free_memory()
    return {"truth": truth, "epoch": last_epoch, "step": at, "at_end": factors["when"] == "epoch-end",
            "before": before, "after": after}


def load_part(accelerator, factors, folder, rank):
    """The restarted job (see the module's docstring)."""
    last_epoch = int(factors["epoch"])
    seed(factors["seeding"], rank)
    loader = prepared(accelerator, factors, restarted=True)
    said = said_while(lambda: load(accelerator, factors, loader, folder, rank), WARNERS)
    failed = said.get("error")  # a refusal: recorded, and no process reads a batch
    failures = [None] * accelerator.num_processes
    if accelerator.num_processes > 1:
        dist.all_gather_object(failures, failed)
    else:
        failures = [failed]
    if any(failures):
        accelerator.free_memory()
        return {"error": failed or next(f for f in failures if f), "raised_here": failed is not None}
    loops = []
    if factors["when"] != "epoch-end":
        if factors["loader"] == "skip-first-batches":
            loops.append(epoch(accelerator.skip_first_batches(loader, batches_read(factors)), factors))
        else:
            loops.append(epoch(loader, factors))
    loops.append(epoch(loader, factors))
    accelerator.free_memory()
    return {"loops": loops, "epoch": last_epoch, "warnings": said["warnings"]}


def order_part(accelerator, factors, rank):
    """The job for 3 epochs through the stateful loader, and its references (see the module's docstring)."""
    runs = {}
    for name, stateful in (("stateful", True), ("non-stateful", False)):
        seed(factors["seeding"], rank)
        loader = prepared(accelerator, factors, stateful=stateful)
        runs[name] = [epoch(loader, factors) for _ in range(3)]
    accelerator.free_memory()
    references = {"non-stateful": runs["non-stateful"]}
    if accelerator.num_processes == 1 and factors["loader"] != "seedable":
        seed(factors["seeding"], rank)
        plain = loader_of(factors)
        references["plain DataLoader"] = [epoch(plain, factors) for _ in range(3)]
    return {"stateful": runs["stateful"], "references": references}


def run_task(accelerator, task, rank):
    """One task's record (see the module's docstring)."""
    part, factors = task["part"], task["factors"]
    if part == "save":
        result = save_part(accelerator, factors, task["folder"], rank)
    elif part == "load":
        result = load_part(accelerator, factors, task["folder"], rank)
    else:
        result = order_part(accelerator, factors, rank)
    return {**result, "world_size": accelerator.num_processes, "module": accelerate.__file__}


def main():
    use_forkserver(["torch", "torchdata.stateful_dataloader", "accelerate"])  # the DataLoader workers start from it
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    serve_plans(rank, accelerator.num_processes, accelerate.__file__,
                lambda task: run_task(accelerator, task, rank), accelerator.free_memory)
    accelerator.end_training()
    stop_forkserver()  # it reaps the DataLoader workers it forked: their CPU time counts in this rank's


if __name__ == "__main__":
    main()
