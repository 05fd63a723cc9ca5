"""Accelerate #4204: the series beside the pristine release it applies to, in one process.

What the commit message and the PR promise beyond the bug: a dataloader state written by the release resumes the
writer's epoch in the patched version, and the release resumes a state written with the series as its own (the state
format is unchanged); ``prepare()``
with ``use_stateful_dataloader=True`` draws from the global RNG only what ``prepare()`` without it draws (the
sampler's seed, ``prepare_data_loader`` line 1234 of 1.16.0); and dataloaders without ``use_stateful_dataloader``
behave as in the release.

The release's ``data_loader.py`` and ``checkpointing.py`` (which the series' third commit changes) are read from
``base/<version>`` of the kit's checkout and imported beside the installed package (``release.py``). On the base both
sides are the release: the guards pass there and fail when the series changes what they check; the tests marked
``regression`` fail on the base.
"""

import io
import multiprocessing
import warnings

import accelerate.data_loader as data_loader_module
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch.utils.data import DataLoader

from tests.accelerate.release import release_module

NUM_SAMPLES = 48
BATCH_SIZE = 4
SEED = 7
regression = pytest.mark.regression("accelerate", 4204)


@pytest.fixture(scope="module", autouse=True)
def accelerator():
    """The accelerator state that ``DataLoaderShard.__iter__`` reads to synchronize the RNGs (one CPU process).

    Reset afterwards as Accelerate's own ``AccelerateTestCase.tearDown`` does: the states are process-wide singletons,
    and a later test in this process (``debug_launcher`` forks it) must not inherit a single-process state.
    """
    yield Accelerator(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The ``accelerate.data_loader`` module of the pristine release the checkout is based on."""
    return release_module("data_loader", tmp_path_factory.mktemp("pristine"))


@pytest.fixture(scope="module")
def pristine_checkpointing(tmp_path_factory):
    """The ``accelerate.checkpointing`` module of the pristine release the checkout is based on."""
    return release_module("checkpointing", tmp_path_factory.mktemp("pristine"))


def prepared(module, num_workers, stateful=True, num_processes=2):
    """Process 0's shard of a shuffled dataloader over the sample ids, through ``module.prepare_data_loader`` after
    ``torch.manual_seed(SEED)``: by default 2 processes, ``rng_types=["generator"]`` as ``Accelerator.prepare`` passes
    them (so the sampler gets its own generator, seeded from the global RNG; there is no other process to synchronize
    with); ``num_processes=1``: the loader of a single process."""
    torch.manual_seed(SEED)
    loader = DataLoader(list(range(NUM_SAMPLES)), batch_size=BATCH_SIZE, shuffle=True, num_workers=num_workers)
    return module.prepare_data_loader(
        loader, num_processes=num_processes, process_index=0, rng_types=["generator"], use_stateful_dataloader=stateful
    )


def ids(batches):
    return [int(i) for batch in batches for i in batch]


def through_checkpoint(state):
    """``state`` after ``torch.save`` and ``torch.load``, as ``save_state()`` / ``load_state()`` store it."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def stop(loader):
    """Ends ``loader``'s epoch (left early) and stops its workers, if any."""
    loader.end()
    iterator = loader.base_dataloader._iterator
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def state_after(module, num_workers, stop_after, num_processes=2):
    """The state of a dataloader of ``module`` (process 0's of ``num_processes``) that yielded ``stop_after`` batches
    (0: before the first batch)."""
    loader = prepared(module, num_workers, num_processes=num_processes)
    batches = []
    if stop_after:
        for batch in loader:
            batches.append(batch)
            if len(batches) == stop_after:
                break
    state = through_checkpoint(loader.state_dict())
    stop(loader)
    return state


def resumed(module, num_workers, state):
    """The rest of the epoch of a new dataloader of ``module`` that loaded ``state``."""
    loader = prepared(module, num_workers)
    loader.load_state_dict(state)
    return ids(loader)


def uninterrupted(module, num_workers):
    """The epoch of a dataloader of ``module`` that nothing interrupts."""
    loader = prepared(module, num_workers)
    return ids(loader)


STOPS = [pytest.param(0, id="before-first-batch"), pytest.param(3, id="mid-epoch")]


@pytest.mark.parametrize("stop_after", STOPS)
@pytest.mark.parametrize("num_workers", [pytest.param(0, id="nw0"), pytest.param(2, id="nw2", marks=regression)])
def test_state_of_the_release_resumes_the_epoch(pristine, num_workers, stop_after):
    """A state the release wrote (a checkpoint of the running version, before an upgrade) resumes the rest of the
    epoch the writer yielded. A regression test with workers: on the base the new dataloader's ``prepare()`` drew a
    permutation from the sampler's generator already, so the resumed run reads another permutation."""
    state = state_after(pristine, num_workers, stop_after)
    expected = uninterrupted(pristine, num_workers)[stop_after * BATCH_SIZE :]
    got = resumed(data_loader_module, num_workers, state)
    assert got == expected, f"resumed after {stop_after} batches: {got}, the writer's epoch went on with {expected}"


@pytest.mark.parametrize("stop_after", STOPS)
@pytest.mark.parametrize("num_workers", [pytest.param(0, id="nw0"), pytest.param(2, id="nw2")])
def test_release_loads_a_state_of_the_series_as_its_own(pristine, num_workers, stop_after):
    """A state written with the series (a checkpoint read after a downgrade) resumes in the release exactly as a state
    the release wrote at the same point: the state format is unchanged."""
    of_series = resumed(pristine, num_workers, state_after(data_loader_module, num_workers, stop_after))
    of_release = resumed(pristine, num_workers, state_after(pristine, num_workers, stop_after))
    expected = NUM_SAMPLES // 2 - stop_after * BATCH_SIZE
    assert len(of_release) == expected, f"the release resumed its own state with {len(of_release)} samples"
    assert of_series == of_release, (
        f"the release resumes a state of the series with {of_series[:8]}..., its own state with {of_release[:8]}..."
    )


def global_rng_after_prepare(module, num_workers, stateful):
    prepared(module, num_workers, stateful)
    return torch.random.get_rng_state()


@regression
@pytest.mark.parametrize("num_workers", [0, 2], ids=["nw0", "nw2"])
def test_prepare_draws_only_the_sampler_seed(num_workers):
    """``prepare()`` with the stateful dataloader leaves the global RNG where ``prepare()`` without it does: it drew
    the seed of the sampler's generator, and no iterator's draws (the release builds an iterator there)."""
    without = global_rng_after_prepare(data_loader_module, num_workers, stateful=False)
    torch.manual_seed(SEED)
    assert not torch.equal(without, torch.random.get_rng_state()), "prepare() drew no sampler seed"
    stateful = global_rng_after_prepare(data_loader_module, num_workers, stateful=True)
    assert torch.equal(stateful, without), "prepare() with use_stateful_dataloader=True drew more than the seed"


@pytest.mark.parametrize("num_processes", [1, 2])
@pytest.mark.parametrize("num_workers", [0, 2], ids=["nw0", "nw2"])
def test_plain_dataloader_as_in_the_release(pristine, num_workers, num_processes):
    """Without ``use_stateful_dataloader``: the same two epochs and global RNG afterwards as the release, on one
    process (where the series' fourth commit gives a stateful loader another sampler) and on two."""
    runs = []
    for module in (pristine, data_loader_module):
        loader = prepared(module, num_workers, stateful=False, num_processes=num_processes)
        epochs = [ids(loader), ids(loader)]
        runs.append((epochs, torch.random.get_rng_state()))
    (release_epochs, release_rng), (series_epochs, series_rng) = runs
    assert series_epochs == release_epochs, "without use_stateful_dataloader the series yields other epochs"
    assert torch.equal(series_rng, release_rng), "without use_stateful_dataloader the series draws other numbers"


@pytest.mark.parametrize("num_workers", [pytest.param(0, id="nw0"), pytest.param(2, id="nw2")])
def test_state_before_first_batch_is_the_release_s(pristine, num_workers):
    """Before the first batch the series answers with the state the release gives there, torchdata's state of a new
    iterator (key for key, value for value), which the series makes without building the iterator. An empty state
    would differ: ``torch.distributed.checkpoint`` could load nothing into it."""
    series, release = state_after(data_loader_module, num_workers, 0), state_after(pristine, num_workers, 0)
    assert series == release, f"before the first batch the series gives {series}, the release {release}"


def dcp_state_after(module, num_workers, stop_after, directory):
    """Save with ``torch.distributed.checkpoint`` the state of a dataloader of ``module`` that yielded ``stop_after``
    batches into ``directory``."""
    loader = prepared(module, num_workers)
    if stop_after:
        for step, _ in enumerate(loader):
            if step + 1 == stop_after:
                break
    dcp.save({"dataloader": loader}, checkpoint_id=directory)
    stop(loader)


def dcp_resumed(module, num_workers, directory):
    """The rest of the epoch of a new dataloader of ``module`` into which ``directory`` was loaded in place."""
    loader = prepared(module, num_workers)
    dcp.load({"dataloader": loader}, checkpoint_id=directory)
    return ids(loader)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("stop_after", STOPS)
@pytest.mark.parametrize("num_workers", [pytest.param(0, id="nw0"), pytest.param(2, id="nw2", marks=regression)])
def test_checkpoint_of_the_release_loads_in_place(pristine, tmp_path, num_workers, stop_after):
    """A ``torch.distributed.checkpoint`` the release wrote, loaded in place into a new dataloader of the series (an
    upgrade between checkpoint and restart), resumes the rest of the epoch the writer yielded. A regression test with
    workers, as ``test_state_of_the_release_resumes_the_epoch``."""
    dcp_state_after(pristine, num_workers, stop_after, tmp_path / "checkpoint")
    expected = uninterrupted(pristine, num_workers)[stop_after * BATCH_SIZE :]
    got = dcp_resumed(data_loader_module, num_workers, tmp_path / "checkpoint")
    assert got == expected, f"resumed after {stop_after} batches: {got}, the writer's epoch went on with {expected}"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("stop_after", STOPS)
@pytest.mark.parametrize("num_workers", [pytest.param(0, id="nw0"), pytest.param(2, id="nw2")])
def test_release_loads_a_checkpoint_of_the_series_in_place_as_its_own(pristine, tmp_path, num_workers, stop_after):
    """A ``torch.distributed.checkpoint`` the series wrote, loaded in place into a new dataloader of the release (a
    downgrade), resumes as a checkpoint the release wrote at the same point."""
    dcp_state_after(data_loader_module, num_workers, stop_after, tmp_path / "series")
    dcp_state_after(pristine, num_workers, stop_after, tmp_path / "release")
    of_series = dcp_resumed(pristine, num_workers, tmp_path / "series")
    of_release = dcp_resumed(pristine, num_workers, tmp_path / "release")
    assert len(of_release) == NUM_SAMPLES // 2 - stop_after * BATCH_SIZE, f"{len(of_release)} samples resumed"
    assert of_series == of_release, (
        f"the release resumes a checkpoint of the series with {of_series[:8]}..., its own with {of_release[:8]}..."
    )


class CountingIterator:
    """Yields ``item(0)`` ... ``item(count - 1)``; stateful: its state is how many items it yielded."""

    def __init__(self, count, item=int):
        self.count, self.item, self.yielded = count, item, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.yielded == self.count:
            raise StopIteration
        self.yielded += 1
        return self.item(self.yielded - 1)

    def state_dict(self):
        return {"yielded": self.yielded}

    def load_state_dict(self, state):
        self.yielded = state["yielded"]


class IterableOfItsOwnIterators(torch.utils.data.IterableDataset):
    """The sample ids from a ``CountingIterator``: the dataset is not its own iterator, the iterator has a state."""

    def __iter__(self):
        return CountingIterator(NUM_SAMPLES)


class BatchSamplerOfItsOwnIterators(torch.utils.data.BatchSampler):
    """Batches of the sample ids, each reversed, from a ``CountingIterator``."""

    def __init__(self):
        self.batch_size, self.drop_last = BATCH_SIZE, False

    def __iter__(self):
        return CountingIterator(len(self), lambda i: list(range((i + 1) * BATCH_SIZE - 1, i * BATCH_SIZE - 1, -1)))

    def __len__(self):
        return NUM_SAMPLES // BATCH_SIZE


def loader_of_own_iterators(module, kind, num_workers):
    """A stateful ``DataLoaderShard`` of ``module`` (one process) whose dataset's or batch sampler's iterator is an
    object of its own with a state: torchdata's state holds that iterator's, which a new loader cannot know before it
    builds one."""
    if kind == "dataset":
        dataset, kwargs = IterableOfItsOwnIterators(), {"batch_size": BATCH_SIZE}
    else:
        dataset, kwargs = list(range(NUM_SAMPLES)), {"batch_sampler": BatchSamplerOfItsOwnIterators()}
    return module.DataLoaderShard(dataset, num_workers=num_workers, use_stateful_dataloader=True, **kwargs)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_early_state_dict_puts_back_numpy_s_global_generator_of_any_kind():
    """numpy's global generator on PCG64 (``np.random.set_bit_generator``): a ``state_dict()`` before the first batch
    that asks torchdata (a batch sampler of its own iterators) puts numpy's state back without numpy's legacy-state
    warning (``np.random.get_state()`` warns for any bit generator but MT19937), and numpy draws on as without it."""
    previous = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(SEED))
    try:
        expected = np.random.random(3)
        np.random.set_bit_generator(np.random.PCG64(SEED))
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="get_state and legacy")
            loader_of_own_iterators(data_loader_module, "batch-sampler", 0).state_dict()
        drawn = np.random.random(3)
    finally:
        np.random.set_bit_generator(previous)
    assert list(drawn) == list(expected), "the early state_dict() changed what numpy's global generator draws next"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("kind", ["dataset", "batch-sampler"])
