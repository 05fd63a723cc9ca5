"""DeepSpeed issue #8787: the curriculum data sampler does not restore its own RNG on resume.

Upstream file: deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py (DeepSpeed 0.19.8), class
``DeepSpeedDataSampler``. Every random choice of the sampler comes from its private generator
``self.np_rng = np.random.default_rng(seed)`` (line 64): shuffling a new difficulty cluster (line 217), the
per-cluster mix of a global batch (line 236), reshuffling an exhausted cluster (line 246) and shuffling each
global batch (line 289). But ``state_dict()`` saves numpy's global RandomState (``np.random.get_state()``,
line 324) and ``load_state_dict()`` writes it back (``np.random.set_state``, line 334). So a resumed sampler
starts its generator from the seed again and yields other batches than an uninterrupted run, and loading rolls
numpy's global RNG back. Earlier report of the same defect: DeepSpeed #8405.

Tests marked ``regression("deepspeed", 8787)`` reproduce the bug or a demand on its fix: they fail on the base
and pass with the series. Besides exact resume they cover every sampler state a release wrote: the series' own; the
legacy one (numpy's global RandomState tuple only), which must load, restart the sampler's stream from the seed,
warn once on global rank 0 and leave numpy's global RNG alone, as must a state with the generator's state under
``"np_rng_state"`` (the shape of the open PRs #8406 and #8425, which no release wrote: the series is offered to #8406
instead) or another bit generator's there; ``state_dict()`` is a snapshot that later sampling leaves as it was; and
loading with ``torch.load(weights_only=True)``, torch's default since 2.6 and what DeepSpeed's Fast and Decoupled
checkpoint engines call (DeepSpeed #8500). The other tests are
guards that pass on both: the scenarios really cross an epoch, a cluster reshuffle and several difficulty clusters;
the data-parallel slicing follows the group's size; a state written now loads in the pristine release's own
``load_state_dict`` (imported from the base tree); the seed matters. The follow-ups' tests are in
``test_cluster_files.py``, ``test_io_workers.py`` and ``test_consumed_samples.py``.

Every resumed run is compared with an uninterrupted run of the same configuration (no hard-coded batches), and
the state goes through ``torch.save``/``torch.load`` as it does in a checkpoint. The collectives are stubbed
(``stub_collectives`` in conftest.py); ``test_engine_resume.py`` runs the engine with real ones.
"""

import copy
import logging

import numpy as np
import pytest
from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
from deepspeed.utils import logger as deepspeed_logger

from tests.deepspeed.sampling import (
    first_divergence,
    load,
    make_sampler,
    pristine_sampler_class,
    take,
    through_checkpoint,
)
from tests.deepspeed.scenarios import ONE_EPOCH, SCENARIOS, SEED, SEVERAL_CLUSTERS

pytestmark = pytest.mark.usefixtures("stub_collectives")

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


def resumed_run(tmp_path, run, resume_at, reshape=None, weights_only=False, **kwargs):
    """``resume_at`` batches, a checkpoint, then a new sampler that loads it and yields the rest.

    ``reshape(state, sampler)`` (optional) turns the saved state of ``sampler`` into another shape before it is
    loaded.
    """
    first = make_sampler(tmp_path, run, **kwargs)
    head = take(first, resume_at)
    state = through_checkpoint(first.state_dict(), weights_only=weights_only)
    second = make_sampler(tmp_path, run, **kwargs)
    load(second, reshape(state, first) if reshape else state, reshape.__name__ if reshape else "state_dict()")
    return head + take(second, NUM_BATCHES - resume_at)


