"""One rank of the 2-process scenarios of ``test_accelerate_4204.py`` (Accelerate issue #4204).

Run by the test module as
``python -m torch.distributed.run --standalone --nproc_per_node=2 accelerate_worker.py OUT_DIR [SCENARIO ...]``.
Each scenario builds a plain ``DataLoader`` over the sample ids ``0..95``, passes it through
``Accelerator.prepare()`` with ``DataLoaderConfiguration(use_stateful_dataloader=True)`` and writes what this
rank saw to ``OUT_DIR/<scenario>.rank<N>.json``. This script only records; the parent test compares the ranks
and asserts. A scenario that raises records its traceback instead of results.
"""

import contextlib
import gc
import json
import os
import sys
import traceback

import accelerate
import psutil
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from torch.utils.data import DataLoader

NUM_SAMPLES = 96
BATCH_SIZE = 4


def seed_rank(seeding, rank):
    """Put this rank's global torch RNG in a known state before ``prepare()``.

    ``diverged``: a different seed per rank (no common seed, or a deliberate per-rank seed);
    ``unequal-use``: one common seed, then rank 1 draws more random numbers during its set-up;
    ``common``: one common seed and the same use on every rank.
    """
    if seeding == "diverged":
        torch.manual_seed(1000 + rank)
    elif seeding == "unequal-use":
        torch.manual_seed(1234)
        if rank == 1:
            torch.rand(7)
    elif seeding == "common":
        torch.manual_seed(1234)
    else:
        raise ValueError(seeding)


def live_children():
    """Pids of this rank's live child processes: the DataLoader workers are its only children."""
    pids = set()
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker that exited meanwhile is not live
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
    return pids


def sample_ids(batches):
    return [int(i) for batch in batches for i in batch]


def prepare(accelerator, num_workers, persistent_workers=False, **config):
    accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True, **config)
    loader = DataLoader(
        list(range(NUM_SAMPLES)),
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=num_workers,
        persistent_workers=persistent_workers,
    )
    return accelerator.prepare(loader)


def partition(accelerator, rank, seeding, num_workers, state_dict_first=False, epochs=1, **kwargs):
    """This rank's sample ids per epoch, and the workers that ``prepare()`` (and ``state_dict()``) left running."""
    seed_rank(seeding, rank)
    before = live_children()
    loader = prepare(accelerator, num_workers, **kwargs)
    result = {"workers_after_prepare": len(live_children() - before)}
    if state_dict_first:
        state = loader.state_dict()
        result["state_dict_type"] = type(state).__name__
        result["workers_after_state_dict"] = len(live_children() - before)
    result["epochs"] = [sample_ids(loader) for _ in range(epochs)]
    return result


def resume(accelerator, rank, num_workers, dispatch_batches=False, stop_after=3):
    """Epoch 0 uninterrupted; then ``stop_after`` batches, ``state_dict()``, a new loader, ``load_state_dict()``."""
    config = {"use_seedable_sampler": True, "dispatch_batches": dispatch_batches}
    seed_rank("common", rank)
    uninterrupted = sample_ids(prepare(accelerator, num_workers, **config))

    seed_rank("common", rank)
    loader = prepare(accelerator, num_workers, **config)
    before = []
    for batch in loader:
        before.append(batch)
        if len(before) == stop_after:
            state = loader.state_dict()
            break
    loader.end()  # the loop was left early: release the loader from GradientState as a training loop would
    seed_rank("common", rank)
    resumed = prepare(accelerator, num_workers, **config)
    resumed.load_state_dict(state)
    return {"uninterrupted": uninterrupted, "before": sample_ids(before), "after": sample_ids(resumed)}


SCENARIOS = {}
for _nw in (0, 1, 2, 6):
    for _seeding in ("diverged", "unequal-use"):
        SCENARIOS[f"partition-{_seeding}-nw{_nw}"] = (partition, (_seeding, _nw), {})
        SCENARIOS[f"state-dict-first-{_seeding}-nw{_nw}"] = (partition, (_seeding, _nw), {"state_dict_first": True})
SCENARIOS["persistent-workers-nw2"] = (partition, ("diverged", 2), {"epochs": 2, "persistent_workers": True})
for _nw in (0, 2):
    SCENARIOS[f"dispatch-batches-nw{_nw}"] = (partition, ("diverged", _nw), {"dispatch_batches": True})
    SCENARIOS[f"resume-shard-nw{_nw}"] = (resume, (_nw,), {})
# Not resume-dispatch-nw2: with workers, a DataLoaderDispatcher resumed mid-epoch skips one batch too many, on the
# base as with the fix (DataLoaderAdapter.adjust_state_dict_for_prefetch only knows the single-process state layout).
SCENARIOS["resume-dispatch-nw0"] = (resume, (0,), {"dispatch_batches": True})


def main():
    out_dir, wanted = sys.argv[1], sys.argv[2:] or list(SCENARIOS)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    for name in wanted:
        function, args, kwargs = SCENARIOS[name]
        try:
            result = function(accelerator, rank, *args, **kwargs)
        except Exception:
            result = {"error": traceback.format_exc()}
        gc.collect()  # loaders of this scenario stop their workers now, not during the next one
        result.update(scenario=name, rank=rank, world_size=accelerator.num_processes, accelerate=accelerate.__file__)
        path = os.path.join(out_dir, f"{name}.rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
    accelerator.end_training()


if __name__ == "__main__":
    main()
