"""One rank of the 2-process scenarios of ``test_accelerate_4204.py`` (Accelerate issue #4204).

Run by the test module as
``python -m torch.distributed.run --standalone --nproc_per_node=2 accelerate_worker.py OUT_DIR [SCENARIO ...]``.
Each scenario builds a plain ``DataLoader`` over the sample ids ``0..95``, passes it through
``Accelerator.prepare()`` with ``DataLoaderConfiguration(use_stateful_dataloader=True)`` and writes what this
rank saw to ``OUT_DIR/<scenario>.rank<N>.json``. This script only records; the parent test compares the ranks
and asserts. A scenario that raises records its traceback instead of results and ends the launch
(``tests/rank_worker.py``).
"""

import contextlib
import copy
import functools
import hashlib
import os
import random
import sys
from pathlib import Path

import accelerate
import numpy as np
import psutil
import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.data_loader import get_sampler
from accelerate.utils import set_seed
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root, for tests.rank_worker
from tests.rank_worker import run_scenarios, use_forkserver  # noqa: E402

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
    """Pids of this rank's live descendant processes. The DataLoader workers are the only ones started after
    ``main()`` began (children of the forkserver, see ``use_forkserver``), so the difference of two calls counts them.
    """
    pids = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # a worker that exited meanwhile is not live
            if child.status() != psutil.STATUS_ZOMBIE:
                pids.add(child.pid)
    return pids


def sample_ids(batches):
    return [int(i) for batch in batches for i in batch]


def prepare(
    accelerator, num_workers, persistent_workers=False, generator=None, dataset=None, batch_size=BATCH_SIZE, **config
):
    """A ``DataLoader`` through ``accelerator.prepare()``: over ``dataset``, by default the sample ids, shuffled unless
    the dataset is an ``IterableDataset``; ``generator`` is the user's."""
    accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True, **config)
    dataset = list(range(NUM_SAMPLES)) if dataset is None else dataset
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=not isinstance(dataset, IterableDataset),
        num_workers=num_workers,
        persistent_workers=persistent_workers,
        generator=generator,
    )
    return accelerator.prepare(loader)


def generator_states(loader):
    """sha1 of the state of every random generator the prepared loader can draw from, by name (None: no generator).

    ``global``: the global torch RNG; ``loader``: the ``generator=`` the ``DataLoader`` got; ``sampler``: the
    sampler's (``prepare_data_loader`` attaches one, or the ``SeedableRandomSampler``'s); ``synchronized``: the one
    ``DataLoaderShard.__iter__`` synchronizes across ranks.
    """
    generators = {
        "global": torch.default_generator,
        "loader": loader.base_dataloader.generator,
        "sampler": getattr(get_sampler(loader), "generator", None),
        "synchronized": getattr(loader, "synchronized_generator", None),
    }
    return {
        name: None if g is None else hashlib.sha1(g.get_state().numpy().tobytes()).hexdigest()
        for name, g in generators.items()
    }


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


def resume(accelerator, rank, num_workers, dispatch_batches=False, stop_after=3, use_seedable_sampler=True):
    """Epoch 0 uninterrupted; then ``stop_after`` batches, ``state_dict()``, a new loader, ``load_state_dict()``."""
    config = {"use_seedable_sampler": use_seedable_sampler, "dispatch_batches": dispatch_batches}
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


def early_state_dict(accelerator, rank, num_workers, state_dict_first, user_generator=False, epochs=1, **kwargs):
    """Generators before and after an early ``state_dict()`` (or none), and this rank's sample ids per epoch.

    Ranks seeded differently; ``user_generator``: the ``DataLoader`` gets ``generator=`` seeded per rank too.
    """
    seed_rank("diverged", rank)
    generator = torch.Generator().manual_seed(2000 + rank) if user_generator else None
    loader = prepare(accelerator, num_workers, generator=generator, **kwargs)
    result = {"generators_before": generator_states(loader)}
    if state_dict_first:
        loader.state_dict()
    result["generators_after"] = generator_states(loader)
    result["epochs"] = [sample_ids(loader) for _ in range(epochs)]
    return result


