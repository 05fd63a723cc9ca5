"""DeepSpeed issue #8787: the curriculum data sampler does not restore its own RNG on resume.

Upstream file: deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py (DeepSpeed 0.19.8), class
``DeepSpeedDataSampler``. Every random choice of the sampler comes from its private generator
``self.np_rng = np.random.default_rng(seed)`` (line 64): shuffling a new difficulty cluster (line 217), the
per-cluster mix of a global batch (line 236), reshuffling an exhausted cluster (line 246) and shuffling each
global batch (line 289). But ``state_dict()`` saves numpy's global RandomState (``np.random.get_state()``,
line 324) and ``load_state_dict()`` writes it back (``np.random.set_state``, line 334). So a resumed sampler
starts its generator from the seed again and yields other batches than an uninterrupted run, and loading rolls
numpy's global RNG back. Earlier report of the same defect: DeepSpeed #8405.

Tests marked ``regression("deepspeed", 8787)`` reproduce the bug: they fail on the base and pass with the
series. The other tests are guards that pass on both: the scenarios really cross an epoch, a cluster reshuffle
and several difficulty clusters; the data-parallel slicing follows the group's size; a state dict written by
older DeepSpeed keeps its old behaviour, and one written now still loads in older DeepSpeed; the seed matters.

Every resumed run is compared with an uninterrupted run of the same configuration (no hard-coded batches), and
the state goes through ``torch.save``/``torch.load`` as it does in a checkpoint.
"""

import io
import logging

import numpy as np
import pytest
import torch
from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
from deepspeed.runtime.data_pipeline.data_sampling.utils import close_mmap_dataset_builder, create_mmap_dataset_builder
from deepspeed.utils import logger as deepspeed_logger

SEED = 1234
ONE_EPOCH = 48  # samples in one epoch of the toy dataset
NUM_BATCHES = 24  # micro-batches compared per run; every scenario below passes an epoch and a reshuffle by then

# The keys of the sampler state as DeepSpeed wrote it before the fix (data_pipeline/constants.py).
OLD_FORMAT_KEYS = (
    "batch",
    "consumed_samples",
    "curriculum_step",
    "current_difficulties",
    "data_cluster_paths",
    "data_cluster_current_position",
    "np_rng_state",
)

# One cluster holding the whole dataset: the mix is trivial, the batch order and the reshuffle are random.
SINGLE_CLUSTER = {
    "clustering_type": "single_cluster",
    "difficulty_type": "value",
    "min_difficulty": 1,
    "max_difficulty": 3,
    "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [1, 2, 3], "max_step": [3, 6]},
}
# Percentile-based clusters (quartiles of the toy dataset): 24 samples from step 1, 12 more from step 4 and the
# last 12 from step 7, so the per-cluster mix of each global batch is drawn too.
SEVERAL_CLUSTERS = {
    "clustering_type": "schedule_based",
    "difficulty_type": "percentile",
    "min_difficulty": 2,
    "max_difficulty": 4,
    "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [2, 3, 4], "max_step": [3, 6]},
}
SCENARIOS = {"single_cluster": SINGLE_CLUSTER, "several_clusters": SEVERAL_CLUSTERS}


class FakeGroup:
    """Stands in for the data-parallel process group: the sampler only asks it for its size."""

    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def make_sampler(tmp_path, run, metric, seed=SEED, dp_rank=0, dp_size=1, micro_batch_size=4):
    """A sampler as global rank 0 builds it; ``run`` names its own directory of cluster files.

    Global rank 0 draws each global batch and broadcasts it; every data-parallel rank keeps its slice. With the
    broadcast stubbed, a sampler built for data-parallel rank r with ``global_rank=0`` yields what rank r
    receives.
    """
    metric = dict(metric)
    if metric["clustering_type"] != "single_cluster":
        index_path = tmp_path / "index_to_sample"
        if not (tmp_path / "index_to_sample.idx").exists():
            # The data analyzer's index_to_sample map: row i lists the samples of the i-th metric value.
            ids = np.random.default_rng(0).permutation(ONE_EPOCH)
            builder = create_mmap_dataset_builder(str(index_path), np.uint8)
            for row in np.split(ids, 8):
                builder.add_item_numpy(row)
            close_mmap_dataset_builder(builder, str(index_path))
        metric["index_to_sample_path"] = str(index_path)
    config = {
        "seed": seed,
        "data_sampling": {
            "num_epochs": 100,
            "curriculum_learning": {
                "enabled": True,
                "data_cluster_path": str(tmp_path / run),
                "curriculum_metrics": {"difficulty": metric},
            },
        },
    }
    return DeepSpeedDataSampler(
        config,
        one_epoch_total_samples=ONE_EPOCH,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
        data_parallel_group=FakeGroup(dp_size),
        gradient_accumulation_steps=2,
        global_rank=0,
    )


