"""Accelerate #4204: ``prepare()`` draws the epoch-0 permutation before the cross-rank RNG sync.

Upstream code (accelerate 1.16.0, ``src/accelerate/data_loader.py``): with
``DataLoaderConfiguration(use_stateful_dataloader=True)``, ``DataLoaderAdapter.__init__`` (line 431) calls
torchdata's ``StatefulDataLoader.state_dict()``. With ``num_workers > 0`` that builds the multiprocessing iterator
(torchdata 0.11.0 ``stateful_dataloader.py`` line 415-419): it starts the workers and primes the prefetch, which
pulls indices from the batch sampler, so the ``RandomSampler`` draws its permutation from this rank's generator
(seeded from this rank's global RNG in ``prepare_data_loader``, line 1234) inside ``accelerator.prepare()``.
torchdata reuses that iterator for the first ``__iter__``; ``DataLoaderShard.__iter__`` synchronizes the RNG
states across ranks only then (line 568), too late. Ranks whose RNG differed before ``prepare()`` shard
different permutations: epoch 0 sees some samples twice and others never.

Every test here reads the results of the suite's one real 2-process launch (Gloo on CPU,
``torch.distributed.run --standalone``, so a free port) of ``accelerate_worker.py``, where the scenarios are
defined; the launch has a timeout and is killed with all its processes, and pytest-xdist workers share it.
Tests marked ``regression`` fail on the base and pass with the series (FAIL_TO_PASS); the others are guards
and pass on both. The guards on an early ``state_dict()`` (before the first batch: no random state changes, same
epochs) and on a mid-epoch ``state_dict()`` of ``DataLoaderDispatcher`` pass on the base, where ``prepare()`` built
the iterator already, and fail with a fix that only defers that (the previous version of the series).
"""

import collections

import pytest

from tests.accelerate.accelerate_worker import EARLY_CONFIGS, USER_CODE_CONFIGS
from tests.launched import rank_results

NUM_SAMPLES = 96  # accelerate_worker.NUM_SAMPLES
regression = pytest.mark.regression("accelerate", 4204)
# `make test` (pytest-xdist --dist loadgroup) runs every test of the launch on one worker: the other workers go on with
# other tests instead of waiting for the launch
pytestmark = pytest.mark.xdist_group("accelerate-launch")


def ranks(launch_dir, scenario):
    """The two ranks' results of one scenario; fails the test with the launch's log tail when one is missing."""
    return rank_results(launch_dir, 2, scenario)


def assert_partition(rank0_ids, rank1_ids, what):
    """The two ranks' sample ids together are the dataset, each id exactly once."""
    counts = collections.Counter(rank0_ids + rank1_ids)
    union = sum(1 for i in counts if 0 <= i < NUM_SAMPLES)
    missing = NUM_SAMPLES - union
    duplicated = sum(1 for n in counts.values() if n > 1)
    assert (union, missing, duplicated, len(rank0_ids) + len(rank1_ids)) == (NUM_SAMPLES, 0, 0, NUM_SAMPLES), (
        f"{what} is not a partition of the {NUM_SAMPLES} samples across the 2 ranks: "
        f"union={union}/{NUM_SAMPLES}, missing={missing}, duplicated={duplicated} "
        f"(rank 0 saw {len(rank0_ids)}, rank 1 saw {len(rank1_ids)})"
    )


def _by_workers():
    """num_workers 0, 1, 2, 6; 0 is a guard (no prefetch, so no draw before the RNG sync), the others regressions."""
    return [pytest.param(nw, id=f"nw{nw}", marks=() if nw == 0 else regression) for nw in (0, 1, 2, 6)]


SEEDINGS = ["diverged", "unequal-use"]