def early_checkpoint(accelerator, rank, num_workers, out_dir, use_save_state, dispatch_batches=False):
    """A run checkpointed before its first batch, then a restarted run of the same set-up loading it: both epochs 0.

    The restart is simulated in this process: the prepared objects are dropped (``free_memory``), this rank's seed is
    set again as at the start, and a new loader is prepared; ``use_save_state``: ``accelerator.save_state`` /
    ``load_state`` into a directory of this rank, else ``loader.state_dict()`` / ``load_state_dict()``.
    """
    runs = []
    for restarted in (False, True):
        accelerator.free_memory()  # the loader is the accelerator's only one, as in a fresh run
        seed_rank("diverged", rank)
        loader = prepare(accelerator, num_workers, dispatch_batches=dispatch_batches)
        if not restarted:
            if use_save_state:
                accelerator.save_state(out_dir)
            else:
                state = loader.state_dict()
        elif use_save_state:
            accelerator.load_state(out_dir)
        else:
            loader.load_state_dict(state)
        runs.append(sample_ids(loader))
    accelerator.free_memory()
    return {"saved": runs[0], "restarted": runs[1]}


def dispatcher_mid_epoch_state_dict(accelerator, rank, num_workers, stop_after=2):
    """``dispatch_batches=True``: ``state_dict()`` after ``stop_after`` batches, on every rank, then the epoch's rest.

    Records whether the call kept the torchdata iterator in use, the workers it started, and the workers running at
    the end of the epoch that are not the ones of the iterator in use then.
    """
    before = live_children()
    loader = prepare(accelerator, num_workers, dispatch_batches=True)
    batches, result = [], {}
    for batch in loader:
        batches.append(batch)
        if len(batches) == stop_after:
            iterator, workers = loader.base_dataloader._iterator, live_children()
            loader.state_dict()
            result["iterator_kept"] = loader.base_dataloader._iterator is iterator
            result["workers_started_by_state_dict"] = len(live_children() - workers)
    result["workers_started_by_epoch_end"] = len(live_children() - before - workers)
    result["epochs"] = [sample_ids(batches)]
    return result


def checkpoint_restart(accelerator, rank, num_workers, out_dir, via, dispatch_batches=False, stop_after=3):
    """A run that checkpoints before its first batch and after ``stop_after`` batches, and two restarts of it.

    Ranks seeded differently (the same seeds in each restart, simulated in this process as in ``early_checkpoint``).
    ``via``: ``dcp``, ``torch.distributed.checkpoint`` into one folder shared by the ranks (``out_dir``), which loads
    in place into the keys of a freshly prepared loader's ``state_dict()``; ``save-state``, ``accelerator.save_state``
    / ``load_state`` into a folder per rank. ``resumed``: the restart that loads the later checkpoint; ``fallback``:
    the restart that loads the later checkpoint, then falls back to the one before the first batch (as a job does
    whose newest checkpoint is unusable), and reads the whole epoch.
    """
    import torch.distributed.checkpoint as dcp

    def fresh():
        accelerator.free_memory()  # the loader is the accelerator's only one, as in a fresh run
        seed_rank("diverged", rank)
        return prepare(accelerator, num_workers, dispatch_batches=dispatch_batches)

    def save(loader, name):
        path = os.path.join(out_dir, name if via == "dcp" else f"{name}.rank{rank}")
        if via == "dcp":
            dcp.save({"dataloader": loader}, checkpoint_id=path)
        else:
            accelerator.save_state(path)
        return path

    def load(loader, path):
        if via == "dcp":
            dcp.load({"dataloader": loader}, checkpoint_id=path)
        else:
            accelerator.load_state(path)

    loader = fresh()
    early = save(loader, "before-first-batch")
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == stop_after:
            later = save(loader, f"after-batch-{stop_after}")
    result = {"head": sample_ids(batches[:stop_after]), "tail": sample_ids(batches[stop_after:])}
    loader = fresh()
    load(loader, later)
    result["resumed"] = sample_ids(loader)
    loader = fresh()
    load(loader, later)
    load(loader, early)
    result["fallback"] = sample_ids(loader)
    accelerator.free_memory()
    return result