@pytest.mark.parametrize("num_workers", [pytest.param(0, id="nw0"), pytest.param(2, id="nw2")])
def test_checkpoint_with_iterators_of_their_own_loads_in_place_as_the_release_s(pristine, tmp_path, num_workers, kind):
    """A ``torch.distributed.checkpoint`` saved after 3 batches, loaded in place into a new loader whose dataset's or
    batch sampler's iterator has a state of its own, resumes the rest of the epoch in the series as in the release (a
    review found the series' state before the first batch lacking that iterator's keys: the load raised, or lost the
    iterator's position)."""
    results = {}
    for label, module in (("release", pristine), ("series", data_loader_module)):
        uninterrupted = ids(loader_of_own_iterators(module, kind, num_workers))
        loader = loader_of_own_iterators(module, kind, num_workers)
        for step, _ in enumerate(loader):
            if step == 2:
                dcp.save({"dataloader": loader}, checkpoint_id=tmp_path / label)
                break
        stop(loader)
        resumed = loader_of_own_iterators(module, kind, num_workers)
        try:
            dcp.load({"dataloader": resumed}, checkpoint_id=tmp_path / label)
            results[label] = ids(resumed)
        except Exception as error:  # what the load raised, as the result to compare
            results[label] = f"{type(error).__name__}: {str(error).splitlines()[-1]}"
        assert results["release"] == uninterrupted[3 * BATCH_SIZE :], f"the release resumed with {results['release']}"
    assert results["series"] == results["release"], f"the series resumes with {results['series']}"