def take(sampler, count):
    iterator = iter(sampler)
    return [next(iterator) for _ in range(count)]


def through_checkpoint(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    # weights_only=False as in DeepSpeed's checkpoint engine: the state holds numpy's RandomState tuple.
    return torch.load(buffer, weights_only=False)


def resumed_run(tmp_path, run, resume_at, **kwargs):
    """``resume_at`` batches, a checkpoint, then a new sampler that loads it and yields the rest."""
    first = make_sampler(tmp_path, run, **kwargs)
    head = take(first, resume_at)
    state = through_checkpoint(first.state_dict())
    second = make_sampler(tmp_path, run, **kwargs)
    second.load_state_dict(state)
    return head + take(second, NUM_BATCHES - resume_at)


def first_divergence(expected, actual):
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            return index
    return None if len(expected) == len(actual) else min(len(expected), len(actual))


def assert_resume_parity(tmp_path, **kwargs):
    expected = take(make_sampler(tmp_path, "uninterrupted", **kwargs), NUM_BATCHES)
    diverged = []
    for resume_at in range(NUM_BATCHES):
        actual = resumed_run(tmp_path, f"resume-{resume_at}", resume_at, **kwargs)
        index = first_divergence(expected, actual)
        if index is not None:
            diverged.append((resume_at, index, expected[index], actual[index]))
    if diverged:
        resume_at, index, want, got = diverged[0]
        raise AssertionError(
            f"resumed at batch index {resume_at}: batch index {index} diverged first from the uninterrupted run "
            f"(uninterrupted {want}, resumed {got}); {len(diverged)} of {NUM_BATCHES} resume points diverge"
        )


def peek_global_numpy_draws(state=None, count=8):
    """The next draws of numpy's global RNG (or of ``state``), without consuming them."""
    probe = np.random.RandomState()
    probe.set_state(np.random.get_state() if state is None else state)
    return probe.random_sample(count).tolist()


class WarningRecords(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_resume_parity_at_every_step(tmp_path, scenario):
    assert_resume_parity(tmp_path, metric=SCENARIOS[scenario])


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("dp_rank", range(3), ids=lambda rank: f"rank{rank}")
def test_resume_parity_for_every_data_parallel_rank(tmp_path, dp_rank):
    assert_resume_parity(tmp_path, metric=SEVERAL_CLUSTERS, dp_rank=dp_rank, dp_size=3, micro_batch_size=2)


@pytest.mark.regression("deepspeed", 8787)
def test_load_state_dict_leaves_global_numpy_rng_alone(tmp_path):
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)
    np.random.seed(21)
    state = through_checkpoint(sampler.state_dict())
    np.random.random_sample(3)  # training goes on and uses numpy's global RNG
    expected = peek_global_numpy_draws()
    make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS).load_state_dict(state)
    actual = peek_global_numpy_draws()
    index = first_divergence(expected, actual)
    assert index is None, (
        f"load_state_dict() moved numpy's global RNG: its next draws differ from the undisturbed stream, "
        f"first at draw index {index}"
    )


def test_state_dict_leaves_global_numpy_rng_alone(tmp_path):
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)
    np.random.seed(21)
    expected = peek_global_numpy_draws()
    sampler.state_dict()
    assert peek_global_numpy_draws() == expected, "state_dict() moved numpy's global RNG"