class NoisyDataset(Dataset):
    """The sample ids, each paired with a number drawn from torch's RNG where ``__getitem__`` runs: in a worker, that
    is the RNG the DataLoader seeds from its base seed (random augmentation, as in most image pipelines)."""

    def __getitem__(self, index):
        return [index, int(torch.randint(1_000_000, ()))]

    def __len__(self):
        return NUM_SAMPLES


def early_checkpoint_worker_randomness(accelerator, rank, num_workers, out_dir):
    """``accelerator.save_state`` before the first batch over ``NoisyDataset``, then a restart that loads it: both
    runs' epochs 0 as (id, drawn number) pairs. Ranks seeded differently, the same seeds in the restart."""
    runs = []
    for restarted in (False, True):
        accelerator.free_memory()
        seed_rank("diverged", rank)
        accelerator.dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=True)
        loader = accelerator.prepare(DataLoader(NoisyDataset(), batch_size=BATCH_SIZE, shuffle=True,
                                                num_workers=num_workers))
        if restarted:
            accelerator.load_state(out_dir)
        else:
            accelerator.save_state(out_dir)
        runs.append([[int(v) for v in pair] for batch in loader for pair in zip(batch[0], batch[1], strict=True)])
    accelerator.free_memory()
    return {"saved": runs[0], "restarted": runs[1]}


def log_call(log, event, *_):
    """Append ``event`` and the calling process's pid to the file ``log``: one line per call of the user's code, from
    any process."""
    with open(log, "a") as f:
        f.write(f"{event} {os.getpid()}\n")


class UserBatchSampler(BatchSampler):
    """A user's batch sampler, as training scripts write them (diffusers' DreamBooth ``BucketBatchSampler`` shuffles
    with Python's ``random`` and relies on ``set_seed()``): each pass shuffles the sample ids with Python's ``random``,
    rotates them by numpy's global RNG and by ``draw`` (a torch generator held in a closure, out of sight of any walk
    over attributes), and the first pass skips ``skip`` batches (a one-shot resume offset). Each pass is logged.
    """

    def __init__(self, log, draw, skip):
        self.batch_size, self.drop_last = BATCH_SIZE, False
        self.log, self.draw, self.skip = log, draw, skip

    def __iter__(self):
        log_call(self.log, "batch_sampler.__iter__")
        ids = list(range(NUM_SAMPLES))
        random.shuffle(ids)
        shift = (int(np.random.randint(NUM_SAMPLES)) + self.draw(NUM_SAMPLES)) % NUM_SAMPLES
        ids = ids[shift:] + ids[:shift]
        skip, self.skip = self.skip, 0
        yield from [ids[i : i + BATCH_SIZE] for i in range(0, NUM_SAMPLES, BATCH_SIZE)][skip:]

    def __len__(self):
        return NUM_SAMPLES // BATCH_SIZE - self.skip


class UserDataset(Dataset):
    """The sample ids; each ``__getitem__`` logged (in whichever process runs it)."""

    def __init__(self, log):
        self.log = log

    def __getitem__(self, index):
        log_call(self.log, "dataset.__getitem__")
        return index

    def __len__(self):
        return NUM_SAMPLES


class UserCollate:
    """``default_collate``, each call logged."""

    def __init__(self, log):
        self.log = log

    def __call__(self, batch):
        log_call(self.log, "collate_fn")
        return default_collate(batch)


def closure_draw(generator):
    """A function drawing an int below ``n`` from ``generator``, which only its closure holds."""

    def draw(n):
        return int(torch.randint(n, (1,), generator=generator))

    return draw


def random_states(generator):
    """Digests of every random state a user's code may draw from: Python's, numpy's global, torch's global, and
    ``generator`` (the one ``UserBatchSampler`` holds in a closure)."""
    states = {
        "python": repr(random.getstate()),
        "numpy": repr(np.random.get_state()[1].tolist()),
        "torch": torch.get_rng_state().numpy().tobytes().hex(),
        "closure-generator": generator.get_state().numpy().tobytes().hex(),
    }
    return {name: hashlib.sha1(state.encode()).hexdigest() for name, state in states.items()}


