"""DeepSpeed #8787 and its three follow-ups through the engine: ``save_checkpoint()`` / ``load_checkpoint()`` with
curriculum data sampling.

No stubs: each launch runs ``engine_worker.py`` with ``DS_ACCELERATOR=cpu`` and ``deepspeed.init_distributed("gloo")``,
once with 1 rank (a plain process, its store on a port the system picks) and once with 2 ranks under
``torch.distributed.run --standalone`` (a free port; real Gloo collectives: the sampler's ``barrier`` and
``broadcast``, the engine's gradient all-reduce). Every test reads the results of these two launches; each launch has
a timeout and is killed with all its processes, and pytest-xdist workers share them. The worker defines the
scenarios: a tiny model trains, saves a checkpoint after each of ``SAVE_AT`` optimizer steps, trains on past cluster
reshuffles and new clusters between them, and dies right after the last one; a new engine loads each checkpoint in
turn with the same ``data_cluster_path`` and trains on. Its micro-batches are compared with an uninterrupted run.

Tests marked ``regression("deepspeed", 8787)`` resume from the last checkpoint and fail on the base (the sampler's
generator restarts from the seed, engine.py line 4709 -> data_sampler.py line 334). Those marked
``regression("deepspeed", "cluster-files")`` resume from the older checkpoints and fail while
``reshuffle_clusters()`` rewrites the cluster files in place (data_sampler.py lines 240-250): the restart reads the
permutation of a reshuffle that happened after its checkpoint. Those marked ``regression("deepspeed",
"io-workers")`` run with ``data_sampling.num_workers = 2`` and fail while the checkpoint holds the sampler's state
as of the DataLoader's prefetch (dataloader.py lines 129-139): the resume goes on ``num_workers * prefetch_factor``
micro-batches later; the last checkpoint is in a prefetch window before a reshuffle (a guard checks it). Those
marked ``regression("deepspeed", "consumed-samples")`` compare the ``consumed_samples`` that ``post_process_func``
receives after each restart with the uninterrupted run's, and fail while the sampler counts a micro-batch only after
its ``yield`` (data_sampler.py line 313). With workers, a restart also makes its iterator before ``load_checkpoint()``
(``RepeatingLoader``): marked ``io-workers``, it fails while the DataLoader keeps what its workers prefetched from the
fresh sampler.
"""

import os
import sys
from pathlib import Path

import pytest

from scripts import launch
from tests.deepspeed.scenarios import ONE_EPOCH
from tests.launched import launch_once, rank_results

WORKER = Path(__file__).with_name("engine_worker.py")
LAUNCH_TIMEOUT = 300  # s per launch: 20-50 s on 2 cores
# Scenarios of engine_worker.SCENARIOS per number of ranks.
# The last reads the files of the one before it (and is last: where it raises, the launch ends at once).
ITERATOR_BEFORE_LOAD = "several_clusters-num_workers2-iterator_before_load"
LAUNCHES = {
    1: ["single_cluster", "several_clusters", "several_clusters-num_workers2", ITERATOR_BEFORE_LOAD],
    2: ["single_cluster", "several_clusters", "several_clusters-num_workers2", ITERATOR_BEFORE_LOAD],
}
SAVE_AT = (3, 8, 14)  # engine_worker.SAVE_AT: two older checkpoints and the last one
# `make test` (pytest-xdist --dist loadgroup) runs every test of the launches on one worker, see test_accelerate_4204
pytestmark = pytest.mark.xdist_group("deepspeed-launches")


def _launch(out_dir, nproc):
    """Launch the worker on ``nproc`` ranks; return what the tests need to explain a missing result.

    One rank needs no launcher: it runs as a plain process with the variables ``torch.distributed.run`` would set and
    ``MASTER_PORT=0``, so that its store listens on a port the system picks (no other rank has to find it). That
    saves the launcher's own interpreter and torch import, 1.3 s of CPU (issue 31).
    """
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    if nproc == 1:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="0")
        cmd = [sys.executable, str(WORKER)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER)]
    result = launch.run(
        [*cmd, str(out_dir), *LAUNCHES[nproc]], out_dir / "launch.log", LAUNCH_TIMEOUT, cwd=out_dir, env=env
    )
    return {"returncode": result.returncode, "timed_out": result.timed_out, "seconds": result.seconds}


