"""One rank of the engine-level scenarios of ``test_engine_resume.py`` (DeepSpeed issue #8787).

Run by the test module as
``DS_ACCELERATOR=cpu python -m torch.distributed.run --standalone --nproc_per_node=N engine_worker.py OUT_DIR``
(one rank: ``python engine_worker.py OUT_DIR`` with the variables the launcher sets, ``MASTER_PORT=0``).
Nothing is stubbed: ``deepspeed.init_distributed("gloo")``, ``deepspeed.initialize(..., training_data=...)`` with
curriculum data sampling, ``engine.save_checkpoint()`` and, in a new engine, ``engine.load_checkpoint()``.
Sample ``i`` of the dataset is the tensor ``[i]``, so each micro-batch tells which samples it holds.

For each scenario this rank writes ``OUT_DIR/<scenario>.rank<N>.json``: the sample ids of every micro-batch of an
uninterrupted run (``uninterrupted``); of a run that saves a checkpoint after each of ``SAVE_AT`` optimizer steps,
trains on past cluster reshuffles and new clusters, and dies right after its last checkpoint (``died``); and, for
each of its checkpoints, of a new engine that loads it with the same ``data_cluster_path`` and trains
``STEPS_AFTER`` steps (``resumed``, keyed by the checkpoint's step; the last checkpoint is loaded first, as a
restarted job does, then the older ones). For each of these runs it also records, per micro-batch training takes,
the ``consumed_samples`` that ``post_process_func`` receives with it (``consumed``) and, for the run that died, how
many reshuffles this rank's sampler had made by then (``died_reshuffles``; the DataLoader's workers prefetch ahead).
The scenario ``several_clusters-num_workers2-iterator_before_load`` (run after ``several_clusters-num_workers2``,
whose cluster files and checkpoints it reads) restarts from the last checkpoint with the iterator made *before*
``engine.load_checkpoint()`` (``RepeatingLoader`` makes it in its constructor), saves after ``STEPS_AFTER // 2``
steps and trains on (``first``); a second restart loads that checkpoint (``second``). A scenario of its own: where
the restart raises on global rank 0 alone (the release: an IndexError), the other ranks wait in the sampler's
broadcast, and only a scenario that raises ends the launch at once.
This script only records; the parent test compares and asserts. A scenario that raises records its traceback
instead.
"""

import os
import sys
from pathlib import Path

import deepspeed
import deepspeed.comm as dist
import torch
from deepspeed.runtime.dataloader import RepeatingLoader
from scenarios import ONE_EPOCH, SEED, SEVERAL_CLUSTERS, SINGLE_CLUSTER, with_index_to_sample  # next to this script

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root, for tests.rank_worker
from tests.rank_worker import run_scenarios, use_forkserver  # noqa: E402

MICRO_BATCH = 2
GRADIENT_ACCUMULATION = 2
# Optimizer steps after which the run saves a checkpoint. Up to the first no cluster is reshuffled yet; by the last
# the run passed an epoch, a reshuffle of every scenario's clusters and (several_clusters) two new clusters. With
# workers (several_clusters, 1 and 2 ranks) the last is in a prefetch window before a reshuffle: the workers have
# drawn micro-batches from a reshuffled cluster that training has not reached (test_engine_resume checks it).
SAVE_AT = (3, 8, 14)
STEPS_AFTER = 6  # optimizer steps each restart trains
# name: (difficulty metric, data_sampling.num_workers)
SCENARIOS = {
    "single_cluster": (SINGLE_CLUSTER, 0),
    "several_clusters": (SEVERAL_CLUSTERS, 0),
    "several_clusters-num_workers2": (SEVERAL_CLUSTERS, 2),
    "several_clusters-num_workers2-iterator_before_load": (SEVERAL_CLUSTERS, 2),
}
ITERATOR_BEFORE_LOAD = "-iterator_before_load"


def engine_for(metric, num_workers, cluster_dir):
    root = os.path.dirname(cluster_dir)
    if dist.get_rank() == 0:  # writes the index_to_sample map (once) for every rank
        os.makedirs(root, exist_ok=True)
        with_index_to_sample(metric, root)
    dist.barrier()
    metric = with_index_to_sample(metric, root)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GRADIENT_ACCUMULATION,
        "steps_per_print": 10**6,
        "data_efficiency": {
            "enabled": True,
            "seed": SEED,
            "data_sampling": {
                "enabled": True,
                "num_epochs": 10,
                "num_workers": num_workers,
                "curriculum_learning": {
                    "enabled": True,
                    "data_cluster_path": cluster_dir,
                    "curriculum_metrics": {"difficulty": metric},
                },
            },
        },
    }
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    dataset = [torch.tensor([float(i)]) for i in range(ONE_EPOCH)]
    engine, _, loader, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), training_data=dataset, config=config
    )
    return engine, loader


def observe(engine, loader):
    """Per micro-batch training takes from now on: the ``consumed_samples`` that ``post_process_func`` receives and
    the sampler's reshuffles so far (lists, filled as the engine trains)."""
    seen = {"consumed": [], "reshuffles": []}
    reshuffles = []
    sampler = loader.data_sampler
    original = sampler.reshuffle_clusters

    def counting_reshuffle(cidx):
        reshuffles.append(cidx)
        original(cidx)

    def post_process(data, state):
        seen["consumed"].append(state["consumed_samples"])
        seen["reshuffles"].append(len(reshuffles))
        return data

    sampler.reshuffle_clusters = counting_reshuffle  # an instance attribute: the sampler calls self.reshuffle_...
    engine.set_data_post_process_func(post_process)
    return seen


