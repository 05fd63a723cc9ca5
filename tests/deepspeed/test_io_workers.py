"""The DeepSpeed follow-up "io-workers" (a commit of the series, ``docs/issues/io-workers.md``): with
``data_sampling.num_workers > 0`` a checkpoint holds the sampler's state of the micro-batches training consumed.

Upstream file: deepspeed/runtime/dataloader.py (DeepSpeed 0.19.8). ``DeepSpeedDataLoader`` builds a torch
``DataLoader`` with ``batch_sampler=DeepSpeedDataSampler`` and ``num_workers`` workers, which pulls
``num_workers * prefetch_factor`` (here 2 * 2) micro-batches from the sampler ahead of training; the checkpoint and
``post_process_func`` get the sampler's state as of that prefetch (lines 129-139). Tests marked
``regression("deepspeed", "io-workers")`` fail on the base plus the commits before it and pass with it. They
resume at every micro-batch of a *prefetch window before a reshuffle*, where the prefetch has reshuffled a cluster
that the consumed state still reads: the run finds those micro-batches itself (a reshuffle counted by the time
training takes micro-batch k with workers but not without them), on one and two data-parallel ranks, with one
cluster and with several; and after a new ``DataLoader`` iterator. The guard checks that the windows exist.

A restart may make its iterator before it loads the checkpoint (``RepeatingLoader`` does in its constructor, scripts
call ``iter(engine.training_dataloader)`` right after ``deepspeed.initialize()``): with workers the ``DataLoader`` has
prefetched from the fresh sampler by then, and those micro-batches must not reach training, nor the state saved next.
A torch ``DataLoader`` iterated directly reports what training takes through the sampler's documented hook
(``track_consumption()``); the sampler keeps a bounded state of the micro-batches training took, and none without it.
"""

import pytest
from deepspeed.runtime.dataloader import RepeatingLoader
from torch.utils.data import DataLoader

from tests.deepspeed.sampling import first_divergence, make_loader, take_from_loader, through_checkpoint
from tests.deepspeed.scenarios import SCENARIOS

pytestmark = pytest.mark.usefixtures("stub_collectives")

NUM_BATCHES = 40  # micro-batches of 2 per rank from 48 samples: past two passes and their reshuffles
PREFETCH = 2 * 2  # num_workers * torch's default prefetch_factor


def reshuffles_seen(tmp_path, run, metric, num_workers, dp_rank=0, dp_size=1):
    """The micro-batches of an uninterrupted run and, for each, the sampler's reshuffles so far when training takes
    it (``post_process_func`` runs then, in ``DeepSpeedDataLoader.__next__``)."""
    loader = make_loader(tmp_path, run, metric, num_workers, dp_rank, dp_size)
    sampler, counts, reshuffles = loader.data_sampler, [], []
    original = sampler.reshuffle_clusters

    def counting_reshuffle(cidx):
        reshuffles.append(cidx)
        original(cidx)

    sampler.reshuffle_clusters = counting_reshuffle  # an instance attribute: the sampler calls self.reshuffle_...
    loader.post_process_func = lambda data, state: counts.append(len(reshuffles)) or data
    return take_from_loader(loader, NUM_BATCHES), counts


def prefetch_windows(tmp_path, metric, dp_rank=0, dp_size=1):
    """The uninterrupted run with workers, and the numbers of micro-batches after which training stands in a prefetch
    window before a reshuffle: the workers' prefetch has reshuffled a cluster, the same run without workers not yet."""
    batches, with_workers = reshuffles_seen(tmp_path, "windows-nw2", metric, 2, dp_rank, dp_size)
    without_batches, without_workers = reshuffles_seen(tmp_path, "windows-nw0", metric, 0, dp_rank, dp_size)
    assert batches == without_batches, "the run with workers yields other micro-batches than the run without"
    return batches, [k + 1 for k in range(NUM_BATCHES - 1) if with_workers[k] > without_workers[k]]