def loader_of_torchdata_samplers(module):
    """A stateful ``DataLoaderShard`` of ``module`` (one process) over torchdata's ``BatchSampler`` of its
    ``RandomSampler`` with a seeded generator: the state counts where the epoch is in the batch sampler (torchdata
    before 0.11) or in its iterator (0.11)."""
    from torchdata.stateful_dataloader.sampler import BatchSampler as StatefulBatchSampler
    from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler

    dataset = list(range(NUM_SAMPLES))
    sampler = StatefulRandomSampler(dataset, generator=torch.Generator().manual_seed(SEED))
    batch_sampler = StatefulBatchSampler(sampler, BATCH_SIZE, False)
    return module.DataLoaderShard(dataset, batch_sampler=batch_sampler, use_stateful_dataloader=True)


def as_the_dispatcher_adjusts_it(state):
    """``state`` with the look-ahead of two processes subtracted as ``DataLoaderDispatcher``'s
    ``adjust_state_dict_for_prefetch`` subtracts it (one batch from the batch counts and from the batch sampler's
    count): after the first batch of an epoch they are 0, while the sampler's iterator still counts what it yielded."""
    state["_num_yielded"] -= 1
    state["_sampler_iter_yielded"] -= 1
    if state["_index_sampler_state"] is not None:
        state["_index_sampler_state"]["samples_yielded"] -= BATCH_SIZE
    return state


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_state_whose_counts_the_dispatcher_adjusted_resumes_as_in_the_release(pristine, epoch):
    """A state saved one batch into ``epoch`` whose batch counts the dispatcher's adjustment brought to 0 resumes the
    rest of that epoch in the series as in the release (a review found the series taking it for the state of an
    epoch not started: it replayed the epoch, in epoch 1 epoch 0's order)."""
    results = {}
    for label, module in (("release", pristine), ("series", data_loader_module)):
        loader = loader_of_torchdata_samplers(module)
        for _ in range(epoch):
            ids(loader)
        batches = iter(loader)
        next(batches)
        state = as_the_dispatcher_adjusts_it(through_checkpoint(loader.state_dict()))
        rest = ids(batches)
        resumed = loader_of_torchdata_samplers(module)
        resumed.load_state_dict(state)
        results[label] = ids(resumed)
        assert results["release"] == rest, f"the release resumed with {results['release']}, the epoch had {rest} left"
    assert results["series"] == results["release"], f"the series resumes with {results['series']}"