def train(engine, batches, steps):
    """``steps`` optimizer steps on the iterator ``batches``; returns the sample ids of every micro-batch."""
    seen = []
    for _ in range(steps * GRADIENT_ACCUMULATION):
        batch = next(batches)
        seen.append([int(i) for i in batch[:, 0]])
        loss = engine(batch).pow(2).mean()
        engine.backward(loss)
        engine.step()
    return seen


def stop_workers(loader):
    """Drop the loader's DataLoader iterator, so that its workers (``data_sampling.num_workers``) stop now.

    Left to the garbage collector with the engine's reference cycles, the iterator's queues can be finalized before
    the iterator, which then waits torch's 5 s ``MP_STATUS_CHECK_INTERVAL`` for each worker that never hears it stop.
    """
    loader.data_iterator = None


def scenario(out_dir, name):
    metric, num_workers = SCENARIOS[name]
    if name.endswith(ITERATOR_BEFORE_LOAD):
        return restart_with_iterator_before_load(metric, os.path.join(out_dir, name[: -len(ITERATOR_BEFORE_LOAD)]))
    root = os.path.join(out_dir, name)
    engine, loader = engine_for(metric, num_workers, os.path.join(root, "clusters-uninterrupted"))
    consumed = {"uninterrupted": observe(engine, loader)["consumed"], "resumed": {}}
    uninterrupted = train(engine, iter(loader), SAVE_AT[-1] + STEPS_AFTER)
    stop_workers(loader)

    cluster_dir = os.path.join(root, "clusters")
    checkpoints = os.path.join(root, "checkpoints")
    engine, loader = engine_for(metric, num_workers, cluster_dir)
    died_seen = observe(engine, loader)
    batches, died, done = iter(loader), [], 0
    for step in SAVE_AT:
        died += train(engine, batches, step - done)
        engine.save_checkpoint(checkpoints, tag=f"step{step}")
        done = step
    stop_workers(loader)
    del engine, loader, batches  # the run dies right after its last checkpoint

    resumed = {}
    for step in reversed(SAVE_AT):  # a restarted job loads its last checkpoint; the user may go back further
        engine, loader = engine_for(metric, num_workers, cluster_dir)
        engine.load_checkpoint(checkpoints, tag=f"step{step}")
        consumed["resumed"][str(step)] = observe(engine, loader)["consumed"]
        resumed[str(step)] = train(engine, iter(loader), STEPS_AFTER)
        stop_workers(loader)
    return {
        "uninterrupted": uninterrupted,
        "died": died,
        "resumed": resumed,
        "consumed": consumed,
        "died_reshuffles": died_seen["reshuffles"],
        "num_workers": num_workers,
        "gradient_accumulation": GRADIENT_ACCUMULATION,
    }


def restart_with_iterator_before_load(metric, root):
    """The restart from the last checkpoint of the scenario run in ``root`` whose iterator is made before
    ``engine.load_checkpoint()``; it saves after ``STEPS_AFTER // 2`` steps, trains on to ``STEPS_AFTER`` and dies; a
    second restart loads that checkpoint and makes its iterator after the load."""
    cluster_dir, checkpoints = os.path.join(root, "clusters"), os.path.join(root, "checkpoints")
    saved_after = STEPS_AFTER // 2
    engine, loader = engine_for(metric, 2, cluster_dir)
    batches = RepeatingLoader(loader)  # its workers prefetch from the fresh sampler
    engine.load_checkpoint(checkpoints, tag=f"step{SAVE_AT[-1]}")
    first = train(engine, batches, saved_after)
    engine.save_checkpoint(checkpoints, tag="iterator-before-load")
    first += train(engine, batches, STEPS_AFTER - saved_after)
    stop_workers(loader)
    engine, loader = engine_for(metric, 2, cluster_dir)
    engine.load_checkpoint(checkpoints, tag="iterator-before-load")
    second = train(engine, iter(loader), STEPS_AFTER - saved_after)
    stop_workers(loader)
    return {"step": SAVE_AT[-1], "saved_after": saved_after, "first": first, "second": second}


def main():
    out_dir, wanted = sys.argv[1], sys.argv[2:] or list(SCENARIOS)
    # Collectives go through torch.distributed's Gloo, as DeepSpeed does where its shared-memory op is not
    # compatible (deepspeed/comm/torch.py build_shm_op): on Linux that op would be compiled at the first
    # init_distributed, minutes of C++ build that add nothing to what these tests check.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    # the DataLoader workers of num_workers2 (gh-112275); the modules this script imports
    use_forkserver(["torch", "deepspeed", "deepspeed.comm", "scenarios", "tests.rank_worker"])
    deepspeed.init_distributed("gloo")
    run_scenarios(
        out_dir,
        wanted,
        dist.get_rank(),
        lambda name: scenario(out_dir, name),
        world_size=dist.get_world_size(),
        deepspeed=deepspeed.__file__,
    )
    dist.barrier()


if __name__ == "__main__":
    main()