@pytest.mark.parametrize("num_workers", _by_workers())
@pytest.mark.parametrize("seeding", SEEDINGS)
def test_epoch0_partition(launch_dir, seeding, num_workers):
    """Epoch 0 is an exact partition of the dataset whatever each rank's RNG state before ``prepare()``.

    ``diverged``: a different seed per rank; ``unequal-use``: a common seed, then rank 1 draws more random
    numbers before ``prepare()``. ``num_workers=0`` is a guard: the single-process iterator draws the
    permutation lazily, after ``DataLoaderShard.__iter__`` synchronized the sampler's generator (line 568).
    """
    rank0, rank1 = ranks(launch_dir, f"partition-{seeding}-nw{num_workers}")
    assert_partition(rank0["epochs"][0], rank1["epochs"][0], "epoch 0")


@pytest.mark.parametrize("num_workers", _by_workers())
@pytest.mark.parametrize("seeding", SEEDINGS)
def test_epoch0_partition_after_early_state_dict(launch_dir, seeding, num_workers):
    """As ``test_epoch0_partition``, with ``loader.state_dict()`` called after ``prepare()``, before the first batch.

    ``accelerator.save_state()`` before training does that (``checkpointing.py`` line 133). torchdata builds an
    iterator to answer (torchdata 0.11.0 ``StatefulDataLoader.state_dict``, line 415-419) and keeps it for the
    first epoch; the fix must not leave it there.
    """
    rank0, rank1 = ranks(launch_dir, f"state-dict-first-{seeding}-nw{num_workers}")
    types = [rank0["state_dict_type"], rank1["state_dict_type"]]
    assert types == ["dict", "dict"], f"an early state_dict() returned {types} on ranks 0, 1, not dicts"
    assert_partition(rank0["epochs"][0], rank1["epochs"][0], "epoch 0 after an early state_dict()")


@pytest.mark.parametrize("num_workers", _by_workers())
def test_prepare_starts_no_workers(launch_dir, num_workers):
    """``accelerator.prepare()`` starts no DataLoader worker process (counted as new live children of each rank).

    On the base, ``DataLoaderAdapter.__init__`` (line 431) starts ``num_workers`` of them per rank.
    """
    results = ranks(launch_dir, f"partition-diverged-nw{num_workers}")
    started = [r["workers_after_prepare"] for r in results]
    assert started == [0, 0], f"prepare() left worker processes running: {started} on ranks 0, 1"


@pytest.mark.parametrize("num_workers", _by_workers())
def test_early_state_dict_leaves_no_iterator(launch_dir, num_workers):
    """``loader.state_dict()`` before the first batch leaves no pre-built iterator, hence no workers, running.

    A left-over iterator would hold the permutation drawn before the RNG sync and serve it as epoch 0.
    """
    results = ranks(launch_dir, f"state-dict-first-diverged-nw{num_workers}")
    running = [r["workers_after_state_dict"] for r in results]
    assert running == [0, 0], f"workers still running after an early state_dict(): {running} on ranks 0, 1"


def test_seedable_sampler_follows_each_process_seed(launch_dir):
    """Guard on a limit of the fix, stated in the PR: with ``use_seedable_sampler=True`` and a different seed per
    process, epoch 0 is not a partition, on the base and with the series alike. ``SeedableRandomSampler`` seeds its
    generator from the process's ``torch.initial_seed()`` (``data_loader.py``, class ``SeedableRandomSampler``), by
    design, not from a generator that ``DataLoaderShard.__iter__`` synchronizes.
    """
    rank0, rank1 = ranks(launch_dir, "partition-seedable-diverged-nw0")
    shared = set(rank0["epochs"][0]) & set(rank1["epochs"][0])
    assert shared, "the ranks' epochs 0 are disjoint: the seedable sampler no longer follows each process's own seed"


@pytest.mark.parametrize("epoch", [pytest.param(0, id="epoch0", marks=regression), pytest.param(1, id="epoch1")])
def test_persistent_workers_partition(launch_dir, epoch):
    """With ``persistent_workers=True`` and 2 workers, each epoch is a partition (ranks seeded differently).

    Epoch 1 is a guard: torchdata resets the persistent iterator in ``__iter__``, after the RNG sync, so only
    epoch 0 is hit.
    """
    rank0, rank1 = ranks(launch_dir, "persistent-workers-nw2")
    assert_partition(rank0["epochs"][epoch], rank1["epochs"][epoch], f"epoch {epoch}")