def assert_resume_parity(tmp_path, resume_points=None, reshape=None, weights_only=False, **kwargs):
    """Resume after each of ``resume_points`` (default: every batch) and compare with an uninterrupted run."""
    resume_points = range(NUM_BATCHES) if resume_points is None else resume_points
    expected = take(make_sampler(tmp_path, "uninterrupted", **kwargs), NUM_BATCHES)
    diverged = []
    for resume_at in resume_points:
        actual = resumed_run(tmp_path, f"resume-{resume_at}", resume_at, reshape, weights_only, **kwargs)
        index = first_divergence(expected, actual)
        if index is not None:
            diverged.append((resume_at, index, expected[index], actual[index]))
    if diverged:
        resume_at, index, want, got = diverged[0]
        raise AssertionError(
            f"resumed at batch index {resume_at}: batch index {index} diverged first from the uninterrupted run "
            f"(uninterrupted {want}, resumed {got}); {len(diverged)} of {len(resume_points)} resume points diverge"
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


def legacy_shape(state):
    """The state as DeepSpeed <= 0.19.8 writes it: its keys only, numpy's global RandomState under "np_rng_state"."""
    legacy = {key: state[key] for key in OLD_FORMAT_KEYS}
    legacy["np_rng_state"] = np.random.get_state()
    return legacy


def load_legacy_state(tmp_path, global_rank=0):
    """A sampler (of ``global_rank``) that loaded a legacy state saved after 5 batches.

    Returns the sampler, the warnings it logged, and the next draws of numpy's global RNG just before and just
    after ``load_state_dict()`` (training used the global RNG between saving and loading).
    """
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)  # an odd count: one micro-batch of the current global batch is still pending
    state = through_checkpoint(legacy_shape(sampler.state_dict()))
    np.random.random_sample(3)  # training goes on and uses numpy's global RNG
    resumed = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS, global_rank=global_rank)
    handler = WarningRecords()
    deepspeed_logger.addHandler(handler)
    draws_before = peek_global_numpy_draws()
    try:
        load(resumed, state, "legacy")
    finally:
        deepspeed_logger.removeHandler(handler)
    return resumed, [record.getMessage() for record in handler.records], draws_before, peek_global_numpy_draws()


@pytest.mark.regression("deepspeed", 8787)
def test_legacy_state_logs_one_warning_on_global_rank_0(tmp_path):
    messages = load_legacy_state(tmp_path)[1]
    assert len(messages) == 1, f"expected one warning from load_state_dict() of a legacy state, got {messages}"
    assert "seed" in messages[0], f"the warning should say that the sampler restarts from the seed: {messages[0]}"


def test_legacy_state_logs_nothing_on_other_ranks(tmp_path):
    messages = load_legacy_state(tmp_path, global_rank=1)[1]
    assert messages == [], f"global rank 1 logged: {messages}"


@pytest.mark.regression("deepspeed", 8787)
def test_legacy_state_restarts_from_seed_and_leaves_global_numpy_rng_alone(tmp_path):
    expected_batches = take(make_sampler(tmp_path, "uninterrupted", SEVERAL_CLUSTERS), NUM_BATCHES)
    np.random.seed(21)
    resumed, _, expected_draws, actual_draws = load_legacy_state(tmp_path)
    index = first_divergence(expected_draws, actual_draws)
    assert index is None, f"loading a legacy state moved numpy's global RNG (first changed draw: index {index})"
    # The legacy state holds nothing of the sampler's generator: it starts from the seed; the pending micro-batch
    # of the saved global batch still comes out as in the uninterrupted run.
    assert resumed.np_rng.bit_generator.state == np.random.default_rng(SEED).bit_generator.state, (
        "after a legacy state the sampler's generator does not start from the seed"
    )
    assert take(resumed, 1) == expected_batches[5:6], "the pending micro-batch of the saved global batch changed"


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_weights_only_load_resumes_exactly(tmp_path, scenario):
    """The state holds only Python built-ins: ``torch.load(weights_only=True)`` reads it and the resume is exact."""
    assert_resume_parity(tmp_path, resume_points=(0, 5, 13), metric=SCENARIOS[scenario], weights_only=True)


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_state_dict_is_a_snapshot(tmp_path, scenario):
    """A state taken after 5 batches still equals itself after the sampler goes on past new clusters and a
    reshuffle: a checkpoint engine that serializes after ``state_dict()`` returns (async or decoupled) stores it."""
    sampler = make_sampler(tmp_path, "run", SCENARIOS[scenario])
    take(sampler, 5)
    state = sampler.state_dict()
    saved = copy.deepcopy(state)
    take(sampler, NUM_BATCHES)
    # "np_rng_state" holds numpy's global RandomState, not the sampler's (an array on the base).
    changed = sorted(key for key in saved if key != "np_rng_state" and state.get(key) != saved[key])
    assert not changed, f"the state taken after 5 batches changed with the sampler, keys {changed}"