def user_code_checkpoint(
    accelerator, rank, num_workers, out_dir, use_save_state, dispatch_batches, persistent_workers
):
    """A checkpoint before the first batch of a loader over the user's code above, and a restart from it.

    Three runs, each set up as a training script is (``set_seed(1234)`` on every rank, a new ``UserBatchSampler``
    skipping 2 batches, ``prepare()``): ``without`` takes no checkpoint; ``with`` takes one before the first batch
    (``accelerator.save_state`` into a directory of this rank, or ``loader.state_dict()``); ``restarted`` loads it
    (``load_state`` or ``load_state_dict``) and asks ``state_dict()`` again before its first batch. Per run: the calls
    of the user's code during ``prepare()`` and during the checkpoint calls (made by this process or by a worker
    started meanwhile: workers that ``prepare()`` started go on prefetching in the background, and so may those that
    the last run's loader started for its state at the end of an epoch, on the processes of a
    ``DataLoaderDispatcher`` other than 0), the random states
    those calls changed, whether the state asked after loading is the loaded one, and the epochs (two with persistent
    workers).
    """
    log = os.path.join(out_dir, "calls.log")
    os.makedirs(out_dir, exist_ok=True)
    runs, state = {}, None

    def calls_since(start, excluded_pids=()):
        with open(log, "a+") as f:
            f.seek(0)
            lines = [line.rsplit(" ", 1) for line in f.read().splitlines()]
        return [event for event, pid in lines[start:] if int(pid) not in excluded_pids], len(lines)

    for run in ("without", "with", "restarted"):
        accelerator.free_memory()  # the loader is the accelerator's only one, as in a fresh run
        set_seed(1234)
        generator = torch.Generator().manual_seed(4321)
        sampler = UserBatchSampler(log, closure_draw(generator), skip=2)
        accelerator.dataloader_config = DataLoaderConfiguration(
            use_stateful_dataloader=True, dispatch_batches=dispatch_batches
        )
        _, start = calls_since(0)
        earlier = live_children()  # the last run's workers: a dispatcher's state at the end of an epoch starts some
        loader = accelerator.prepare(
            DataLoader(
                UserDataset(log),
                batch_sampler=sampler,
                num_workers=num_workers,
                persistent_workers=persistent_workers,
                collate_fn=UserCollate(log),
                worker_init_fn=functools.partial(log_call, log, "worker_init_fn") if num_workers else None,
            )
        )
        calls_in_prepare, start = calls_since(start, earlier)
        before, workers = random_states(generator), live_children()
        result = {"calls_in_prepare": calls_in_prepare}
        if run == "with":
            if use_save_state:
                accelerator.save_state(os.path.join(out_dir, "checkpoint"))
            else:
                state = loader.state_dict()
        elif run == "restarted":
            if use_save_state:
                accelerator.load_state(os.path.join(out_dir, "checkpoint"))
                # this rank's folder: its state is dl_state_dict.bin (from the series' fourth commit on, beside
                # dl_state_dict_rank<N>.bin)
                state = torch.load(os.path.join(out_dir, "checkpoint", "dl_state_dict.bin"), weights_only=False)
                state.pop("_position", None)  # recorded beside the state from the series' fourth commit on
            else:
                loader.load_state_dict(state)
            result["state_after_load_is_loaded"] = repr(loader.state_dict()) == repr(state)
        after = random_states(generator)
        result["calls_in_checkpoint"], _ = calls_since(start, workers)
        result["random_states_changed"] = sorted(name for name in before if before[name] != after[name])
        result["epochs"] = [sample_ids(loader) for _ in range(2 if persistent_workers else 1)]
        runs[run] = result
    accelerator.free_memory()
    return runs


class StreamDataset(IterableDataset):
    """The sample ids ``0..num_samples-1`` as a stream; with DataLoader workers each yields every
    ``num_workers``-th id from its own, as an ``IterableDataset`` splits its work between workers."""

    def __init__(self, num_samples):
        self.num_samples = num_samples

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        yield from range(start, self.num_samples, step)


