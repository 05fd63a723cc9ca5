"""One rank of the Accelerate history search: a training job that takes its steps one at a time from the controller.

Launched by ``scripts/histories/servers.py`` (2 processes by ``scripts/ranks.py``; one process as ``python
accelerate_job.py``; each with the environment torch.distributed.run would give it) with the code of one side first on
``sys.path``, and served as ``tests/histories/server.py`` says: the subject and the uninterrupted model, each with its
own random states. The data steps are ``train`` (read k batches of a loader), ``set_epoch`` and ``raise_level`` (the
curriculum level registered with ``register_for_checkpointing``); the subject's own are ``state_dict``, ``save``
(``save_state()`` by every process or by the main process alone, into a folder or, with automatic naming, into the
one it names; or ``torch.save`` or ``torch.distributed.checkpoint`` of the loaders' states) and
``restart`` (a new job, then ``load_state()``).
The user code counted per step is the sampler's ``__iter__`` and the dataset's ``set_epoch`` in this process. This
script records; ``scripts/histories/judge.py`` judges.
"""

import contextlib
import random
import sys
from pathlib import Path

import accelerate
import torch
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root
from scripts.histories.history import AUTOMATIC, TOTAL_LIMIT  # noqa: E402
from tests.histories import server  # noqa: E402
from tests.rank_worker import said_while, stop_forkserver, use_forkserver  # noqa: E402

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

    def __init__(self, config, rank, name):
        self.config, self.rank = config, rank.rank
        self.level = Level()
        # ``naming`` ``automatic``: save_state() names its folders and keeps the newest TOTAL_LIMIT
        project = ProjectConfiguration(project_dir=rank.root, automatic_checkpoint_naming=True,
                                       total_limit=TOTAL_LIMIT) if config.get("naming") == "automatic" else None
        self.accelerator = Accelerator(cpu=True, project_config=project)
        self.accelerator.dataloader_config = DataLoaderConfiguration(
            use_stateful_dataloader=True, dispatch_batches=config["loader"] == "dispatcher")
        seeding = config["seeding"]
        set_seed(1234 if seeding == "one-seed" else 1000 + rank)
        self.loaders = [self.accelerator.prepare(self._loader(data)) for data in config["data"]]
        self.accelerator.register_for_checkpointing(self.level)
        self.iterators = [None] * len(self.loaders)

    def _loader(self, data):
        workers = self.config["workers"]  # "2-persistent": persistent_workers=True
        options = {"num_workers": int(workers[0]), "persistent_workers": workers.endswith("persistent")}
        if data == "own-random-batches":
            return DataLoader(list(range(NUM_SAMPLES)), batch_sampler=OwnRandomBatches(), **options)
        dataset = (EpochTagged if data == "epoch-tagged" else Tagged)(data, self.level)
        return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, **options)

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


def loader_states(job):
    """The ``state_dict()`` of each of ``job``'s loaders, as ``torch.distributed.checkpoint`` saves them."""
    return {f"loader{i}": loader.state_dict() for i, loader in enumerate(job.loaders)}


class Rank(server.Rank):
    """The Accelerate operations of this rank."""

    DATA_OPS = ("train", "set_epoch", "raise_level")

    def save(self, job, how, folder):
        """Checkpoint ``job`` into ``folder``: ``every``: every process ``save_state()``s, ``main-only``: the main
        process alone (as diffusers' scripts do), ``automatic``: every process ``save_state()``s with no folder, its
        iteration set to ``folder``'s number (a restarted job sets it, as Accelerate's message says), and
        ``folder`` is where it saved, ``torch-save``: every process ``torch.save()``s its loaders' ``state_dict()``
        into a file of its own, ``dcp``: ``torch.distributed.checkpoint`` saves them. Returns the files of the folder
        that an earlier save wrote."""
        path = Path(self.folder(folder))

        def files():
            return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*") if p.is_file()}

        self.barrier()
        before = files() if path.exists() else {}
        self.barrier()
        if how == "torch-save":
            path.mkdir(parents=True, exist_ok=True)
            torch.save([loader.state_dict() for loader in job.loaders], path / f"loaders_rank{self.rank}.pt")
        elif how == "dcp":
            dcp.save(loader_states(job), checkpoint_id=path)
        elif how == "automatic":
            job.accelerator.project_configuration.iteration = int(folder.rsplit("_", 1)[1])
            saved = job.accelerator.save_state()
            if Path(saved) != path:
                raise AssertionError(f"save_state() saved into {saved}, not {path}")
        elif how == "every" or self.rank == 0:
            job.accelerator.save_state(str(path))
        self.barrier()
        after = files()
        stale = sorted(name for name, mtime in after.items() if before.get(name) == mtime)
        return {"stale": stale}

    def restart(self, config, folder, how):
        """Crash and restart the subject: a new job of the same configuration (seeded again, as a restarted script
        is), then ``load_state(folder)`` (``load_state()`` when ``folder`` is the newest automatic one: Accelerate
        finds it), or each loader's ``load_state_dict()`` of a ``torch-save`` (``torch.load``
        weights-only) or of a ``dcp`` save (loaded in place), with what it logged and raised; ``folder`` None: a
        fresh start."""
        job = self.fresh("subject", config)
        if folder is None:
            return {}
        named = sorted(Path(self.folder(AUTOMATIC)).glob("checkpoint_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
        newest = f"{AUTOMATIC}{named[-1].name}" if named else None

        def load():
            if how == "torch-save":
                states = torch.load(Path(self.folder(folder)) / f"loaders_rank{self.rank}.pt", weights_only=True)
                for loader, state in zip(job.loaders, states, strict=True):
                    loader.load_state_dict(state)
            elif how == "dcp":  # in place: into the states of the new job's loaders, as dcp.load() loads
                states = loader_states(job)
                dcp.load(states, checkpoint_id=self.folder(folder))
                for i, loader in enumerate(job.loaders):
                    loader.load_state_dict(states[f"loader{i}"])
            elif folder == newest:
                job.accelerator.load_state()
            else:
                job.accelerator.load_state(self.folder(folder))

        return said_while(load, WARNERS)

    def other(self, op, args):
        if op == "restart":
            return self.restart(args["config"], args.get("folder"), args.get("saved_how"))
        job = self.switch("subject")
        if op == "state_dict":
            job.loaders[args["loader"]].state_dict()
            return {}
        if op == "save":
            return self.save(job, args["how"], args["folder"])
        raise ValueError(f"unknown operation {op!r}")


def main():
    use_forkserver(["torch", "torchdata.stateful_dataloader", "accelerate"])
    accelerator = Accelerator(cpu=True)
    server.serve(Rank(accelerator.process_index, accelerator.num_processes, Job), accelerate.__file__, CALLS)
    with contextlib.suppress(Exception):
        accelerator.end_training()
    stop_forkserver()


if __name__ == "__main__":
    main()