def other_bit_generator_state(state, key, sampler):
    """``state`` of the old keys only, with under ``"np_rng_state"``: ``key="open-prs"``, the sampler's own generator
    state (what the open PRs #8406 and #8425 write there); ``key="mt19937"``, the state of an MT19937 generator;
    ``key="global-pcg64"``, what 0.19.8 saves there when numpy's global RNG runs on PCG64
    (``np.random.set_bit_generator``): the global RandomState's dict, of the sampler's bit generator type."""
    other = {name: state[name] for name in OLD_FORMAT_KEYS}
    if key == "global-pcg64":
        other["np_rng_state"] = np.random.RandomState(np.random.PCG64(7)).get_state()
    elif key == "open-prs":
        other["np_rng_state"] = sampler.np_rng.bit_generator.state
    else:
        other["np_rng_state"] = np.random.Generator(np.random.MT19937(7)).bit_generator.state
    return other


def load_saved_state_of(tmp_path, key):
    """A new sampler that loaded, after numpy's global RNG was seeded with 21, the state ``other_bit_generator_state``
    makes of ``key`` from a sampler that read 5 batches; returns (those 5 batches, the new sampler, the messages its
    load logged at WARNING, the global RNG's next draws as they were before the load)."""
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    before = take(sampler, 5)
    state = through_checkpoint(other_bit_generator_state(sampler.state_dict(), key, sampler))
    np.random.seed(21)
    expected_draws = peek_global_numpy_draws()
    resumed = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    handler = WarningRecords()
    deepspeed_logger.addHandler(handler)
    try:
        load(resumed, state, f"{key} state under 'np_rng_state'")
    finally:
        deepspeed_logger.removeHandler(handler)
    return before, resumed, [record.getMessage() for record in handler.records], expected_draws


@pytest.mark.regression("deepspeed", 8787)
def test_state_the_open_prs_write_resumes_exactly(tmp_path):
    """A state of the old keys with the sampler's own generator state under ``"np_rng_state"`` (what the open PRs
    #8406 and #8425 write, whichever is merged first) resumes exactly, without a warning, numpy's global RNG left
    alone (before any cluster reshuffle: the old keys hold no reshuffle)."""
    expected = take(make_sampler(tmp_path, "uninterrupted", SEVERAL_CLUSTERS), NUM_BATCHES)
    before, resumed, messages, expected_draws = load_saved_state_of(tmp_path, "open-prs")
    assert before + take(resumed, NUM_BATCHES - 5) == expected
    assert peek_global_numpy_draws() == expected_draws, "load_state_dict() moved numpy's global RNG"
    assert not messages, messages


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("key", ["mt19937", "global-pcg64"])
def test_other_bit_generator_state_restarts_from_seed_and_warns(tmp_path, key):
    """A state that holds another bit generator's state, or numpy's global RandomState of the sampler's bit generator
    type, only under ``"np_rng_state"`` takes the legacy state's path: it loads, the sampler's stream restarts from
    the seed, global rank 0 logs one warning, numpy's global RNG is left alone."""
    _, resumed, messages, expected_draws = load_saved_state_of(tmp_path, key)
    assert peek_global_numpy_draws() == expected_draws, "load_state_dict() moved numpy's global RNG"
    assert resumed.np_rng.bit_generator.state == np.random.default_rng(SEED).bit_generator.state, (
        "after a state of another bit generator the sampler's generator does not start from the seed"
    )
    assert len(messages) == 1, f"expected one warning from load_state_dict(), got {messages}"


@pytest.fixture
def global_numpy_rng_on_pcg64():
    """numpy's global RandomState on PCG64 (``np.random.set_bit_generator``, numpy 1.25+), as some training scripts
    set it; its state is then a dict, not 0.19.8's tuple. Put back on the bit generator it had afterwards."""
    default = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(21))
    yield
    np.random.set_bit_generator(default)


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_resume_parity_with_global_numpy_rng_on_another_bit_generator(tmp_path, scenario, global_numpy_rng_on_pcg64):
    """With numpy's global RNG on PCG64, ``state_dict()`` works, holds only Python built-ins and resumes exactly."""
    assert_resume_parity(tmp_path, resume_points=(0, 5, 13), metric=SCENARIOS[scenario], weights_only=True)