def resume_from_checkpoint(
    accelerator, rank, num_workers, out_dir, dispatch_batches, split_batches, iterable, shared_folder, stop_after=2
):
    """A training job's checkpoints and restarts: a run saves with ``accelerator.save_state`` before its first batch
    and after ``stop_after`` batches of epoch 0, and reads epochs 0 and 1; a restart loads each checkpoint
    (``load_state``) into a freshly prepared loader and reads the rest of epoch 0 and epoch 1. Ranks seeded
    differently (``seed_rank("diverged")``), the same seeds in each restart (simulated in this process, as in
    ``early_checkpoint``). The loader: 32 sample ids, a map-style dataset shuffled or ``StreamDataset``, batches of 4
    per process (``split_batches``: batches of 8, split). ``shared_folder``: one checkpoint folder for both ranks, as
    on a shared file system, written by the ranks in turn (rank 1's files land last, so that a state written over
    another's shows on every run); else one folder per rank. Returns this rank's batches (lists of ids): ``saved``
    (both epochs of the saving run), and per checkpoint (``step-0``, ``step-<stop_after>``) the restart's two epochs.
    """
    num_samples = 32

    def fresh():
        accelerator.free_memory()  # the loader is the accelerator's only one, as in a fresh run
        seed_rank("diverged", rank)
        dataset = StreamDataset(num_samples) if iterable else list(range(num_samples))
        batch_size = BATCH_SIZE * accelerator.num_processes if split_batches else BATCH_SIZE
        return prepare(accelerator, num_workers, dataset=dataset, batch_size=batch_size,
                       dispatch_batches=dispatch_batches, split_batches=split_batches)

    def save(name):
        if not shared_folder:
            accelerator.save_state(os.path.join(out_dir, f"{name}.rank{rank}"))
            return
        for writer in range(accelerator.num_processes):  # in turn: the last rank's files land last, deterministically
            if writer == rank:
                accelerator.save_state(os.path.join(out_dir, name))
            accelerator.wait_for_everyone()

    def load(name):
        accelerator.load_state(os.path.join(out_dir, name if shared_folder else f"{name}.rank{rank}"))

    def epoch(loader):
        return [[int(i) for i in batch] for batch in loader]

    loader = fresh()
    save("step-0")
    first = []
    for batch in loader:
        first.append([int(i) for i in batch])
        if len(first) == stop_after:
            save(f"step-{stop_after}")
    result = {"saved": [first, epoch(loader)]}
    for name in ("step-0", f"step-{stop_after}"):
        loader = fresh()
        load(name)
        result[name] = [epoch(loader), epoch(loader)]
    accelerator.free_memory()
    return result


def dispatcher_state_across_versions(accelerator, rank, num_workers, split_batches, out_dir):
    """A ``DataLoaderDispatcher``'s state after 2 steps, saved by the release and by the series, each loaded into a
    new dispatcher of the release and of the series (over ``StreamDataset``; the release's ``data_loader.py`` beside
    the installed one, ``release.py``). Returns this rank's batches (lists of ids): ``<saver>-rest``, what the saving
    dispatcher read after its state, and ``<saver>-into-<loader>``, what the loading one reads."""
    from tests.accelerate.release import release_module  # here: the DataLoader workers run this script's imports

    os.makedirs(out_dir, exist_ok=True)
    modules = {"release": release_module("data_loader", out_dir), "series": accelerate.data_loader}

    def dispatcher(module):
        batch_size = BATCH_SIZE * accelerator.num_processes if split_batches else BATCH_SIZE
        loader = DataLoader(StreamDataset(32), batch_size, num_workers=num_workers)
        return module.prepare_data_loader(
            loader, accelerator.device, accelerator.num_processes, rank, split_batches=split_batches,
            put_on_device=True, dispatch_batches=True, use_stateful_dataloader=True,
        )

    result = {}
    for saver, module in modules.items():
        loader, batches = dispatcher(module), []
        for batch in loader:
            batches.append([int(i) for i in batch])
            if len(batches) == 2:
                state = loader.state_dict()
        result[f"{saver}-rest"] = batches[2:]
        for reader, reader_module in modules.items():
            resumed = dispatcher(reader_module)
            resumed.load_state_dict(copy.deepcopy(state))
            result[f"{saver}-into-{reader}"] = [[int(i) for i in batch] for batch in resumed]
    return result


