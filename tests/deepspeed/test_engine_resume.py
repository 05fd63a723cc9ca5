"""DeepSpeed #8787 through the engine: ``save_checkpoint()`` / ``load_checkpoint()`` with curriculum data sampling.

No stubs: each launch runs ``engine_worker.py`` under ``torch.distributed.run --standalone`` (a free port) with
``DS_ACCELERATOR=cpu`` and ``deepspeed.init_distributed("gloo")``, once with 1 rank and once with 2 ranks (real Gloo
collectives: the sampler's ``barrier`` and ``broadcast``, the engine's gradient all-reduce). Every test reads the
results of these two launches; each launch has a timeout and is killed with all its processes, and pytest-xdist
workers share them. The worker defines the scenarios: a tiny model trains ``STEPS_BEFORE_SAVE`` optimizer steps,
saves a checkpoint, and a new engine loads it and trains on; its micro-batches are compared with an uninterrupted
run. Tests marked ``regression`` fail on the base (the sampler's generator restarts from the seed, engine.py line
4709 -> data_sampler.py line 334) and pass with the series.
"""

import os
import sys
from pathlib import Path

import pytest

from scripts import launch
from tests.launched import launch_once, rank_results

WORKER = Path(__file__).with_name("engine_worker.py")
LAUNCH_TIMEOUT = 300  # s per launch: 20-50 s on 2 cores
# Scenarios of engine_worker.SCENARIOS per number of ranks.
LAUNCHES = {
    1: ["single_cluster", "several_clusters"],
    2: ["single_cluster", "several_clusters", "several_clusters-num_workers2"],
}
PREFETCH_FACTOR = 2  # torch DataLoader's default: each worker keeps this many batches in flight
regression = pytest.mark.regression("deepspeed", 8787)


def _launch(out_dir, nproc):
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
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


def assert_resumed_from(result, skipped):
    """The resumed run is the uninterrupted one, ``skipped`` micro-batches after the checkpoint."""
    before, after, uninterrupted = result["before"], result["after"], result["uninterrupted"]
    assert before == uninterrupted[: len(before)], f"rank {result['rank']}: the runs differ before the checkpoint"
    expected = uninterrupted[len(before) + skipped :][: len(after)]
    index = first_difference(expected, after[: len(expected)])
    assert index is None, (
        f"rank {result['rank']}: checkpoint after micro-batch {len(before) - 1}; micro-batch {len(before) + index} is "
        f"the first to differ from the uninterrupted run ({index} matched after the resume): resumed {after[index]}, "
        f"uninterrupted {expected[index]}"
    )


@regression
@pytest.mark.parametrize("nproc", [1, 2], ids=["1rank", "2ranks"])
@pytest.mark.parametrize("scenario", ["single_cluster", "several_clusters"])
def test_engine_resume_matches_uninterrupted_run(launches, nproc, scenario):
    """After ``engine.load_checkpoint()`` every rank trains on the micro-batches of the uninterrupted run."""
    for result in rank_results(launches(nproc), nproc, scenario):
        assert_resumed_from(result, skipped=0)


@regression
def test_engine_resume_with_workers_skips_the_prefetched_batches(launches):
    """With ``data_sampling.num_workers > 0`` the resumed run goes on ``num_workers * prefetch_factor`` later.

    The DataLoader's workers pull that many micro-batches from the sampler ahead of the training loop, so the
    checkpointed sampler state is past them (the PR's "Not covered"). Fails on the base, where the resumed run
    differs from the uninterrupted one altogether.
    """
    for result in rank_results(launches(2), 2, "several_clusters-num_workers2"):
        assert_resumed_from(result, skipped=result["num_workers"] * PREFETCH_FACTOR)