@pytest.mark.parametrize("num_workers", [0, 2], ids=["nw0", "nw2"])
def test_dispatch_batches_partition(launch_dir, num_workers):
    """Guard: with ``dispatch_batches=True`` only rank 0 reads and slices, so epoch 0 is a partition before and after.

    ``DataLoaderDispatcher`` (line 714) shares ``DataLoaderAdapter``; the fix must not break it.
    """
    rank0, rank1 = ranks(launch_dir, f"dispatch-batches-nw{num_workers}")
    assert_partition(rank0["epochs"][0], rank1["epochs"][0], "epoch 0 (dispatch_batches=True)")


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param("resume-shard-nw0", id="shard-nw0"),
        pytest.param("resume-shard-nw2", id="shard-nw2", marks=regression),
        pytest.param("resume-shard-sampler-generator-nw0", id="shard-sampler-generator-nw0"),
        pytest.param("resume-shard-sampler-generator-nw2", id="shard-sampler-generator-nw2", marks=regression),
        pytest.param("resume-dispatch-nw0", id="dispatch-nw0"),
        pytest.param("resume-dispatch-nw2", id="dispatch-nw2",
                     marks=pytest.mark.regression("accelerate", "dispatcher-lookahead")),
    ],
)
def test_mid_epoch_resume(launch_dir, scenario):
    """Save after 3 batches, load into a new prepared loader: the rest equals the uninterrupted epoch 0.

    One common seed on both ranks; ``use_seedable_sampler=True`` except in ``sampler-generator`` (the generator
    ``prepare_data_loader`` attaches to the sampler, line 1234). With workers these are regression tests: on the base
    the prefetch in ``prepare()`` draws a permutation before the epoch. ``shard-nw2``: it runs before
    ``prepare_data_loader`` swaps in the ``SeedableRandomSampler`` (line 1310), so the uninterrupted epoch 0 comes
    from the original sampler while the resumed loader follows the seedable one. ``shard-sampler-generator-nw2``:
    the uninterrupted run iterates that prefetched permutation, while the resumed loader, whose ``prepare()`` drew one
    permutation already, draws the next one from the sampler's generator and skips into it. ``dispatch-nw2`` resumes
    one batch too far on the base and with the #4204 fix alike: the state of a loader with workers was not corrected
    for the dispatcher's look-ahead, a follow-up bug that the series' second commit fixes (``test_resume.py``).
    """
    for result in ranks(launch_dir, scenario):
        uninterrupted, resumed = result["uninterrupted"], result["before"] + result["after"]
        first_difference = next(
            (i for i, (a, b) in enumerate(zip(uninterrupted, resumed, strict=False)) if a != b),
            min(len(uninterrupted), len(resumed)),
        )
        assert resumed == uninterrupted, (
            f"rank {result['rank']}: save after {len(result['before'])} samples + resume yields {len(resumed)} "
            f"samples, uninterrupted {len(uninterrupted)}; first difference at sample {first_difference}"
        )


@pytest.mark.parametrize("config", sorted(EARLY_CONFIGS))
def test_early_state_dict_changes_no_generator(launch_dir, config):
    """Guard: ``loader.state_dict()`` before the first batch leaves the loader's random generators as they were.

    Generators: the global torch RNG, the ``DataLoader``'s ``generator=``, the sampler's (attached by
    ``prepare_data_loader`` or the user's) and the one ``DataLoaderShard.__iter__`` synchronizes. Asked then, torchdata
    builds an iterator to answer, which draws the workers' base seed and, with workers, the permutation while priming
    the prefetch. On the base the iterator was built in ``prepare()``, so the call draws nothing; a fix that lets
    torchdata answer and restores only the global RNG fails here. A ``SeedableRandomSampler`` creates its generator on
    its first ``__iter__`` and seeds it on every one: a generator that did not exist before the call is not compared.
    """
    for result in ranks(launch_dir, f"early-{config}-with"):
        before, after = result["generators_before"], result["generators_after"]
        changed = [name for name, state in before.items() if state is not None and after[name] != state]
        assert changed == [], f"rank {result['rank']}: an early state_dict() changed the state of {changed}"