@pytest.mark.regression("deepspeed", 8787)
def test_old_format_state_logs_one_warning(tmp_path):
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)
    state = through_checkpoint(sampler.state_dict())
    old_state = {key: state[key] for key in OLD_FORMAT_KEYS}
    handler = WarningRecords()
    deepspeed_logger.addHandler(handler)
    try:
        make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS).load_state_dict(old_state)
    finally:
        deepspeed_logger.removeHandler(handler)
    messages = [record.getMessage() for record in handler.records]
    assert len(messages) == 1, f"expected one warning from load_state_dict() of an old-format state, got {messages}"
    assert "seed" in messages[0], f"the warning should say that the sampler restarts from the seed: {messages[0]}"


def test_old_format_state_loads_with_old_behaviour(tmp_path):
    expected = take(make_sampler(tmp_path, "uninterrupted", SEVERAL_CLUSTERS), NUM_BATCHES)
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)  # an odd count: one micro-batch of the current global batch is still pending
    np.random.seed(21)
    state = through_checkpoint(sampler.state_dict())
    old_state = {key: state[key] for key in OLD_FORMAT_KEYS}
    np.random.random_sample(3)
    resumed = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    resumed.load_state_dict(old_state)
    # As before the fix: numpy's global RNG is set to the saved RandomState, the sampler's generator is at its
    # seed, and the pending micro-batch comes out as in the uninterrupted run.
    assert peek_global_numpy_draws() == peek_global_numpy_draws(old_state["np_rng_state"])
    assert resumed.np_rng.bit_generator.state == np.random.default_rng(SEED).bit_generator.state
    assert take(resumed, 1) == expected[5:6]


def test_state_dict_stays_loadable_by_older_deepspeed(tmp_path):
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)
    state = through_checkpoint(sampler.state_dict())
    # What load_state_dict() of DeepSpeed <= 0.19.8 does with the state, unconditionally (data_sampler.py line 334).
    np.random.set_state(state["np_rng_state"])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_seed_selects_the_stream(tmp_path, scenario):
    metric = SCENARIOS[scenario]
    first = take(make_sampler(tmp_path, "first", metric), NUM_BATCHES)
    again = take(make_sampler(tmp_path, "again", metric), NUM_BATCHES)
    other = take(make_sampler(tmp_path, "other", metric, seed=SEED + 1), NUM_BATCHES)
    assert first_divergence(first, again) is None, "the same seed gave two different streams"
    assert first_divergence(first, other) is not None, "different seeds gave the same stream"


@pytest.mark.parametrize(
    ("scenario", "dp_size", "micro_batch_size", "clusters"),
    [
        pytest.param("single_cluster", 1, 4, 1, id="single_cluster"),
        pytest.param("several_clusters", 1, 4, 3, id="several_clusters"),
        pytest.param("several_clusters", 3, 2, 3, id="several_clusters-3ranks"),
    ],
)
def test_scenario_crosses_epoch_reshuffle_and_clusters(
    tmp_path, monkeypatch, scenario, dp_size, micro_batch_size, clusters
):
    reshuffled = []
    original = DeepSpeedDataSampler.reshuffle_clusters

    def counting_reshuffle(self, cidx):
        reshuffled.append(cidx)
        return original(self, cidx)

    monkeypatch.setattr(DeepSpeedDataSampler, "reshuffle_clusters", counting_reshuffle)
    sampler = make_sampler(tmp_path, "run", SCENARIOS[scenario], dp_size=dp_size, micro_batch_size=micro_batch_size)
    take(sampler, NUM_BATCHES)
    assert sampler.curriculum_step * sampler.global_batch_size > ONE_EPOCH
    assert reshuffled, "no cluster was reshuffled"
    assert len(sampler.data_clusters) == clusters


def test_data_parallel_ranks_slice_the_global_batch(tmp_path):
    whole = take(make_sampler(tmp_path, "whole", SEVERAL_CLUSTERS, micro_batch_size=6), NUM_BATCHES)
    slices = [
        take(
            make_sampler(tmp_path, f"rank-{rank}", SEVERAL_CLUSTERS, dp_rank=rank, dp_size=3, micro_batch_size=2),
            NUM_BATCHES,
        )
        for rank in range(3)
    ]
    joined = [sum((per_rank[index] for per_rank in slices), []) for index in range(NUM_BATCHES)]
    assert joined == whole
    assert all(len(batch) == 2 for per_rank in slices for batch in per_rank)
