"""One rank of the DeepSpeed flows: training jobs with curriculum data sampling that checkpoint, crash and restart.

Run by ``scripts/flows`` as a job server (``scripts/servers.py``: ``python scripts/ranks.py N deepspeed_job.py``, the
environment torch.distributed.run would give each rank; one process: ``python deepspeed_job.py`` with that
environment; ``DS_ACCELERATOR=cpu``) with the code of one side on ``sys.path`` (the release's tree first, or the
series as installed). It takes plans, ``{"out", "task_timeout", "tasks": [...]}`` (``tests/flows/tasks.py``);
each task writes ``<out>/<flow>.<column>.<part>.rank<N>.json``.

The job: ``deepspeed.initialize(training_data=...)`` over ``NUM_SAMPLES`` samples (sample ``i`` is the tensor
``[i]``, so a micro-batch tells which samples it holds) with ``data_efficiency`` curriculum sampling
(``DeepSpeedDataSampler``), ``GLOBAL_MICRO_BATCH`` samples a micro-batch across the data-parallel ranks, gradient
accumulation ``GAS``, a tiny linear model trained by SGD; ``STEPS`` optimizer steps uninterrupted. ``parallel``: the
ranks are data-parallel (``data``), or each rank is a data-parallel group of its own, {0} and {1}: an ``mpu`` of
tensor-parallel size 2 with rank 0 reading the loader and broadcasting each micro-batch to rank 1 over the
tensor-parallel group (``tensor``, Megatron's ``broadcast_data``; rank 1 has a loader it never reads) or each rank
reading its own (``tensor-each``), or a 2-stage ``PipelineModule`` trained by ``train_batch()`` (``pipeline``: rank 0
records the inputs of the first stage, rank 1 the labels of the last). The saving run checkpoints after
steps 1 .. k (``keep`` ``last-2``: 1 .. k + 1, deleting all but the last two), trains on to step m (``CHECKPOINTS``:
k and m per ``clusters`` and ``checkpoint``) and dies there. The restart is a new engine in this process with the
saving run's ``data_cluster_path``; it loads step k (the newest checkpoint, or with ``last-2`` the older one kept, as a
job whose newest checkpoint is incomplete falls back to) and trains to step ``STEPS``. With ``clusters``
``shared-path`` another experiment used the saving run's ``data_cluster_path`` first (``other_experiment``); the
uninterrupted run's path is its own, so it reads what the job reads alone. Parts:

- ``save``: ``truth`` (the uninterrupted run's micro-batches, one "epoch": a curriculum run is no permutation per
  epoch, so ``partition`` is false), ``step`` (the micro-batch the restart goes on from: k times ``GAS``; 0 for
  ``module-only``, whose restart begins the data again), ``before`` / ``after`` the checkpoint up to the crash.
- ``load``: ``loops``: [the restart's micro-batches up to step ``STEPS``]; a raise before the first micro-batch is
  recorded as ``error`` (after every rank agrees), after it as ``crash`` (with 2 ranks the rank then ends; one rank
  goes on with its next task).
- ``order``: ``run``: the uninterrupted run.

A task that hangs or crashes is recorded as ``tests/flows/tasks.py`` says, and the runner launches the
tasks left. This script records; ``scripts/flows/judge.py`` judges.
"""

import logging
import os
import shutil
import sys
from pathlib import Path

import deepspeed
import numpy as np
import torch
import torch._compile
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.data_pipeline.data_sampling.utils import close_mmap_dataset_builder, create_mmap_dataset_builder
from deepspeed.runtime.dataloader import RepeatingLoader
from deepspeed.utils import groups, logger

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root, for tests.rank_worker
from tests.deepspeed.mpu import TensorParallelMPU  # noqa: E402
from tests.flows.tasks import serve_plans  # noqa: E402
from tests.rank_worker import said_while, stop_forkserver, use_forkserver  # noqa: E402

NUM_SAMPLES = 32
GLOBAL_MICRO_BATCH = 4  # samples of one micro-batch across the data-parallel ranks (2 ranks: 2 each)
GAS = 2  # gradient accumulation steps: a global batch of 8, one curriculum step, for 1 and 2 ranks alike
STEPS = 12  # optimizer steps of the uninterrupted run: past a cluster's second reshuffle in every ``clusters``
EPOCH_STEPS = 3  # ``path`` ``epoch-loop``: the optimizer steps of the loop's epoch
SEED = 1234