@pytest.fixture(scope="session")
def launches(tmp_path_factory):
    """``launches(nproc)``: the directory of the session's launch with ``nproc`` ranks, shared by xdist workers."""
    return lambda nproc: launch_once(tmp_path_factory, f"deepspeed-8787-{nproc}ranks", lambda out: _launch(out, nproc))


def first_difference(expected, actual):
    """Index of the first micro-batch where the two runs differ, None when they are equal."""
    for index, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            return index
    return None if len(expected) == len(actual) else min(len(expected), len(actual))


def assert_resumed_exactly(result, step):
    """The run restarted from the checkpoint of optimizer step ``step`` trains on the uninterrupted run's batches."""
    uninterrupted, died = result["uninterrupted"], result["died"]
    assert died == uninterrupted[: len(died)], f"rank {result['rank']}: the run that died differs before it died"
    start = step * result["gradient_accumulation"]
    after = result["resumed"][str(step)]
    expected = uninterrupted[start : start + len(after)]
    index = first_difference(expected, after)
    assert index is None, (
        f"rank {result['rank']}: restarted from the checkpoint after micro-batch {start - 1} (step {step}; the run "
        f"died after step {SAVE_AT[-1]}); micro-batch {start + index} is the first to differ from the uninterrupted "
        f"run ({index} matched after the restart): restarted {after[index]}, uninterrupted {expected[index]}; "
        f"{sum(a != b for a, b in zip(expected, after, strict=False))} of {len(expected)} differ"
    )


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("scenario", ["single_cluster", "several_clusters"])
def test_engine_resume_from_last_checkpoint_matches_uninterrupted_run(launches, nproc, scenario):
    """After ``engine.load_checkpoint()`` of the last checkpoint every rank trains on the uninterrupted run's
    batches."""
    for result in rank_results(launches(nproc), nproc, scenario):
        assert_resumed_exactly(result, SAVE_AT[-1])


@pytest.mark.regression("deepspeed", "cluster-files")
@pytest.mark.parametrize("step", SAVE_AT[:-1], ids=lambda step: f"step{step}")
@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("scenario", ["single_cluster", "several_clusters"])
def test_engine_resume_from_older_checkpoint_matches_uninterrupted_run(launches, nproc, scenario, step):
    """A restart from a checkpoint older than the run's last reshuffles (after restarts from the newer ones) reads
    what the uninterrupted run read."""
    for result in rank_results(launches(nproc), nproc, scenario):
        assert_resumed_exactly(result, step)


@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("scenario", ["single_cluster", "several_clusters"])
def test_run_reshuffles_between_the_checkpoints_only(launches, nproc, scenario):
    """The scenarios test what they claim: no sample is read twice up to the older checkpoint (no reshuffle yet),
    and by the last checkpoint the ranks together have read more samples than the dataset holds, so every cluster
    a sample came from more than once was reshuffled in between."""
    results = rank_results(launches(nproc), nproc, scenario)
    older = SAVE_AT[0] * results[0]["gradient_accumulation"]
    early = [i for result in results for batch in result["died"][:older] for i in batch]
    assert len(early) == len(set(early)), "a sample was read twice before the older checkpoint"
    read = [i for result in results for batch in result["died"] for i in batch]
    assert len(read) > ONE_EPOCH, f"the run read {len(read)} samples, not more than the {ONE_EPOCH} of an epoch"


@pytest.mark.regression("deepspeed", "io-workers")
@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("step", SAVE_AT, ids=lambda step: f"step{step}")
def test_engine_resume_with_workers_matches_uninterrupted_run(launches, nproc, step):
    """With ``data_sampling.num_workers = 2`` a restart from either checkpoint trains on the uninterrupted run's
    batches: the checkpoint holds the sampler's state of the micro-batches training consumed, not of the DataLoader's
    prefetch (``num_workers * prefetch_factor`` = 4 micro-batches ahead with torch's default prefetch factor)."""
    for result in rank_results(launches(nproc), nproc, "several_clusters-num_workers2"):
        assert result["num_workers"] == 2, f"rank {result['rank']} ran with {result['num_workers']} workers, not 2"
        assert_resumed_exactly(result, step)