def resumed(tmp_path, metric, resume_at, dp_rank=0, dp_size=1):
    loader = make_loader(tmp_path, f"resume-{resume_at}", metric, 2, dp_rank, dp_size)
    head = take_from_loader(loader, resume_at)
    state = through_checkpoint(loader.data_sampler.state_dict())
    loader = make_loader(tmp_path, f"resume-{resume_at}", metric, 2, dp_rank, dp_size)
    loader.data_sampler.load_state_dict(state)
    return head + take_from_loader(loader, NUM_BATCHES - resume_at)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_runs_have_prefetch_windows_before_reshuffles(tmp_path, scenario):
    windows = prefetch_windows(tmp_path, SCENARIOS[scenario])[1]
    assert len(windows) >= PREFETCH, f"micro-batches in a prefetch window before a reshuffle: {windows}"


@pytest.mark.regression("deepspeed", "io-workers")
@pytest.mark.parametrize(
    ("scenario", "dp_rank", "dp_size"),
    [
        pytest.param("single_cluster", 0, 1, id="single_cluster"),
        pytest.param("several_clusters", 0, 1, id="several_clusters"),
        pytest.param("several_clusters", 0, 2, id="several_clusters-rank0of2"),
        pytest.param("several_clusters", 1, 2, id="several_clusters-rank1of2"),
    ],
)
def test_resume_in_every_prefetch_window_matches_uninterrupted_run(tmp_path, scenario, dp_rank, dp_size):
    metric = SCENARIOS[scenario]
    expected, windows = prefetch_windows(tmp_path, metric, dp_rank, dp_size)
    diverged = []
    for resume_at in windows + [1]:
        index = first_divergence(expected, resumed(tmp_path, metric, resume_at, dp_rank, dp_size))
        if index is not None:
            diverged.append((resume_at, index + 1))
    assert not diverged, (
        f"(resumed after micro-batch, first micro-batch that differs from the uninterrupted run): {diverged}; the "
        f"resume points in a prefetch window before a reshuffle: {windows}"
    )


@pytest.mark.regression("deepspeed", "io-workers")
def test_resume_after_a_new_dataloader_iterator_matches_uninterrupted_run(tmp_path):
    """A new iterator of the loader (``iter(engine.training_dataloader)`` again) drops the micro-batches the previous
    one prefetched, with or without a checkpoint; a checkpoint saved after it resumes where training stands."""
    metric = SCENARIOS["several_clusters"]

    def run(name, resume):
        loader = make_loader(tmp_path, name, metric, 2)
        taken = take_from_loader(loader, 5)  # a first iterator, dropped with its prefetch
        batches = iter(loader)
        taken += [[int(i) for i in next(batches)[:, 0]] for _ in range(6)]
        if resume:
            state = through_checkpoint(loader.data_sampler.state_dict())
            loader.data_iterator = None
            loader = make_loader(tmp_path, name, metric, 2)
            loader.data_sampler.load_state_dict(state)
            batches = iter(loader)
        taken += [[int(i) for i in next(batches)[:, 0]] for _ in range(10)]
        loader.data_iterator = None
        return taken

    expected, actual = run("uninterrupted", resume=False), run("resumed", resume=True)
    index = first_divergence(expected, actual)
    assert index is None, f"micro-batch {index + 1} after the resume differs from the uninterrupted run's"


def ids(batch):
    return [int(i) for i in batch[:, 0]]


