"""The DeepSpeed follow-up "cluster-path" (``docs/issues/cluster-path.md``): an experiment in a ``data_cluster_path``
that another experiment used first records only the difficulty clusters it wrote, so it reads, and restarts from each
checkpoint, as the same experiment does in a path of its own.

Upstream file: deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py (DeepSpeed 0.19.8), ``get_new_cluster()``:
after a barrier every rank records a cluster whenever a file of its name exists, whether this run wrote it or not. A
value-based metric with a fixed_linear schedule of difficulty_step 8 adds no samples at the difficulties 16 and 32,
where an experiment with difficulty_step 16 left files of those names. The test marked ``regression("deepspeed",
"cluster-path")`` fails on the base plus the commits before it and passes with it; the comparison is with restarts of
the experiment alone, so it holds whatever the later commits change in what a restart reads.
"""

import os

import numpy as np
import pytest
from deepspeed.runtime.data_pipeline.data_sampling.utils import close_mmap_dataset_builder, create_mmap_dataset_builder

from tests.deepspeed.sampling import make_sampler, take, through_checkpoint

pytestmark = pytest.mark.usefixtures("stub_collectives")

ROW_VALUES = (4, 4, 4, 4, 20, 20, 40, 40)  # the metric (a sequence length) of each row of 6 samples of the index
NUM_BATCHES = 60
SAVE_EVERY = 4


def value_metric(tmp_path, difficulty_step):
    """A value-based metric over ``ROW_VALUES``, fixed_linear from ``difficulty_step`` up to 48 (8) or 32 (16)."""
    path = os.path.join(tmp_path, "index_to_metric")
    if not os.path.exists(path + ".idx"):
        builder = create_mmap_dataset_builder(path, np.uint8)
        for value in ROW_VALUES:
            builder.add_item_numpy(np.array([value]))
        close_mmap_dataset_builder(builder, path)
    return {"clustering_type": "schedule_based", "difficulty_type": "value", "index_to_metric_path": path,
            "min_difficulty": difficulty_step, "max_difficulty": 48 if difficulty_step == 8 else 32,
            "schedule_type": "fixed_linear",
            "schedule_config": {"total_curriculum_step": 6 if difficulty_step == 8 else 2,
                                "difficulty_step": difficulty_step}}


def run_and_restarts(tmp_path, run):
    """The batches of an experiment with difficulty_step 8 in the ``data_cluster_path`` of ``run`` that saves a
    checkpoint every ``SAVE_EVERY`` batches, and by each checkpoint the batches of a new sampler that loads it."""
    sampler = make_sampler(tmp_path, run, value_metric(tmp_path, 8))
    batches, checkpoints = [], {}
    while len(batches) < NUM_BATCHES:
        checkpoints[len(batches)] = through_checkpoint(sampler.state_dict(), weights_only=True)
        batches += take(sampler, SAVE_EVERY)
    restarts = {}
    for saved_at, checkpoint in checkpoints.items():
        restarted = make_sampler(tmp_path, run, value_metric(tmp_path, 8))
        restarted.load_state_dict(checkpoint)
        restarts[saved_at] = take(restarted, NUM_BATCHES - saved_at)
    return batches, restarts


@pytest.mark.regression("deepspeed", "cluster-path")
def test_experiment_in_a_path_another_experiment_used_restarts_as_alone(tmp_path):
    alone, alone_restarts = run_and_restarts(tmp_path, "alone")
    take(make_sampler(tmp_path, "shared", value_metric(tmp_path, 16)), 4)  # the other experiment, first
    shared, shared_restarts = run_and_restarts(tmp_path, "shared")
    assert shared == alone, "the experiment read another experiment's cluster"
    diverged = [saved_at for saved_at in alone_restarts if shared_restarts[saved_at] != alone_restarts[saved_at]]
    assert diverged == [], (f"restarts from the checkpoints saved after batches {diverged} read other batches "
                            "than the same restarts of the experiment in a path of its own")