@pytest.mark.parametrize("method", ["state_dict", "load_state_dict"])
def test_plain_dataloader_state_methods_as_in_the_release(pristine, method):
    """Without ``use_stateful_dataloader`` the dataloader has no state: ``state_dict()`` and ``load_state_dict()``
    raise what they raise in the release (a checkpoint of such a loader fails when it is taken, not at resume)."""
    raised = []
    for module in (pristine, data_loader_module):
        loader = prepared(module, 0, stateful=False)
        with pytest.raises(Exception) as error:
            getattr(loader, method)(*([{}] if method == "load_state_dict" else []))
        raised.append((type(error.value), str(error.value)))
    assert raised[1] == raised[0], f"the series raises {raised[1]}, the release {raised[0]}"


def one_process_loader(module, num_workers, dataset=None):
    """A user's shuffled ``DataLoader`` (of the sample ids, or of ``dataset``) and the stateful loader of one process
    that ``module`` prepares of it after ``torch.manual_seed(SEED)``."""
    torch.manual_seed(SEED)
    dataset = list(range(NUM_SAMPLES)) if dataset is None else dataset
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=num_workers)
    return loader, module.prepare_data_loader(loader, num_processes=1, process_index=0, use_stateful_dataloader=True)


def epochs_with_states(loader, epochs, states=None):
    """The batches of ``epochs`` epochs of ``loader``, each step drawing from the global RNG as dropout does;
    ``states``: the loader's state and the global RNG's after each batch (what ``save_state()`` keeps), by the number
    of batches read."""
    batches = []
    for _ in range(epochs):
        for batch in loader:
            batches.append([int(i) for i in batch])
            torch.rand(2)
            if states is not None:
                states[len(batches)] = (through_checkpoint(loader.state_dict()), torch.random.get_rng_state())
    return batches