@pytest.mark.parametrize("config", sorted(EARLY_CONFIGS))
def test_early_state_dict_keeps_the_epochs(launch_dir, config):
    """Guard: each rank yields the same epochs (two with persistent workers) with and without an early state_dict().

    Ranks are seeded differently; on the base, both runs use the iterator built in ``prepare()``.
    """
    with_call, without_call = ranks(launch_dir, f"early-{config}-with"), ranks(launch_dir, f"early-{config}-without")
    for a, b in zip(with_call, without_call, strict=True):
        assert a["epochs"] == b["epochs"], f"rank {a['rank']}: an early state_dict() changed the epochs"


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(f"checkpoint-{via}-{loader}", id=f"{via}-{loader}", marks=(regression,) * (loader != "shard-nw0"))
        for via in ("state-dict", "save-state")
        for loader in ("shard-nw0", "shard-nw2", "dispatch-nw2")
    ],
)
def test_checkpoint_before_first_batch_replays_the_epoch(launch_dir, scenario):
    """A checkpoint taken before the first batch, loaded in a restarted run, replays the epoch the saving run saw.

    Ranks seeded differently, the same seeds in the restarted run (simulated in the same process, see
    ``accelerate_worker.early_checkpoint``); ``loader.state_dict()`` or ``accelerator.save_state()``. On the base,
    the saving run's epoch 0 is the permutation drawn in ``prepare()``, while the restarted run draws a new one from
    the generator that draw advanced. ``shard-nw0`` is a guard: without workers nothing is drawn in ``prepare()``.
    """
    results = ranks(launch_dir, scenario)
    assert_partition(results[0]["saved"], results[1]["saved"], "the saving run's epoch 0")
    for result in results:
        assert result["restarted"] == result["saved"], f"rank {result['rank']}: the restarted run yields another epoch"


def test_dispatcher_mid_epoch_state_dict_keeps_the_iterator(launch_dir):
    """Guard: with ``dispatch_batches=True``, ``state_dict()`` mid-epoch on every rank keeps the iterator in use.

    Only rank 0 records the state as it yields; rank 1 records it at the end of an epoch only. The call must neither
    replace rank 1's live iterator nor start workers, then or at the end of the epoch (a fix that takes "no state
    recorded yet" for "not iterated yet" does both).
    """
    results = ranks(launch_dir, "dispatch-mid-epoch-state-dict-nw2")
    for result in results:
        expected = {"iterator_kept": True, "workers_started_by_state_dict": 0, "workers_started_by_epoch_end": 0}
        seen = {key: result[key] for key in expected}
        assert seen == expected, f"rank {result['rank']}: {seen}"
    assert_partition(results[0]["epochs"][0], results[1]["epochs"][0], "epoch 0 (dispatch_batches=True)")


USER_CODE_RUNS = ["with", "restarted"]


def _user_code(config):
    """Regression with workers (on the base ``prepare()`` already ran the user's batch sampler), a guard without."""
    return pytest.param(config, marks=() if "-nw0-" in config else regression)


def _early_state_dict(config):
    """A guard without workers; with workers a regression test of the commit that answers the first ``state_dict()``
    without the sampler: the base passes (``prepare()`` ran the batch sampler once, and the epoch used that run), the
    fix of #4204 alone fails (torchdata builds an iterator to answer, which runs the batch sampler once more).
    """
    marks = () if "-nw0-" in config else pytest.mark.regression("accelerate", "early-state-dict")
    return pytest.param(config, marks=marks)


