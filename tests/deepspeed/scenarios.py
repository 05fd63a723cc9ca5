"""The curriculum set-ups shared by the sampler-level tests and the engine-level worker (DeepSpeed #8787).

A toy dataset of ``ONE_EPOCH`` samples and two difficulty metrics for
``data_efficiency.data_sampling.curriculum_learning.curriculum_metrics`` (DeepSpeed's
``deepspeed/runtime/data_pipeline/config.py`` reads them). Imported by ``engine_worker.py``, which runs as a script,
so this module needs nothing but numpy and DeepSpeed.
"""

import os

import numpy as np
from deepspeed.runtime.data_pipeline.data_sampling.utils import close_mmap_dataset_builder, create_mmap_dataset_builder

SEED = 1234
ONE_EPOCH = 48  # samples in one epoch of the toy dataset

# One cluster holding the whole dataset: the mix is trivial, the batch order and the reshuffle are random.
SINGLE_CLUSTER = {
    "clustering_type": "single_cluster",
    "difficulty_type": "value",
    "min_difficulty": 1,
    "max_difficulty": 3,
    "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [1, 2, 3], "max_step": [3, 6]},
}
# Percentile-based clusters (quartiles of the toy dataset): 24 samples from curriculum step 1, 12 more from step 4
# and the last 12 from step 7, so the per-cluster mix of each global batch is drawn too. Needs the data analyzer's
# index_to_sample map: see with_index_to_sample().
SEVERAL_CLUSTERS = {
    "clustering_type": "schedule_based",
    "difficulty_type": "percentile",
    "min_difficulty": 2,
    "max_difficulty": 4,
    "schedule_type": "fixed_discrete",
    "schedule_config": {"difficulty": [2, 3, 4], "max_step": [3, 6]},
}
SCENARIOS = {"single_cluster": SINGLE_CLUSTER, "several_clusters": SEVERAL_CLUSTERS}


def with_index_to_sample(metric, directory):
    """``metric`` (a dict above), completed with ``index_to_sample_path`` when its clustering needs one.

    The map (row i: the sample ids of the i-th metric value, 8 rows of 6) is written once to
    ``directory/index_to_sample.{bin,idx}``; ``directory`` must exist. Returns a new dict.
    """
    metric = dict(metric)
    if metric["clustering_type"] != "single_cluster":
        path = os.path.join(directory, "index_to_sample")
        if not os.path.exists(path + ".idx"):
            builder = create_mmap_dataset_builder(path, np.uint8)
            for row in np.split(np.random.default_rng(0).permutation(ONE_EPOCH), 8):
                builder.add_item_numpy(row)
            close_mmap_dataset_builder(builder, path)
        metric["index_to_sample_path"] = path
    return metric