@pytest.mark.regression("deepspeed", "io-workers")
@pytest.mark.parametrize("make_iterator", [RepeatingLoader, iter], ids=["RepeatingLoader", "iter"])
@pytest.mark.parametrize(("dp_rank", "dp_size"), [(0, 1), (1, 2)], ids=["rank0of1", "rank1of2"])
def test_restart_with_iterator_made_before_load_matches_uninterrupted_run(tmp_path, make_iterator, dp_rank, dp_size):
    """The iterator is made, then the checkpoint loaded: the restart reads the uninterrupted run's micro-batches, and
    the state it saves (in a prefetch window before a reshuffle) resumes a second restart where the first stood."""
    metric, resume_at = SCENARIOS["several_clusters"], 3
    expected, windows = prefetch_windows(tmp_path, metric, dp_rank, dp_size)
    saved_at = next(k for k in windows if k > resume_at + PREFETCH)
    loader = make_loader(tmp_path, "run", metric, 2, dp_rank, dp_size)
    take_from_loader(loader, resume_at)
    state = through_checkpoint(loader.data_sampler.state_dict())

    loader = make_loader(tmp_path, "run", metric, 2, dp_rank, dp_size)
    batches = make_iterator(loader)  # its workers prefetch from the fresh sampler
    loader.data_sampler.load_state_dict(state)
    first = [ids(next(batches)) for _ in range(saved_at - resume_at)]
    saved = through_checkpoint(loader.data_sampler.state_dict())
    first += [ids(next(batches)) for _ in range(NUM_BATCHES - saved_at)]
    loader.data_iterator = None
    index = first_divergence(expected[resume_at:], first)
    assert index is None, (
        f"restarted after micro-batch {resume_at} with the iterator made before the load: micro-batch "
        f"{resume_at + index + 1} is the first to differ from the uninterrupted run's; the first four read "
        f"{first[:PREFETCH]}, micro-batches read before the checkpoint {expected[:resume_at]}"
    )

    loader = make_loader(tmp_path, "run", metric, 2, dp_rank, dp_size)
    loader.data_sampler.load_state_dict(saved)
    second = take_from_loader(loader, NUM_BATCHES - saved_at)
    index = first_divergence(first[saved_at - resume_at :], second)
    assert index is None, (
        f"the state saved after micro-batch {saved_at} of that restart resumes elsewhere: micro-batch "
        f"{saved_at + index + 1} differs from the one the restart read"
    )


@pytest.mark.regression("deepspeed", "io-workers")
def test_dataloader_iterated_directly_checkpoints_what_training_took(tmp_path):
    """Iterating a torch ``DataLoader`` over the sampler itself, past the prefetch windows of a run, and reporting each
    micro-batch taken through the sampler's documented hook (``track_consumption()``): the state is that of the
    micro-batches taken (a restart from it reads what the same iterator reads next), and the sampler keeps at most a
    prefetch of resume points, not one per micro-batch of the run. Without the hook it keeps none."""
    metric, taken = SCENARIOS["several_clusters"], NUM_BATCHES - 10
    loader = make_loader(tmp_path, "run", metric, 2)
    sampler = loader.data_sampler
    assert hasattr(sampler, "track_consumption"), "the sampler has no hook to report what training takes"
    consumed = sampler.track_consumption()
    batches = iter(DataLoader(loader.dataset, batch_sampler=sampler, num_workers=2))
    for _ in range(taken):
        next(batches)
        assert consumed(), "a micro-batch of the only iterator counts as fetched before a load"
    kept = len(sampler._prefetched)
    state = through_checkpoint(sampler.state_dict())
    expected = [ids(next(batches)) for _ in range(10)]
    del batches  # its workers stop
    resumed = make_loader(tmp_path, "run", metric, 2)
    resumed.data_sampler.load_state_dict(state)
    index = first_divergence(expected, take_from_loader(resumed, 10))
    assert index is None, (
        f"the state after {taken} micro-batches of the DataLoader iterated directly resumes elsewhere: micro-batch "
        f"{taken + index + 1} differs (the state counts {state['consumed_samples']} consumed samples, training "
        f"took {2 * taken})"
    )
    assert kept <= PREFETCH + 1, f"the sampler keeps {kept} resume points after {taken} micro-batches"
    untracked = iter(DataLoader(loader.dataset, batch_sampler=sampler, num_workers=2))
    for _ in range(10):
        next(untracked)
    assert len(sampler._prefetched) == 0, "the sampler keeps resume points of an iteration nobody reports on"
    del untracked