SCENARIOS = {}
for _nw in (0, 1, 2, 6):
    for _seeding in ("diverged", "unequal-use"):
        SCENARIOS[f"partition-{_seeding}-nw{_nw}"] = (partition, (_seeding, _nw), {})
        SCENARIOS[f"state-dict-first-{_seeding}-nw{_nw}"] = (partition, (_seeding, _nw), {"state_dict_first": True})
# use_seedable_sampler=True: the SeedableRandomSampler seeds itself from each process's own initial seed
SCENARIOS["partition-seedable-diverged-nw0"] = (partition, ("diverged", 0), {"use_seedable_sampler": True})
SCENARIOS["persistent-workers-nw2"] = (partition, ("diverged", 2), {"epochs": 2, "persistent_workers": True})
for _nw in (0, 2):
    SCENARIOS[f"dispatch-batches-nw{_nw}"] = (partition, ("diverged", _nw), {"dispatch_batches": True})
    SCENARIOS[f"resume-shard-nw{_nw}"] = (resume, (_nw,), {})
    SCENARIOS[f"resume-shard-sampler-generator-nw{_nw}"] = (resume, (_nw,), {"use_seedable_sampler": False})
    SCENARIOS[f"resume-dispatch-nw{_nw}"] = (resume, (_nw,), {"dispatch_batches": True})
# An early state_dict() must change no random state, with both adapters, num_workers 0, 2 and 6, persistent workers,
# and each source of the order: the generator prepare() attaches to the sampler, a user's DataLoader(generator=), and
# the SeedableRandomSampler (use_seedable_sampler=True).
EARLY_CONFIGS = {}
for _adapter in ("shard", "dispatch"):
    for _workers, _sources in (
        ("nw0", ("sampler-generator", "user-generator", "seedable")),
        ("nw2", ("sampler-generator", "user-generator", "seedable")),
        ("nw6", ("user-generator",)),
        ("nw2-persistent", ("sampler-generator", "user-generator")),
    ):
        for _source in _sources:
            EARLY_CONFIGS[f"{_adapter}-{_workers}-{_source}"] = {
                "num_workers": int(_workers[2]),
                "dispatch_batches": _adapter == "dispatch",
                "persistent_workers": _workers.endswith("persistent"),
                "epochs": 2 if _workers.endswith("persistent") else 1,
                "user_generator": _source == "user-generator",
                "use_seedable_sampler": _source == "seedable",
            }
for _name, _config in EARLY_CONFIGS.items():
    _config = dict(_config)
    _nw = _config.pop("num_workers")
    for _first in (False, True):
        SCENARIOS[f"early-{_name}-{'with' if _first else 'without'}"] = (early_state_dict, (_nw, _first), _config)
# A checkpoint taken before the first batch, replayed by a restarted run
for _adapter, _nw in (("shard", 0), ("shard", 2), ("dispatch", 2)):
    for _via in ("state-dict", "save-state"):
        SCENARIOS[f"checkpoint-{_via}-{_adapter}-nw{_nw}"] = (
            early_checkpoint,
            (_nw,),
            {"use_save_state": _via == "save-state", "dispatch_batches": _adapter == "dispatch"},
        )
SCENARIOS["dispatch-mid-epoch-state-dict-nw2"] = (dispatcher_mid_epoch_state_dict, (2,), {})
# Checkpoints before the first batch and after batch 3, restarts from the later one and a fall-back to the earlier one:
# torch.distributed.checkpoint (in place) and save_state()
for _via in ("dcp", "save-state"):
    for _adapter in ("shard", "dispatch"):
        for _nw in (0, 2):
            SCENARIOS[f"restart-{_via}-{_adapter}-nw{_nw}"] = (
                checkpoint_restart, (_nw,), {"via": _via, "dispatch_batches": _adapter == "dispatch"}
            )