# Difficulty metrics (data_efficiency.data_sampling.curriculum_learning.curriculum_metrics). ``index`` names the
# data analyzer's index_to_sample map a metric reads (``write_index``: 8 rows of 4 sample ids, a fixed permutation).
SINGLE = {"clustering_type": "single_cluster", "difficulty_type": "value", "min_difficulty": 1, "max_difficulty": 3,
          "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [1, 2, 3], "max_step": [3, 6]}}
QUARTILES = {"clustering_type": "schedule_based", "difficulty_type": "percentile", "min_difficulty": 2,
             "max_difficulty": 4, "schedule_type": "fixed_discrete",
             "schedule_config": {"difficulty": [2, 3, 4], "max_step": [3, 6]}}
SECOND = {**QUARTILES, "min_difficulty": 3, "schedule_config": {"difficulty": [3, 4], "max_step": [5]}}
# ``shared-path``: a value-based metric (a sequence length: ``ROW_VALUES``, one a row of the index) with a fixed_linear
# schedule of difficulty_step 8: clusters of 16 samples (difficulty 8), 8 (24) and 8 (40); the difficulties 16, 32
# and 48 add none. The other experiment, difficulty_step 16, writes clusters of the names of 16 and 32.
ROW_VALUES = (4, 4, 4, 4, 20, 20, 40, 40)
BY_LENGTH = {"clustering_type": "schedule_based", "difficulty_type": "value", "min_difficulty": 8,
             "max_difficulty": 48, "schedule_type": "fixed_linear",
             "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}
OTHER_EXPERIMENT = {**BY_LENGTH, "min_difficulty": 16, "max_difficulty": 32,
                    "schedule_config": {"total_curriculum_step": 2, "difficulty_step": 16}}
METRICS = {
    "single": {"difficulty": (SINGLE, None)},  # one cluster of all 32 samples
    "schedule": {"difficulty": (QUARTILES, 0)},  # 16 samples from step 1, 8 more from step 4, the last 8 from step 7
    "two-metrics": {"difficulty": (QUARTILES, 0), "length": (SECOND, 1)},  # clusters of 14, 5, 5 and 8 samples
    "shared-path": {"length": (BY_LENGTH, 2)},  # 16 samples from step 1, 8 more from step 3, the last 8 from step 5
    "other-experiment": {"length": (OTHER_EXPERIMENT, 2)},  # what ``other_experiment`` runs first (not a level)
}
# (k, m): the optimizer step of the checkpoint the restart loads, and the step the saving run dies at. The sampler
# reshuffles a cluster at steps 5 and 9 (single), 3, 5, 6, 8, 9, 11 (schedule), 2, 5, 7, 7, 9, 10, 11, 11, 12
# (two-metrics): ``early`` is before the first reshuffle, ``late`` after some; the saving run reshuffles between k and
# m in both (with 0.19.8 it rewrites the cluster files the checkpoint names).
CHECKPOINTS = {
    "single": {"early": (2, 5), "late": (7, 10)},
    "schedule": {"early": (2, 5), "late": (7, 10)},
    "two-metrics": {"early": (1, 4), "late": (7, 10)},
    "shared-path": {"early": (2, 5), "late": (7, 10)},
}
DATASET = [torch.tensor([float(i)]) for i in range(NUM_SAMPLES)]
PAIRS = [(x, x) for x in DATASET]  # a pipeline's (input, label)


class PlainSGD(torch.optim.Optimizer):
    """SGD without momentum, its step plain Python: torch's own optimizers import ``torch._dynamo`` at their first
    step (``torch/optim/optimizer.py`` ``_use_grad``), a second of CPU per rank that adds nothing to these flows."""

    def __init__(self, params, lr=0.01):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.add_(param.grad, alpha=-group["lr"])


def without_dynamo_import():
    """Let the methods of ``torch.optim.Optimizer`` that torch wraps with ``torch._disable_dynamo`` run without
    importing ``torch._dynamo``: the wrapper imports it at the first call to disable compilation of the method, and
    caches the result on the method (``__dynamo_disable``); outside ``torch.compile`` the disabled method is the method
    itself, which is cached here instead."""
    wrapper_code = torch._compile._disable_dynamo(lambda: None).__code__
    for value in vars(torch.optim.Optimizer).values():
        wrapped = getattr(value, "__wrapped__", None)
        if wrapped is not None and getattr(value, "__code__", None) is wrapper_code:
            wrapped.__dynamo_disable = wrapped


def world():
    return dist.get_world_size() if dist.is_initialized() else 1


def parallel(factors):
    return factors.get("parallel", "data")


MPU = []  # this rank's TensorParallelMPU, made at the first tensor-parallel task


def mpu():
    if not MPU:
        MPU.append(TensorParallelMPU())
    return MPU[0]


def barrier():
    if world() > 1:
        dist.barrier()


def write_index(folder, seed, rows=None):
    """The index_to_sample map of a metric under ``folder`` (global rank 0 writes it once), or with ``rows`` (a value
    a row) its index_to_metric map; returns its path."""
    path = os.path.join(folder, f"index_to_{'sample' if rows is None else 'metric'}{seed}")
    if dist.get_rank() == 0 and not os.path.exists(path + ".idx"):
        os.makedirs(folder, exist_ok=True)
        builder = create_mmap_dataset_builder(path, np.uint8)
        if rows is None:
            rows = np.split(np.random.default_rng(seed).permutation(NUM_SAMPLES), 8)
        for row in rows:
            builder.add_item_numpy(np.asarray(row).reshape(-1))
        close_mmap_dataset_builder(builder, path)
    return path


def paths_of(metric, folder, seed):
    """The index maps ``metric`` reads, written under ``folder``."""
    if seed is None:
        return {}
    paths = {"index_to_sample_path": write_index(folder, seed)}
    if metric["difficulty_type"] == "value":
        paths["index_to_metric_path"] = write_index(folder, seed, ROW_VALUES)
    return paths


def other_experiment(factors, folder, clusters):
    """``clusters`` ``shared-path``: before a job's first run on ``clusters``, another experiment trains there (its
    difficulty_step 16) and leaves its cluster files, as experiments that name data_cluster_path without the step do.
    Not again on a path that exists (a restart)."""
    if factors["clusters"] != "shared-path":
        return
    used = clusters.exists()
    barrier()  # every rank looked before the sampler makes it
    if not used:
        engine, loader = engine_for({**factors, "clusters": "other-experiment"}, folder, clusters)
        train(factors, engine, batches_of({**factors, "path": "engine"}, loader), 2)
        stop(loader)
        LOADERS.remove(loader)


def engine_for(factors, folder, clusters):
    """A new engine and its training DataLoader (``DeepSpeedDataLoader``), the curriculum's cluster files under
    ``clusters``."""
    metrics = {}
    for name, (metric, seed) in METRICS[factors["clusters"]].items():
        metrics[name] = {**metric, **paths_of(metric, folder, seed)}
    barrier()  # the maps are written
    config = {
        "train_micro_batch_size_per_gpu": GLOBAL_MICRO_BATCH // (world() if parallel(factors) == "data" else 1),
        "gradient_accumulation_steps": GAS,
        "steps_per_print": 10**6,
        "data_efficiency": {
            "enabled": True,
            "seed": SEED,
            "data_sampling": {
                "enabled": True,
                "num_epochs": 10,
                "num_workers": int(factors["workers"]),
                "curriculum_learning": {"enabled": True, "data_cluster_path": str(clusters),
                                        "curriculum_metrics": metrics},
            },
        },
    }
    torch.manual_seed(0)
    # A new job in this process: DeepSpeed keeps the last engine's mpu (a tensor-parallel flow's, or a pipeline's
    # grid) in deepspeed.utils.groups, where an engine built without one would take its groups.
    groups.mpu = None
    if parallel(factors) == "pipeline":
        seen = []
        module = PipelineModule(layers=[LayerSpec(torch.nn.Linear, 1, 1), LayerSpec(torch.nn.Linear, 1, 1)],
                                num_stages=2, loss_fn=recording_loss(seen))
        if dist.get_rank() == 0:  # the first stage: the inputs it trains on
            module.forward_funcs[0].register_forward_pre_hook(lambda _, args: seen.append(ids(args[0])))
        engine, _, _, _ = deepspeed.initialize(model=module, optimizer=PlainSGD(module.parameters()),
                                               training_data=PAIRS, config=config)
        engine.kit_seen = seen
        loader = engine.training_dataloader.loader  # the DeepSpeedDataLoader in the pipeline's RepeatingLoader
    else:
        model = torch.nn.Linear(1, 1)
        tensor = parallel(factors).startswith("tensor")
        engine, _, loader, _ = deepspeed.initialize(model=model, optimizer=PlainSGD(model.parameters()),
                                                    training_data=DATASET, config=config,
                                                    mpu=mpu() if tensor else None)
    LOADERS.append(loader)
    return engine, loader


def ids(batch):
    return [int(i) for i in batch.flatten()]


def recording_loss(seen):
    """The pipeline's loss: on the last stage (rank 1) it also records the labels that stage read."""

    def loss(output, labels):
        if dist.get_rank() == 1:
            seen.append(ids(labels))
        return torch.nn.functional.mse_loss(output, labels)

    return loss


def batches_of(factors, loader, start=0):
    """The iterator training reads: ``iterator-first`` builds ``RepeatingLoader(loader)`` (as the pipeline engine
    does, ``deepspeed/runtime/pipe/engine.py`` ``_build_data_iter``), ``epoch-loop`` an ``epoch_loop`` from micro-batch
    ``start``, the others ``iter(loader)``; None where the rank reads none (the pipeline engine reads its own
    RepeatingLoader, made when it was built; ``tensor``: rank 1 receives rank 0's micro-batches, as Megatron makes a
    data iterator on tensor-parallel rank 0 only)."""
    if parallel(factors) == "pipeline" or (parallel(factors) == "tensor" and dist.get_rank() != 0):
        return None
    if factors.get("path") == "epoch-loop":
        return epoch_loop(loader, start)
    return RepeatingLoader(loader) if factors.get("path") == "iterator-first" else iter(loader)


def epoch_loop(loader, start):
    """The micro-batches of a training loop that counts epochs of ``EPOCH_STEPS`` optimizer steps: ``for batch in
    loader``, left by ``break`` at each epoch's end and begun again (with io workers the iterator it leaves has fetched
    micro-batches ahead); ``start``: the micro-batches the job read before (a restart's)."""
    read = start
    while True:
        for batch in loader:
            yield batch
            read += 1
            if read % (EPOCH_STEPS * GAS) == 0:
                break


def train(factors, engine, batches, steps):
    """``steps`` optimizer steps on ``batches`` (the pipeline reads its own); the sample ids of every micro-batch this
    rank trained on."""
    if parallel(factors) == "pipeline":
        start = len(engine.kit_seen)
        for _ in range(steps):
            engine.train_batch()
        return engine.kit_seen[start:]
    seen = []
    for _ in range(steps * GAS):
        batch = next(batches) if batches is not None else torch.empty(GLOBAL_MICRO_BATCH, 1)
        if parallel(factors) == "tensor":
            dist.broadcast(batch, 0, group=mpu().tensor_group)
        seen.append(ids(batch))
        engine.backward(engine(batch).pow(2).mean())
        engine.step()
    return seen


def stop(loader):
    """Drop the loader's DataLoader iterator, so that its workers stop now (as tests/deepspeed/engine_worker.py):
    left to the garbage collector, it can wait 5 s for each worker."""
    loader.data_iterator = None


LOADERS = []  # the loaders of the running task: stopped after it, also when it raised


TRUTHS = {}  # the uninterrupted runs of this launch (one code, one number of ranks), per workers, clusters, parallel


def truth_of(factors, folder):
    key = (factors["workers"], factors["clusters"], parallel(factors))
    if key not in TRUTHS:
        engine, loader = engine_for(factors, folder, Path(folder) / "clusters-uninterrupted")
        TRUTHS[key] = train(factors, engine, batches_of({**factors, "path": "engine"}, loader), STEPS)
        stop(loader)
    return TRUTHS[key]


def sampler_file(checkpoints, step):
    return Path(checkpoints) / f"step{step}" / f"sampler_rank{dist.get_rank()}.pt"


def save(factors, engine, loader, checkpoints, step):
    """Checkpoint after optimizer step ``step`` the way the flow's ``path`` does, then delete all but the last two
    checkpoints where ``keep`` says so."""
    if factors["path"] in ("sampler", "weights-only"):  # the user's own checkpoint of the sampler's state
        path = sampler_file(checkpoints, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"data_sampler": loader.data_sampler.state_dict(), "step": step}, path)
    else:
        engine.save_checkpoint(str(checkpoints), tag=f"step{step}")
    barrier()
    if factors["keep"] == "last-2" and dist.get_rank() == 0 and step > 2:
        shutil.rmtree(Path(checkpoints) / f"step{step - 2}")


def restore(factors, engine, loader, checkpoints, step):
    """Load the checkpoint of step ``step`` into the restarted job the way the flow's ``path`` does: the newest
    (``keep`` ``all``: the engine's ``latest``), or the older one kept (``last-2``: by its tag)."""
    path, tag = factors["path"], (None if factors["keep"] == "all" else f"step{step}")
    if path in ("sampler", "weights-only"):
        if tag is None:  # the newest checkpoint on disk
            step = max(int(p.name[len("step"):]) for p in Path(checkpoints).iterdir())
        # "weights-only": torch.load's default since torch 2.6, as DeepSpeed's Fast and Decoupled checkpoint engines
        # load (the input c24 handed to the project); "sampler": weights_only=False, as its default torch checkpoint
        # engine does
        options = {} if path == "weights-only" else {"weights_only": False}
        state = torch.load(sampler_file(checkpoints, step), map_location="cpu", **options)
        loader.data_sampler.load_state_dict(state["data_sampler"])
        return
    options = {"module-only": {"load_module_only": True}, "no-optimizer": {"load_optimizer_states": False}}
    loaded, _ = engine.load_checkpoint(str(checkpoints), tag=tag, **options.get(path, {}))
    if loaded is None:
        raise FileNotFoundError(f"load_checkpoint() found no checkpoint in {checkpoints} (tag {tag})")


def save_part(factors, folder):
    """The uninterrupted job, then the job that checkpoints and dies (see the module's docstring)."""
    k, m = CHECKPOINTS[factors["clusters"]][factors["checkpoint"]]
    truth = truth_of(factors, folder)
    other_experiment(factors, folder, Path(folder) / "clusters")
    engine, loader = engine_for(factors, folder, Path(folder) / "clusters")
    batches, read, done = batches_of(factors, loader), [], 0
    for step in range(1, k + (2 if factors["keep"] == "last-2" else 1)):
        read += train(factors, engine, batches, step - done)
        save(factors, engine, loader, Path(folder) / "checkpoints", step)
        done = step
    read += train(factors, engine, batches, m - done)
    stop(loader)
    return {"truth": [truth], "epoch": 0, "step": 0 if factors["path"] == "module-only" else k * GAS, "at_end": False,
            "partition": False, "before": read[:k * GAS], "after": read[k * GAS:], "checkpoint_step": k,
            "crash_step": m, "saving_run_ends": m * GAS}


def load_part(factors, folder):
    """The restarted job (see the module's docstring)."""
    k, _ = CHECKPOINTS[factors["clusters"]][factors["checkpoint"]]
    engine, loader = engine_for(factors, folder, Path(folder) / "clusters")
    start = 0 if factors["path"] == "module-only" else k * GAS
    batches = batches_of(factors, loader, start) if factors["path"] == "iterator-first" else None
    said = said_while(lambda: restore(factors, engine, loader, Path(folder) / "checkpoints", k), ("deepspeed",))
    failed = said.get("error")  # a refusal: recorded, and no rank reads a batch
    failures = [failed]
    if world() > 1:
        failures = [None] * world()
        dist.all_gather_object(failures, failed)
    if any(failures):
        stop(loader)
        return {"error": failed or next(f for f in failures if f), "raised_here": failed is not None}
    if batches is None:
        batches = batches_of(factors, loader, start)
    loops = [train(factors, engine, batches, STEPS - (0 if factors["path"] == "module-only" else k))]
    stop(loader)
    return {"loops": loops, "warnings": said["warnings"]}


def run_task(task):
    """One task's record (see the module's docstring)."""
    part, factors, folder = task["part"], task["factors"], task["folder"]
    if part == "save":
        result = save_part(factors, folder)
    elif part == "load":
        result = load_part(factors, folder)
    else:
        result = {"run": truth_of(factors, folder)}
    return {**result, "world_size": world(), "module": deepspeed.__file__}


def stop_loaders():
    """Stop the loaders of the task that ended (also when it raised): their workers would run on."""
    for loader in LOADERS:
        stop(loader)
    LOADERS.clear()


def main():
    logger.setLevel(logging.WARNING)  # its warnings at load are recorded (said_while)
    without_dynamo_import()
    # Collectives through torch.distributed's Gloo, as DeepSpeed does where its shared-memory op is not compatible:
    # on Linux that op would be compiled at the first init_distributed (tests/deepspeed/engine_worker.py)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    # the DataLoader workers of the plans with io workers start from a forkserver (tests/rank_worker.py says why)
    use_forkserver(["torch", "deepspeed", "deepspeed.runtime.dataloader"])
    deepspeed.init_distributed("gloo")
    serve_plans(dist.get_rank(), world(), deepspeed.__file__, run_task, stop_loaders)
    barrier()
    stop_forkserver()  # it reaps the DataLoader workers it forked: their CPU time counts in this rank's


if __name__ == "__main__":
    main()