@pytest.mark.parametrize("config", [_user_code(config) for config in sorted(USER_CODE_CONFIGS)])
def test_prepare_runs_no_user_code(launch_dir, config):
    """``prepare()`` of a loader over a user's batch sampler, dataset, ``collate_fn`` and ``worker_init_fn`` calls none
    of them (``accelerate_worker.UserBatchSampler``; its calls are logged from every process).

    On the base, ``DataLoaderAdapter.__init__`` asks torchdata for the state, which with workers starts them and
    primes the prefetch, iterating the batch sampler.
    """
    for result in ranks(launch_dir, f"user-code-{config}"):
        calls = {run: result[run]["calls_in_prepare"] for run in ("without", *USER_CODE_RUNS)}
        assert calls == {run: [] for run in calls}, f"rank {result['rank']}: prepare() called {calls}"


@pytest.mark.parametrize("config", [_early_state_dict(config) for config in sorted(USER_CODE_CONFIGS)])
def test_checkpoint_before_first_batch_runs_no_user_code(launch_dir, config):
    """A checkpoint before the first batch (``save_state()`` or ``state_dict()``), and loading it in a restarted run
    followed by another ``state_dict()``, call none of the user's code, in this process or in a worker started
    meanwhile (on the base, the workers that ``prepare()`` started go on prefetching then: their calls are not the
    checkpoint's). See ``_early_state_dict`` for when it is a regression test.
    """
    for result in ranks(launch_dir, f"user-code-{config}"):
        calls = {run: result[run]["calls_in_checkpoint"] for run in USER_CODE_RUNS}
        assert calls == {run: [] for run in calls}, f"rank {result['rank']}: the checkpoint calls ran {calls}"


@pytest.mark.parametrize("config", [_early_state_dict(config) for config in sorted(USER_CODE_CONFIGS)])
def test_checkpoint_before_first_batch_draws_no_random_number(launch_dir, config):
    """Those checkpoint calls change no random state: Python's ``random``, numpy's global RNG, torch's global
    RNG, and a torch generator that the batch sampler holds in a closure (no walk over attributes finds it)."""
    for result in ranks(launch_dir, f"user-code-{config}"):
        changed = {run: result[run]["random_states_changed"] for run in USER_CODE_RUNS}
        assert changed == {run: [] for run in changed}, f"rank {result['rank']}: random states changed: {changed}"


@pytest.mark.parametrize("config", [_early_state_dict(config) for config in sorted(USER_CODE_CONFIGS)])
def test_checkpoint_before_first_batch_keeps_the_epochs(launch_dir, config):
    """With the checkpoint, each rank reads the epochs it reads without one: the batch sampler's one-shot skip
    of 2 batches is used by the first epoch, not by the checkpoint, so each rank reads 44 of the 96 samples (its shard
    of the 22 batches after the skip), and the epoch makes the Python and numpy draws."""
    for result in ranks(launch_dir, f"user-code-{config}"):
        without, with_checkpoint = result["without"]["epochs"], result["with"]["epochs"]
        assert len(without[0]) == (NUM_SAMPLES - 2 * 4) // 2, f"rank {result['rank']}: {len(without[0])} samples"
        assert with_checkpoint == without, (
            f"rank {result['rank']}: with a checkpoint before the first batch epoch 0 reads {len(with_checkpoint[0])} "
            f"samples, starting {with_checkpoint[0][:4]}; without, {len(without[0])}, starting {without[0][:4]}"
        )


@pytest.mark.parametrize("config", [_user_code(config) for config in sorted(USER_CODE_CONFIGS)])
def test_restart_from_checkpoint_before_first_batch_replays_the_epochs(launch_dir, config):
    """A restarted run (same seed, same set-up) that loads the checkpoint reads the epochs of the run that saved it,
    and ``state_dict()`` right after loading is the loaded state.

    On the base with workers, ``prepare()`` in each run drew the order and used the skip; the loaded state makes the
    restarted run build a new iterator, which runs the batch sampler again: another order, and all 24 batches.
    """
    for result in ranks(launch_dir, f"user-code-{config}"):
        saved, restarted = result["with"]["epochs"], result["restarted"]["epochs"]
        assert restarted == saved, (
            f"rank {result['rank']}: the restarted run reads {len(restarted[0])} samples, starting "
            f"{restarted[0][:4]}; the saving run read {len(saved[0])}, starting {saved[0][:4]}"
        )
        assert result["restarted"]["state_after_load_is_loaded"], f"rank {result['rank']}: state_dict() after loading"