@pytest.mark.regression("accelerate", "shuffled-resume")
@pytest.mark.parametrize("num_workers", [0, 2], ids=["nw0", "nw2"])
def test_shuffled_loader_of_one_process_resumes_in_every_epoch_in_the_release_s_order(pristine, num_workers):
    """A shuffled stateful loader of one process reads the release's batches for the seed, three epochs, draws from
    the global RNG what the release draws, and leaves the user's sampler without a generator; restarted (prepared
    after the seed, the global RNG set back, the state loaded) in the middle and at the end of epochs 0 and 1, it
    reads the rest of the uninterrupted run's batches. (The release draws the order again from the restored RNG.)"""
    release_batches = epochs_with_states(one_process_loader(pristine, num_workers)[1], 3)
    release_rng = torch.random.get_rng_state()
    states = {}
    user_loader, loader = one_process_loader(data_loader_module, num_workers)
    batches = epochs_with_states(loader, 3, states)
    assert batches == release_batches, "the series reads other batches than the release for the same seed"
    assert torch.equal(torch.random.get_rng_state(), release_rng), "the series draws other numbers than the release"
    assert user_loader.sampler.generator is None, "the user's sampler was given a generator"
    epoch_length = NUM_SAMPLES // BATCH_SIZE
    wrong = []
    for read in (epoch_length // 2, epoch_length, 3 * epoch_length // 2, 2 * epoch_length):
        state, rng_state = states[read]
        restarted = one_process_loader(data_loader_module, num_workers)[1]
        torch.random.set_rng_state(rng_state)
        restarted.load_state_dict(state)
        if epochs_with_states(restarted, 3 - read // epoch_length) != batches[read:]:
            wrong.append(read)
    assert not wrong, f"the restarts after these numbers of batches read other batches: {wrong}"


class EpochTagged(torch.utils.data.Dataset):
    """Sample ``i`` of epoch ``e`` is ``i + 1000 * e``: an epoch-dependent transform, told by ``set_epoch()``, as
    ``datasets`` and augmentation pipelines have."""

    epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return NUM_SAMPLES

    def __getitem__(self, index):
        return index + 1000 * self.epoch


@pytest.mark.parametrize("num_workers", [0, 2], ids=["nw0", "nw2"])
def test_loading_a_state_starts_no_worker_and_set_epoch_after_it_reaches_the_data(pristine, num_workers):
    """As the release's, no DataLoader worker runs after a state recorded in an epoch is loaded into a new loader
    (counted as live children; 1.16.0's ``prepare()`` starts them and its load ends them), so a dataset's
    ``set_epoch()`` called after the load, as a training loop calls it at the top of the resumed epoch, reaches every
    resumed sample (the workers copy the dataset when they start). Input c56's kind; the series built the restored
    iterator in ``load_state_dict()`` before."""
    running, epochs = {}, {}
    for module in (pristine, data_loader_module):
        saving = one_process_loader(module, num_workers, EpochTagged())[1]
        saving.set_epoch(1)
        batches = iter(saving)
        next(batches), next(batches)
        state = through_checkpoint(saving.state_dict())
        list(batches)  # the end of the epoch: its workers are joined
        children = len(multiprocessing.active_children())
        restarted = one_process_loader(module, num_workers, EpochTagged())[1]
        restarted.load_state_dict(state)
        running[module.__name__] = len(multiprocessing.active_children()) - children
        restarted.set_epoch(1)
        epochs[module.__name__] = sorted({i // 1000 for i in ids(restarted)})
    assert running == dict.fromkeys(running, 0), f"DataLoader workers running after load_state_dict(): {running}"
    assert epochs == dict.fromkeys(epochs, [1]), f"the epochs of the samples resumed after set_epoch(1): {epochs}"


def processes(monkeypatch, num_processes):
    """Makes ``accelerate.checkpointing`` see ``num_processes`` processes (``PartialState().num_processes``)."""
    from accelerate import checkpointing

    state = type("Processes", (), {"num_processes": num_processes})()
    monkeypatch.setattr(checkpointing, "PartialState", lambda: state)


def save_after(folder, stop_after, process_index, monkeypatch, num_processes=2, start=None, loader_processes=2):
    """``save_accelerator_state`` into ``folder`` as process ``process_index`` of ``num_processes``, from a loader (of
    ``loader_processes``, that loaded ``start`` first when given) that yielded ``stop_after`` batches; returns the rest
    of that loader's epoch."""
    from accelerate import checkpointing

    loader = prepared(data_loader_module, 0, num_processes=loader_processes)
    if start is not None:
        loader.load_state_dict(start)
    batches = iter(loader)
    for _ in range(stop_after):
        next(batches)
    processes(monkeypatch, num_processes)
    checkpointing.save_accelerator_state(folder, [], [], [], [loader], process_index=process_index, step=0)
    monkeypatch.undo()
    return ids(batches)


def load_as(module, folder, process_index, monkeypatch, num_processes=2):
    """The rest of the epoch of a new loader into which ``module`` (a ``checkpointing``) loads ``folder`` as process
    ``process_index`` of ``num_processes``."""
    loader = prepared(data_loader_module, 0)
    if module.__name__ == "accelerate.checkpointing":
        processes(monkeypatch, num_processes)
    module.load_accelerator_state(folder, [], [], [], [loader], process_index=process_index)
    monkeypatch.undo()
    return ids(loader)


@pytest.mark.regression("accelerate", "shared-checkpoint-folder")
def test_processes_saving_into_one_folder_each_load_their_own_state(tmp_path, monkeypatch):
    """Processes 0 and 1 of 2 save different states into one folder after 3 batches, process 1 last (as the states of
    ``dispatch_batches=True`` differ, where process 0 reads the batches and sends them; here process 1's loader went on
    from a state 2 batches ahead). The series loads each process's own (the base loads process 1's into both)."""
    from accelerate import checkpointing

    ahead = state_after(data_loader_module, 0, 2)
    rest = {0: save_after(tmp_path, 3, 0, monkeypatch), 1: save_after(tmp_path, 3, 1, monkeypatch, start=ahead)}
    for process_index in (0, 1):
        loaded = load_as(checkpointing, tmp_path, process_index, monkeypatch)
        assert loaded == rest[process_index], f"process {process_index} resumed with {loaded}"


@pytest.mark.parametrize("process_index", [0, 1])
def test_release_loads_a_checkpoint_of_several_processes_as_its_own(
    pristine_checkpointing, tmp_path, monkeypatch, process_index
):
    """What the PR says of 1.16.0 loading a checkpoint that several processes saved with the series' third commit into
    one folder: it loads ``dl_state_dict.bin``, the last writer's state, as from a folder it saved itself, and resumes
    the rest of the epoch."""
    save_after(tmp_path, 3, 0, monkeypatch)
    rest = save_after(tmp_path, 3, 1, monkeypatch)
    assert load_as(pristine_checkpointing, tmp_path, process_index, monkeypatch) == rest


def test_checkpoint_of_the_main_process_only_resumes_every_process(pristine_checkpointing, tmp_path, monkeypatch):
    """Only process 0 of 2 saves (``if accelerator.is_main_process: save_state()``): process 1 loads its state, as in
    1.16.0, and both resume at the same batch."""
    from accelerate import checkpointing

    rest = save_after(tmp_path, 3, 0, monkeypatch)
    for process_index in (0, 1):
        for label, module in (("series", checkpointing), ("release", pristine_checkpointing)):
            loaded = load_as(module, tmp_path, process_index, monkeypatch)
            assert loaded == rest, f"{label}: process {process_index} resumed with {loaded}, the epoch had {rest} left"


@pytest.mark.parametrize("saved_by, loaded_by", [(2, 4), (2, 1), (4, 2)])
def test_another_number_of_processes_loads_one_state_in_every_process(tmp_path, monkeypatch, saved_by, loaded_by):
    """Saved by ``saved_by`` processes into one folder (process 1 last, at another batch than the others), loaded by
    ``loaded_by``: every process loads the same state, ``dl_state_dict.bin``, as 1.16.0 does, and resumes at the same
    batch, whatever files of each process the folder holds."""
    from accelerate import checkpointing

    for process_index in range(saved_by):
        if process_index != 1:
            save_after(tmp_path, 2, process_index, monkeypatch, num_processes=saved_by)
    rest = save_after(tmp_path, 4, 1, monkeypatch, num_processes=saved_by)
    for process_index in range(loaded_by):
        loaded = load_as(checkpointing, tmp_path, process_index, monkeypatch, num_processes=loaded_by)
        assert loaded == rest, f"process {process_index} of {loaded_by} resumed with {loaded}, expected {rest}"


@pytest.mark.regression("accelerate", "shared-checkpoint-folder")
@pytest.mark.parametrize("saved_by, loaded_by", [(2, 4), (2, 1), (4, 2)])
def test_another_number_of_processes_loads_process_0_s_state_of_the_same_save(
    tmp_path, monkeypatch, saved_by, loaded_by
):
    """Saved by ``saved_by`` processes into one folder at the same batch, process 1 last with another state (its loader
    went on from a state 1 batch ahead, as the states of ``dispatch_batches=True`` differ), loaded by ``loaded_by``:
    every process loads process 0's state, not the last writer's."""
    from accelerate import checkpointing

    ahead = state_after(data_loader_module, 0, 1, num_processes=saved_by)
    for process_index in [index for index in range(saved_by) if index != 1] + [1]:
        save_after(tmp_path, 2, process_index, monkeypatch, num_processes=saved_by, loader_processes=saved_by,
                   start=ahead if process_index == 1 else None)
    loader = prepared(data_loader_module, 0)
    loader.load_state_dict(state_after(data_loader_module, 0, 2, num_processes=saved_by))
    rest = ids(loader)  # the loader load_as makes, from process 0's state
    for process_index in range(loaded_by):
        loaded = load_as(checkpointing, tmp_path, process_index, monkeypatch, num_processes=loaded_by)
        assert loaded == rest, f"process {process_index} of {loaded_by} resumed with {loaded}, not {rest}"


@pytest.mark.parametrize("saved_by", [4, 2])
@pytest.mark.parametrize("fresh", ["two-processes", "one-process", "main-only"])
def test_state_of_an_older_save_in_a_reused_folder_is_not_loaded(tmp_path, monkeypatch, saved_by, fresh):
    """A folder that ``saved_by`` processes saved into (after 1 batch) is saved into again, after 3 batches: by 2
    processes, by a single process, or by the main process of 2 only. Every process of the new count loads the fresh
    state, none the file an older save left for it (2 then the main process of 2: the file of process 1 is left)."""
    from accelerate import checkpointing

    for process_index in range(saved_by):
        save_after(tmp_path, 1, process_index, monkeypatch, num_processes=saved_by)
    num_processes = 1 if fresh == "one-process" else 2
    savers = [0] if fresh != "two-processes" else [0, 1]
    rest = [save_after(tmp_path, 3, index, monkeypatch, num_processes=num_processes) for index in savers]
    for process_index in range(num_processes):
        loaded = load_as(checkpointing, tmp_path, process_index, monkeypatch, num_processes=num_processes)
        assert loaded == rest[0], f"process {process_index} of {num_processes} resumed with {loaded}, not {rest[0]}"


@pytest.mark.parametrize("process_index", [0, 1])
def test_folder_the_release_saved_into_after_the_series_loads_the_release_s_state(
    pristine_checkpointing, tmp_path, monkeypatch, process_index
):
    """A rollback that saves into a folder of the series: every process of 2 saves after 1 batch with the series, then
    1.16.0 saves after 3 batches, which leaves the series' files of each process there. The series loads 1.16.0's
    state on every process, as 1.16.0 does."""
    from accelerate import checkpointing

    for index in (0, 1):
        save_after(tmp_path, 1, index, monkeypatch)
    loader = prepared(data_loader_module, 0)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    pristine_checkpointing.save_accelerator_state(tmp_path, [], [], [], [loader], process_index=0, step=0)
    rest = ids(batches)
    loaded = load_as(checkpointing, tmp_path, process_index, monkeypatch)
    assert loaded == rest, f"process {process_index} resumed with {loaded}, 1.16.0's save had {rest} left"


def test_release_resumes_a_checkpoint_of_one_process_of_the_series(pristine_checkpointing, tmp_path):
    """A single process still writes ``dl_state_dict.bin`` (the commit message says so), and 1.16.0 loads it as its
    own: it resumes the rest of the epoch."""
    from accelerate import checkpointing

    loader = prepared(data_loader_module, 0)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    checkpointing.save_accelerator_state(tmp_path, [], [], [], [loader], process_index=0, step=0)
    rest = ids(batches)
    assert sorted(p.name for p in tmp_path.glob("dl_state_dict*")) == ["dl_state_dict.bin"]
    resumed = prepared(data_loader_module, 0)
    pristine_checkpointing.load_accelerator_state(tmp_path, [], [], [], [resumed], process_index=0)
    assert ids(resumed) == rest, "the release did not resume the rest of the epoch"
