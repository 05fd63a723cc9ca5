"""Sampler-level runs shared by the DeepSpeed test modules: a curriculum ``DeepSpeedDataSampler`` or a
``DeepSpeedDataLoader`` over the toy dataset of ``scenarios.py``, in this process, with the collectives stubbed
(``stub_collectives`` in conftest.py), and the pristine release's sampler beside the installed one.

Global rank 0 draws each global batch and broadcasts it; every data-parallel rank keeps its slice. With the
broadcast stubbed, a sampler built for data-parallel rank r with ``global_rank=0`` yields what rank r receives.
"""

import collections
import importlib.util
import io
import os
import pickle
import subprocess
from pathlib import Path

import deepspeed
import torch
from deepspeed.runtime.constants import DATA_PARALLEL_GROUP, GLOBAL_RANK, GRADIENT_ACCUMULATION_STEPS
from deepspeed.runtime.data_pipeline.constants import CURRICULUM_LEARNING, DATA_EFFICIENCY, DATA_SAMPLING_NUM_WORKERS
from deepspeed.runtime.data_pipeline.data_sampling import data_sampler as data_sampler_module
from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
from deepspeed.runtime.dataloader import DeepSpeedDataLoader

from tests.deepspeed.scenarios import ONE_EPOCH, SEED, with_index_to_sample

UPSTREAM = Path(__file__).resolve().parents[2] / "upstream" / "deepspeed"  # the kit's checkout (make upstream)
SAMPLER_PATH = "deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py"


class FakeGroup:
    """Stands in for the data-parallel process group: the sampler only asks it for its size."""

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def efficiency_config(tmp_path, run, metric, seed=SEED, num_epochs=100):
    """``data_efficiency`` with curriculum sampling on ``metric``; ``run`` names its own ``data_cluster_path``."""
    return {
        "seed": seed,
        "data_sampling": {
            "num_epochs": num_epochs,
            "curriculum_learning": {
                "enabled": True,
                "data_cluster_path": str(tmp_path / run),
                "curriculum_metrics": {"difficulty": with_index_to_sample(metric, str(tmp_path))},
            },
        },
    }


def make_sampler(
    tmp_path,
    run,
    metric,
    seed=SEED,
    dp_rank=0,
    dp_size=1,
    micro_batch_size=4,
    global_rank=0,
    gradient_accumulation_steps=2,
    num_epochs=100,
    sampler_class=DeepSpeedDataSampler,
):
    """A sampler of ``ONE_EPOCH`` samples as global rank 0 (or ``global_rank``) builds it."""
    return sampler_class(
        efficiency_config(tmp_path, run, metric, seed, num_epochs),
        one_epoch_total_samples=ONE_EPOCH,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
        data_parallel_group=FakeGroup(dp_size),
        gradient_accumulation_steps=gradient_accumulation_steps,
        global_rank=global_rank,
    )


def take(sampler, count):
    iterator = iter(sampler)
    return [next(iterator) for _ in range(count)]


def make_loader(tmp_path, run, metric, num_workers, dp_rank=0, dp_size=1, num_epochs=100):
    """A ``DeepSpeedDataLoader`` with curriculum sampling as ``engine.deepspeed_io()`` builds it: micro-batches of
    2 per data-parallel rank, gradient accumulation 2, ``data_sampling.num_workers = num_workers``. Sample ``i`` is
    the tensor ``[i]``."""
    config = {
        CURRICULUM_LEARNING: True,
        DATA_EFFICIENCY: efficiency_config(tmp_path, run, metric, num_epochs=num_epochs),
        DATA_PARALLEL_GROUP: FakeGroup(dp_size),
        GRADIENT_ACCUMULATION_STEPS: 2,
        GLOBAL_RANK: 0,
        DATA_SAMPLING_NUM_WORKERS: num_workers,
    }
    dataset = [torch.tensor([float(i)]) for i in range(ONE_EPOCH)]
    return DeepSpeedDataLoader(
        dataset,
        batch_size=2,
        pin_memory=False,
        local_rank=0,
        tput_timer=None,
        data_parallel_world_size=dp_size,
        data_parallel_rank=dp_rank,
        deepspeed_dataloader_config=config,
    )