@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
def test_workers_scenario_saves_in_a_prefetch_window_before_a_reshuffle(launches, nproc):
    """When the run with workers saves its last checkpoint, its DataLoader's workers have prefetched past a reshuffle
    that the same run without workers (the same batches) has not made yet: the checkpoint's state reads a cluster
    whose reshuffle the live sampler already made."""
    without = rank_results(launches(nproc), nproc, "several_clusters")[0]
    with_workers = rank_results(launches(nproc), nproc, "several_clusters-num_workers2")[0]
    index = SAVE_AT[-1] * with_workers["gradient_accumulation"] - 1  # the last micro-batch before the checkpoint
    assert with_workers["died"] == without["died"], "the run with workers trains on other micro-batches"
    reshuffles = (without["died_reshuffles"][index], with_workers["died_reshuffles"][index])
    assert reshuffles[1] > reshuffles[0], f"reshuffles by the last checkpoint, without and with workers: {reshuffles}"


@pytest.mark.regression("deepspeed", "io-workers")
@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
def test_engine_restart_with_iterator_made_before_load_checkpoint_matches_uninterrupted_run(launches, nproc):
    """With ``data_sampling.num_workers = 2`` a restart that makes its iterator (``RepeatingLoader``) before
    ``engine.load_checkpoint()`` trains on the uninterrupted run's batches, not on the micro-batches its workers
    prefetched from the fresh sampler; the checkpoint it saves holds what it consumed, so a second restart from it
    reads what the first one read."""
    restarts = rank_results(launches(nproc), nproc, ITERATOR_BEFORE_LOAD)
    for result, restart in zip(
        rank_results(launches(nproc), nproc, "several_clusters-num_workers2"), restarts, strict=True
    ):
        start = restart["step"] * result["gradient_accumulation"]
        expected = result["uninterrupted"][start : start + len(restart["first"])]
        index = first_difference(expected, restart["first"])
        assert index is None, (
            f"rank {result['rank']}: restarted from step {restart['step']} with the iterator made before the load; "
            f"micro-batch {start + index} is the first to differ from the uninterrupted run ({index} matched): "
            f"restarted {restart['first'][index]}, uninterrupted {expected[index]}"
        )
        saved = restart["saved_after"] * result["gradient_accumulation"]
        index = first_difference(restart["first"][saved:], restart["second"])
        assert index is None, (
            f"rank {result['rank']}: the checkpoint saved {restart['saved_after']} steps into that restart resumes "
            f"elsewhere: its micro-batch {index} differs from the one the first restart read"
        )


@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param("single_cluster", marks=pytest.mark.regression("deepspeed", "consumed-samples")),
        # With workers the count also needs the io-workers commit (the checkpoint holds the consumed state).
        pytest.param("several_clusters-num_workers2", marks=pytest.mark.regression("deepspeed", "io-workers")),
    ],
)
def test_engine_consumed_samples_after_restarts_match_uninterrupted_run(launches, nproc, scenario):
    """After each restart ``post_process_func`` receives the uninterrupted run's ``consumed_samples``, the samples of
    every rank's micro-batches up to and including the one it comes with."""
    for result in rank_results(launches(nproc), nproc, scenario):
        uninterrupted = result["consumed"]["uninterrupted"]
        per_micro_batch = len(result["uninterrupted"][0]) * nproc
        assert uninterrupted == [per_micro_batch * (i + 1) for i in range(len(uninterrupted))], (
            f"rank {result['rank']}: post_process_func received {uninterrupted[:6]}..., not the samples consumed"
        )
        for step in SAVE_AT:
            start = step * result["gradient_accumulation"]
            after = result["consumed"]["resumed"][str(step)]
            expected = uninterrupted[start : start + len(after)]
            assert after == expected, (
                f"rank {result['rank']}: restarted from step {step}, post_process_func received {after[:4]}..., "
                f"uninterrupted {expected[:4]}..."
            )
