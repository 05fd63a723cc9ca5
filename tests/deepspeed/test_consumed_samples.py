"""The DeepSpeed follow-up "consumed-samples" (a commit of the series, ``docs/issues/consumed-samples.md``): after a
resume, ``consumed_samples`` is the uninterrupted run's.

Upstream file: deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py (DeepSpeed 0.19.8), ``__iter__``
(lines 303-314): a micro-batch is added to ``consumed_samples`` after its ``yield``, so the state after micro-batch
m (a checkpoint, what ``post_process_func`` receives) counts m - 1, and a resumed sampler never adds the missing one.
Tests marked ``regression("deepspeed", "consumed-samples")`` fail on the base plus the commits before it and pass
with it: what ``post_process_func`` receives after one or two resumes, on one and two data-parallel ranks, and when
the sampler stops; a checkpoint of the release loads and counts on from its count. The same with workers is marked
``regression("deepspeed", "io-workers")``: it also needs the io-workers commit.
The guard holds the fix to the release: an uninterrupted run yields the release's micro-batches, as many.
"""

import copy

import pytest

from tests.deepspeed.sampling import make_loader, make_sampler, pristine_sampler_class, take, through_checkpoint
from tests.deepspeed.scenarios import ONE_EPOCH, SCENARIOS, SINGLE_CLUSTER

pytestmark = pytest.mark.usefixtures("stub_collectives")

NUM_BATCHES = 30  # micro-batches of 2 per rank from 48 samples: past a pass over the dataset
# Without workers the count is the consumed-samples commit's; with workers it also needs io-workers (the checkpoint
# holds the state of the micro-batches training consumed, not of the DataLoader's prefetch).
NUM_WORKERS = [
    pytest.param(0, id="nw0", marks=pytest.mark.regression("deepspeed", "consumed-samples")),
    pytest.param(2, id="nw2", marks=pytest.mark.regression("deepspeed", "io-workers")),
]


def counting_loader(tmp_path, run, metric, num_workers, dp_rank=0, dp_size=1, num_epochs=100):
    """``make_loader()`` whose ``post_process_func`` records the ``consumed_samples`` it receives (``loader.counts``)
    and the samples of every rank's micro-batch (``loader.sizes``)."""
    loader = make_loader(tmp_path, run, metric, num_workers, dp_rank, dp_size, num_epochs)
    loader.counts, loader.sizes = [], []

    def post_process(data, state):
        loader.counts.append(state["consumed_samples"])
        loader.sizes.append(len(data) * dp_size)
        return data

    loader.post_process_func = post_process
    return loader


def run_with_resumes(tmp_path, metric, num_workers, resume_at, count=None, dp_rank=0, dp_size=1, num_epochs=100):
    """``count`` micro-batches (all when None) of loaders that save and resume after each of ``resume_at``
    micro-batches, in the directory ``tmp_path``: the counts ``post_process_func`` received and the samples it saw."""
    tmp_path.mkdir(exist_ok=True)
    counts, sizes, done, state = [], [], 0, None
    for stop in [*resume_at, count]:
        loader = counting_loader(tmp_path, "run", metric, num_workers, dp_rank, dp_size, num_epochs)
        if state is not None:
            loader.data_sampler.load_state_dict(state)
        if stop is None:
            for _ in loader:  # one iterator (iter(loader) anew would drop what the workers prefetched)
                pass
        else:
            batches = iter(loader)
            for _ in range(stop - done):
                next(batches)
        loader.data_iterator = None
        state = through_checkpoint(loader.data_sampler.state_dict())
        counts += loader.counts
        sizes += loader.sizes
        done = len(counts)
    return counts, sizes


def running_sum(sizes):
    return [sum(sizes[: index + 1]) for index in range(len(sizes))]


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
@pytest.mark.parametrize(
    ("scenario", "dp_rank", "dp_size"),
    [
        pytest.param("single_cluster", 0, 1, id="single_cluster"),
        pytest.param("several_clusters", 0, 1, id="several_clusters"),
        pytest.param("several_clusters", 1, 2, id="several_clusters-rank1of2"),
    ],
)
def test_post_process_func_counts_after_resumes_as_uninterrupted(tmp_path, scenario, dp_rank, dp_size, num_workers):
    metric = SCENARIOS[scenario]
    expected, sizes = run_with_resumes(
        tmp_path / "uninterrupted", metric, num_workers, [], NUM_BATCHES, dp_rank, dp_size
    )
    actual, _ = run_with_resumes(tmp_path / "resumed", metric, num_workers, [5, 13], NUM_BATCHES, dp_rank, dp_size)
    diverged = next(
        (index for index, (want, got) in enumerate(zip(expected, actual, strict=True)) if want != got), None
    )
    assert diverged is None, (
        f"resumed after micro-batches 5 and 13: micro-batch {diverged + 1} came with consumed_samples "
        f"{actual[diverged]}, uninterrupted {expected[diverged]}"
    )
    assert expected == running_sum(sizes), (
        f"post_process_func received {expected}, not the samples consumed with its micro-batch {running_sum(sizes)}"
    )


@pytest.mark.parametrize("num_workers", NUM_WORKERS)
def test_resumed_run_stops_with_the_uninterrupted_run(tmp_path, num_workers):
    """One epoch: the sampler stops once ``consumed_samples`` passes it, after the same micro-batch however often the
    run resumed."""
    expected = len(run_with_resumes(tmp_path / "uninterrupted", SINGLE_CLUSTER, num_workers, [], num_epochs=1)[0])
    actual = len(run_with_resumes(tmp_path / "resumed", SINGLE_CLUSTER, num_workers, [5, 13], num_epochs=1)[0])
    assert actual == expected, f"resumed after micro-batches 5 and 13, the run took {actual}, not {expected}"


@pytest.mark.regression("deepspeed", "consumed-samples")
def test_release_checkpoint_counts_on_from_its_count(tmp_path):
    """A checkpoint of 0.19.8 counts one micro-batch less than was consumed; it loads as it is, and the run counts
    on from it (one micro-batch short, as 0.19.8's own resume)."""
    release = make_sampler(tmp_path, "run", SINGLE_CLUSTER, sampler_class=pristine_sampler_class(tmp_path))
    take(release, 5)
    checkpoint = through_checkpoint(release.state_dict())
    assert checkpoint["consumed_samples"] == 4 * 4, checkpoint["consumed_samples"]  # 0.19.8: 4 of 5 counted
    series = make_sampler(tmp_path, "run", SINGLE_CLUSTER)
    series.load_state_dict(copy.deepcopy(checkpoint))
    take(series, 1)
    assert series.state_dict()["consumed_samples"] == 5 * 4, "the run does not count on from the checkpoint's count"


def test_uninterrupted_run_yields_the_release_micro_batches(tmp_path):
    """One epoch: the series yields 0.19.8's micro-batches, as many of them (counting earlier changes no batch)."""
    release = make_sampler(
        tmp_path, "release", SINGLE_CLUSTER, num_epochs=1, sampler_class=pristine_sampler_class(tmp_path)
    )
    series = make_sampler(tmp_path, "series", SINGLE_CLUSTER, num_epochs=1)
    expected, actual = list(release), list(series)
    assert len(expected) > ONE_EPOCH // 4, f"0.19.8 yields {len(expected)} micro-batches"
    assert actual == expected, f"{len(actual)} micro-batches, not 0.19.8's {len(expected)}, or other ones"