SCENARIOS["early-checkpoint-worker-randomness-nw2"] = (early_checkpoint_worker_randomness, (2,), {})
# A checkpoint before the first batch runs none of the user's code, whatever it draws from: both adapters, num_workers
# 0, 2 and 6, persistent workers, save_state() and state_dict()
USER_CODE_CONFIGS = {}
for _adapter in ("shard", "dispatch"):
    for _workers in ("nw0", "nw2", "nw6", "nw2-persistent"):
        for _via in ("save-state", "state-dict"):
            if (_adapter, _workers) == ("dispatch", "nw6") or (_via == "state-dict" and _workers != "nw2"):
                continue
            USER_CODE_CONFIGS[f"{_adapter}-{_workers}-{_via}"] = {
                "num_workers": int(_workers[2]),
                "use_save_state": _via == "save-state",
                "dispatch_batches": _adapter == "dispatch",
                "persistent_workers": _workers.endswith("persistent"),
            }
for _name, _config in USER_CODE_CONFIGS.items():
    _config = dict(_config)
    SCENARIOS[f"user-code-{_name}"] = (user_code_checkpoint, (_config.pop("num_workers"),), _config)

# Restarts from save_state() checkpoints before the first batch and mid-epoch: both adapters (the dispatcher with
# and without split_batches), map-style and iterable datasets, num_workers 0 and 2, a checkpoint folder per rank or one
# shared by the ranks
RESUME_CONFIGS = {}
for _adapter in ("shard", "dispatch", "dispatch-split"):
    for _dataset in ("map", "iterable"):
        for _nw in (0, 2):
            for _folder in ("per-rank", "shared"):
                RESUME_CONFIGS[f"{_adapter}-{_dataset}-nw{_nw}-{_folder}"] = {
                    "num_workers": _nw,
                    "dispatch_batches": _adapter != "shard",
                    "split_batches": _adapter == "dispatch-split",
                    "iterable": _dataset == "iterable",
                    "shared_folder": _folder == "shared",
                }
for _name, _config in RESUME_CONFIGS.items():
    _config = dict(_config)
    SCENARIOS[f"checkpointed-{_name}"] = (resume_from_checkpoint, (_config.pop("num_workers"),), _config)
# A dispatcher's state, saved by one version and loaded by the other (the series' second commit changes when the state
# is recorded): split_batches with num_workers 0, and without it with 2, where the release's correction is wrong
for _split, _nw in ((True, 0), (False, 2)):
    SCENARIOS[f"dispatcher-state-across-versions-{'split-' if _split else ''}nw{_nw}"] = (
        dispatcher_state_across_versions, (_nw, _split), {}
    )
# the scenarios that write to a folder of their own per rank
FOLDER_PER_RANK = (
    early_checkpoint, user_code_checkpoint, early_checkpoint_worker_randomness, dispatcher_state_across_versions
)


def main():
    out_dir, wanted = sys.argv[1], sys.argv[2:] or list(SCENARIOS)
    # the modules this script imports; the forkserver starts now, so that live_children() counts workers only
    use_forkserver(["torch", "torchdata.stateful_dataloader", "accelerate", "psutil", "tests.rank_worker"])
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index

    def call(name):
        function, args, kwargs = SCENARIOS[name]
        if function in FOLDER_PER_RANK:
            kwargs = dict(kwargs, out_dir=os.path.join(out_dir, f"{name}.rank{rank}.checkpoint"))  # one per rank
        elif function in (checkpoint_restart, resume_from_checkpoint):  # the scenario's folder, shared by the ranks
            kwargs = dict(kwargs, out_dir=os.path.join(out_dir, f"{name}.checkpoints"))
        return function(accelerator, rank, *args, **kwargs)

    run_scenarios(out_dir, wanted, rank, call, world_size=accelerator.num_processes, accelerate=accelerate.__file__)
    accelerator.end_training()


if __name__ == "__main__":
    main()