def builtins_only(value):
    """True when ``value`` is made of None, bool, int, float, str, and lists, tuples and dicts of them."""
    if isinstance(value, (list, tuple)):
        return all(builtins_only(item) for item in value)
    if isinstance(value, dict):
        return all(type(key) is str and builtins_only(item) for key, item in value.items())
    return value is None or type(value) in (bool, int, float, str)


# DeepSpeed's built-in difficulty schedules (curriculum_scheduler.py); fixed_discrete is the scenarios' own.
SCHEDULES = {
    "fixed_discrete": None,
    "fixed_linear": {"total_curriculum_step": 6, "difficulty_step": 1},
    "fixed_root": {"total_curriculum_step": 6, "difficulty_step": 1, "root_degree": 2},
}


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_state_dict_holds_only_python_builtins(tmp_path, scenario, schedule):
    """With each built-in difficulty schedule, the state is Python built-ins (``torch.load(weights_only=True)``)."""
    metric = dict(SCENARIOS[scenario])
    if SCHEDULES[schedule] is not None:
        metric.update(schedule_type=schedule, schedule_config=SCHEDULES[schedule])
    sampler = make_sampler(tmp_path, "saved", metric)
    take(sampler, 13)  # past a cluster reshuffle: cluster positions have been recomputed
    state = sampler.state_dict()
    other = {key: type(value).__name__ for key, value in state.items() if not builtins_only(value)}
    assert not other, f"the state holds values that are not Python built-ins: {other}"


def test_state_dict_loads_in_the_pristine_release(tmp_path):
    """The pristine ``load_state_dict`` (0.19.6-0.19.8: ``np.random.set_state(state["np_rng_state"])``, no check)
    reads a state written now, weights-only, and sets numpy's global RNG to the state saved there."""
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)
    state = through_checkpoint(sampler.state_dict())
    np.random.seed(21)
    pristine_class = pristine_sampler_class(tmp_path)
    pristine = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS, sampler_class=pristine_class)
    assert type(pristine).state_dict is not DeepSpeedDataSampler.state_dict, "the pristine sampler is the series'"
    load(pristine, state, "state_dict() read by the pristine release")
    assert peek_global_numpy_draws() == peek_global_numpy_draws(state["np_rng_state"]), (
        "the pristine release's load_state_dict() did not set numpy's global RNG to the state saved"
    )


def test_open_prs_shape_fails_in_the_pristine_release(tmp_path):
    """Why the series keeps numpy's RandomState under "np_rng_state": the pristine ``load_state_dict`` passes that
    key to ``np.random.set_state``, which rejects the generator's (PCG64) state the open PRs store there."""
    sampler = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS)
    take(sampler, 5)
    state = {key: sampler.state_dict()[key] for key in OLD_FORMAT_KEYS}
    state["np_rng_state"] = sampler.np_rng.bit_generator.state  # what the open PRs' state_dict() writes
    pristine = make_sampler(tmp_path, "saved", SEVERAL_CLUSTERS, sampler_class=pristine_sampler_class(tmp_path))
    with pytest.raises(ValueError, match="MT19937"):
        pristine.load_state_dict(through_checkpoint(state))


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
    assert sampler.curriculum_step * sampler.global_batch_size > ONE_EPOCH, "the run did not pass an epoch"
    assert reshuffled, "no cluster was reshuffled"
    assert len(sampler.data_clusters) == clusters, f"{len(sampler.data_clusters)} clusters, not {clusters}"


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
    first = next((index for index, (a, b) in enumerate(zip(joined, whole, strict=True)) if a != b), None)
    assert first is None, f"the ranks' slices of global batch {first} join to {joined[first]}, not {whole[first]}"
    assert all(len(batch) == 2 for per_rank in slices for batch in per_rank), "a rank's slice is not 2 samples"