def _restart(via, adapter, num_workers, marked):
    """A ``restart-*`` scenario id, a regression test where ``marked`` (it fails on the base there)."""
    scenario = f"restart-{via}-{adapter}-nw{num_workers}"
    return pytest.param(scenario, id=scenario.removeprefix("restart-"), marks=(regression,) * marked)


@pytest.mark.parametrize(
    "scenario", [_restart(via, "shard", nw, nw > 0) for via in ("dcp", "save-state") for nw in (0, 2)]
)
def test_restart_from_a_mid_epoch_checkpoint_resumes_the_epoch(launch_dir, scenario):
    """A restart from the checkpoint after batch 3 reads what the saving run read after it, on every rank (ranks seeded
    differently): through ``torch.distributed.checkpoint``, which loads in place into the keys of a freshly prepared
    loader's ``state_dict()`` (so that state must be a real one before the first batch: ``{}`` gets nothing loaded,
    and the restart reads the whole epoch again, with ``num_workers=0`` too), and through ``save_state()`` /
    ``load_state()``. Guards without workers, where the base resumes exactly. ``DataLoaderDispatcher`` is left out:
    with a seed per process it resumes another permutation, on the base and with the series alike (its sampler draws
    from process 0's global RNG, which ``load_state()`` restores to its mid-epoch state; outside #4204).
    """
    for result in ranks(launch_dir, scenario):
        assert result["resumed"] == result["tail"], (
            f"rank {result['rank']}: the restart reads {len(result['resumed'])} samples starting "
            f"{result['resumed'][:4]}; after its checkpoint the saving run read {len(result['tail'])} starting "
            f"{result['tail'][:4]}"
        )


@pytest.mark.parametrize(
    "scenario",
    [
        _restart(via, adapter, nw, (adapter, nw) != ("shard", 0))
        for via in ("dcp", "save-state")
        for adapter in ("shard", "dispatch")
        for nw in (0, 2)
    ],
)
def test_fall_back_to_the_checkpoint_before_the_first_batch_replays_the_epoch(launch_dir, scenario):
    """A restart that loads the checkpoint after batch 3, then falls back to the one taken before the first batch (a
    job whose newest checkpoint turns out unusable), reads the saving run's whole epoch, on every rank. torchdata's
    ``load_state_dict({})`` keeps a state loaded before, so an empty early state resumes from batch 3 instead. A guard
    for ``DataLoaderShard`` without workers; on the base the others read another permutation (``prepare()`` built an
    iterator, and so drew from the RNG, before the epoch).
    """
    for result in ranks(launch_dir, scenario):
        epoch = result["head"] + result["tail"]
        assert result["fallback"] == epoch, (
            f"rank {result['rank']}: after falling back the restart reads {len(result['fallback'])} samples starting "
            f"{result['fallback'][:4]}; the saving run's epoch has {len(epoch)} starting {epoch[:4]}"
        )


@regression
def test_checkpoint_before_first_batch_replays_the_workers_random_numbers(launch_dir):
    """A restart from a ``save_state()`` before the first batch reads the saving run's epoch including what the
    dataset drew in the workers (``accelerate_worker.NoisyDataset``), on every rank: loading a state of an epoch not
    started starts it afresh, and the workers' base seed is then drawn after the RNG synchronization, as in the saving
    run (the seed such a state holds was drawn before it, from each rank's own RNG)."""
    for result in ranks(launch_dir, "early-checkpoint-worker-randomness-nw2"):
        saved, restarted = result["saved"], result["restarted"]
        same = sum(a == b for a, b in zip(saved, restarted, strict=False))
        assert restarted == saved, f"rank {result['rank']}: {same} of {len(saved)} (id, drawn number) pairs are equal"
