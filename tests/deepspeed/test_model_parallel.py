"""Curriculum data sampling in model-parallel jobs: each rank a data-parallel group of its own ({0} and {1}), as with
tensor-parallel size 2 (an ``mpu``) or a 2-stage pipeline.

No stubs: one launch of ``model_parallel_worker.py`` on 2 ranks (``scripts/ranks.py``, Gloo, ``DS_ACCELERATOR=cpu``;
a timeout, the whole process tree killed) runs every scenario; the tests read its records. A scenario that raises
ends the launch, so the later ones have no record and their tests fail with the launch's log; a test fails by an
assertion that names the error a rank raised.

Marked ``regression("deepspeed", "data-parallel-group")``: they fail while the sampler draws its batches on global
rank 0 and broadcasts them from it (0.19.8 ``data_sampler.py`` lines 284 and 299): global rank 0 is in neither
data-parallel group of rank 1, which raises ``ValueError: Global rank 0 is not part of group`` at its first
micro-batch. ``regression("deepspeed", "pipeline-sampler")``: they fail while the engine reaches the sampler as
``training_dataloader.data_sampler``, which the pipeline engine's ``RepeatingLoader`` does not have
(``engine.py`` line 5028, in ``save_checkpoint()``). ``regression("deepspeed", 8787)``: a restart is exact only once
the sampler's generator is restored. The unmarked tests hold on 0.19.8 and must keep holding: a tensor-parallel
rank that has no loader, or one it never reads, loads its checkpoint.
"""

import json
import os
import sys
from pathlib import Path

import pytest

from scripts import launch, ranks
from tests.launched import launch_once

WORKER = Path(__file__).with_name("model_parallel_worker.py")
LAUNCH_TIMEOUT = 300  # s: about 15 s on 2 cores
# In the order of the commits that let them run: a scenario that raises ends the launch (0.19.8 raises in
# tensor-each-reads, the first commit alone in the pipeline's save_checkpoint()).
SCENARIOS = ["tensor-rank0-only", "tensor-rank0-reads", "tensor-each-reads", "pipeline"]
pytestmark = pytest.mark.xdist_group("deepspeed-model-parallel")


@pytest.fixture(scope="session")
def records(tmp_path_factory):
    """``records(scenario)``: both ranks' records of the session's launch."""

    def run(out_dir):
        env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        result = launch.run([sys.executable, ranks.__file__, "2", str(WORKER), str(out_dir), *SCENARIOS],
                            out_dir / "launch.log", LAUNCH_TIMEOUT, cwd=out_dir, env=env)
        return {"returncode": result.returncode, "timed_out": result.timed_out, "seconds": result.seconds}

    out_dir = launch_once(tmp_path_factory, "deepspeed-model-parallel", run)
    return lambda scenario: ran(out_dir, scenario)


def ran(out_dir, scenario):
    """Both ranks' records of ``scenario``, asserted to be there and not to have raised (a rank that raised is how
    0.19.8 fails these jobs: the assertion names the error); the launch's log tail when a rank wrote none."""
    log = (out_dir / "launch.log").read_text(errors="replace")[-2000:]
    paths = [out_dir / f"{scenario}.rank{rank}.json" for rank in range(2)]
    assert all(path.exists() for path in paths), f"no record of {scenario!r} (an earlier one ended the launch)\n{log}"
    found = [json.loads(path.read_text()) for path in paths]
    errors = [f"rank {rank}: {record['error'][-1200:]}" for rank, record in enumerate(found) if "error" in record]
    assert not errors, f"{scenario!r} raised:\n" + "\n".join(errors)
    return found


@pytest.mark.parametrize("scenario", ["tensor-rank0-only", "tensor-rank0-reads"])
def test_tensor_parallel_rank_that_reads_no_batch_loads_its_checkpoint(records, scenario):
    rank0, rank1 = records(scenario)
    assert rank1["loaded"] == rank1["saved"]  # None: no loader on rank 1
    assert rank0["resumed"] == rank1["resumed"]  # rank 1 trains on what rank 0 broadcast


@pytest.mark.regression("deepspeed", "data-parallel-group")
def test_tensor_parallel_ranks_that_each_read_get_the_same_batches(records):
    rank0, rank1 = records("tensor-each-reads")
    assert rank0["uninterrupted"] == rank1["uninterrupted"]
    assert len(rank0["uninterrupted"]) == 12 and all(len(batch) == 4 for batch in rank0["uninterrupted"])


@pytest.mark.regression("deepspeed", "pipeline-sampler")
def test_pipeline_checkpoint_holds_the_sampler_state_of_each_stage(records):
    for rank in records("pipeline"):
        assert rank["loaded"] == rank["saved"], f"stage {rank['rank']}"
        assert rank["saved"]["curriculum_step"] == 3


@pytest.mark.regression("deepspeed", 8787)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_model_parallel_restart_reads_what_the_uninterrupted_run_reads(records, scenario):
    for rank in records(scenario):
        assert rank["died"] + rank["resumed"] == rank["uninterrupted"], f"rank {rank['rank']}"
    rank0, rank1 = records(scenario)
    assert rank0["uninterrupted"] == rank1["uninterrupted"]  # the stages, or tensor-parallel ranks, agree