def take_from_loader(loader, count=None):
    """The sample ids of ``count`` micro-batches (every one when None) of a new iterator of ``loader``; then the
    iterator is dropped, so that its workers stop now."""
    taken = []
    for batch in loader if count != 0 else ():
        taken.append([int(i) for i in batch[:, 0]])
        if len(taken) == count:
            break
    loader.data_iterator = None
    return taken


def through_checkpoint(state, weights_only=False):
    """``state`` saved with ``torch.save`` and read back with ``torch.load``.

    ``weights_only=False`` is what DeepSpeed's default (torch) checkpoint engine passes; ``weights_only=True`` is
    torch's default since 2.6, which DeepSpeed's Fast and Decoupled checkpoint engines get (DeepSpeed #8500).
    With ``weights_only=True`` a state that holds more than Python built-ins fails the test with the keys that
    torch rejects.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    if not weights_only:
        return torch.load(buffer, weights_only=False)
    try:
        return torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as error:
        rejected = [key for key, value in state.items() if not loads_weights_only(value)]
        raise AssertionError(f"torch.load(weights_only=True) rejects the sampler state, keys {rejected}") from error


def loads_weights_only(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError:
        return False
    return True


def load(sampler, state, shape):
    """``sampler.load_state_dict(state)``; a state it rejects fails the test naming the state's ``shape``."""
    try:
        sampler.load_state_dict(state)
    except (KeyError, TypeError, ValueError) as error:
        raise AssertionError(f"load_state_dict() rejects a state of shape {shape!r}: {error!r}") from error


def first_divergence(expected, actual):
    """Index of the first batch where the two runs differ, None when they are equal."""
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            return index
    return None if len(expected) == len(actual) else min(len(expected), len(actual))


def cluster_files(directory):
    """{file name: bytes} of every file under ``directory`` (a ``data_cluster_path``)."""
    return {entry.name: Path(entry.path).read_bytes() for entry in os.scandir(directory) if entry.is_file()}


def pristine_sampler_class(tmp_path):
    """``DeepSpeedDataSampler`` of the pristine release the checkout is based on (``base/<version>``).

    Its data_sampler.py is read from the base commit with git and imported as a sibling module of the installed
    one, so its relative imports (constants, scheduler, indexed dataset) resolve in the installed package.
    """
    version = deepspeed.__version__.strip().split("+")[0]
    shown = subprocess.run(
        ["git", "-C", str(UPSTREAM), "show", f"base/{version}:{SAMPLER_PATH}"], capture_output=True, text=True
    )
    assert shown.returncode == 0, (
        f"no pristine tree of DeepSpeed {version} in {UPSTREAM} (run make upstream): {shown.stderr}"
    )
    path = tmp_path / "pristine_data_sampler.py"
    path.write_text(shown.stdout)
    package = data_sampler_module.__name__.rpartition(".")[0]
    spec = importlib.util.spec_from_file_location(f"{package}.pristine_data_sampler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.dist = data_sampler_module.dist  # the stubbed collectives (stub_collectives)
    return module.DeepSpeedDataSampler


def take_until_second_reshuffle(sampler, count):
    """Up to ``count`` batches of a new iterator of ``sampler``, ending before the first batch drawn after a cluster's
    second reshuffle by it; and whether the batches returned include one drawn after a reshuffle.

    A run that loaded a checkpoint of the release (or of the open PRs #8406, #8425, whose reshuffles are the
    release's) reads what that version's own run would read until then: its cluster files hold that version's
    current permutations, which the loading run's first reshuffle permutes as that version does. From its second
    reshuffle of a cluster on, the series permutes the cluster file, the release the previous permutation.
    """
    reshuffles = collections.Counter()
    original = sampler.reshuffle_clusters

    def counting_reshuffle(cidx):
        reshuffles[cidx] += 1
        original(cidx)

    sampler.reshuffle_clusters = counting_reshuffle  # an instance attribute: the sampler calls self.reshuffle_...
    iterator, batches, reshuffled = iter(sampler), [], False
    while len(batches) < count:
        batch = next(iterator)
        if max(reshuffles.values(), default=0) >= 2:
            break
        batches.append(batch)
        reshuffled = reshuffled or bool(reshuffles)
    return batches, reshuffled
