"""One rank of the model-parallel scenarios of ``test_model_parallel.py``: curriculum data sampling in a job whose
data-parallel groups are not the world.

Run by the test module as ``DS_ACCELERATOR=cpu python scripts/ranks.py 2 model_parallel_worker.py OUT_DIR
SCENARIO...``; nothing is stubbed (``deepspeed.init_distributed("gloo")``, real collectives). Two ranks, data-parallel
size 1: each rank is a data-parallel group of its own, {0} and {1}, as in a Megatron-style job with tensor-parallel
size 2 or a DeepSpeed pipeline of 2 stages. Scenarios:

- ``tensor-rank0-only``: an ``mpu`` of tensor-parallel size 2 passed to ``deepspeed.initialize()``, ``training_data``
  on rank 0 only (Megatron-DeepSpeed's ``training.py`` without a pipeline); rank 0 reads the DeepSpeed loader and
  broadcasts each micro-batch to rank 1 over the tensor-parallel group (Megatron's ``broadcast_data``);
- ``tensor-rank0-reads``: the same with ``training_data`` on both ranks (Megatron-LM's datasets built on every rank):
  rank 1 never reads its own loader;
- ``tensor-each-reads``: the same ``mpu``, each rank reads its own loader;
- ``pipeline``: a 2-stage ``PipelineModule`` (the pipeline engine's own grid), ``engine.train_batch()``; rank 0, the
  first stage, records the inputs it trains on (a forward pre-hook), rank 1 the labels the last stage reads.

Each scenario records the micro-batches (sample ids) of an uninterrupted run of ``STEPS`` optimizer steps
(``uninterrupted``), of a run that saves a checkpoint after step ``SAVE_AT`` and dies (``died``) and of a new engine
that loads it and trains to step ``STEPS`` (``resumed``), and the curriculum sampler's state right after the save
(``saved``) and right after the load (``loaded``), the keys ``STATE_KEYS``. Sample ``i`` is the tensor ``[i]``.
This script only records; the parent test compares.
"""

import json
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root, for tests.rank_worker
from tests.deepspeed.mpu import TensorParallelMPU  # noqa: E402
from tests.rank_worker import run_scenarios  # noqa: E402

NUM_SAMPLES = 32
MICRO_BATCH = 4
GAS = 2
STEPS = 6  # past the single cluster's first reshuffle (a pass is 4 steps)
SAVE_AT = 3
STATE_KEYS = ("batch", "consumed_samples", "curriculum_step", "current_difficulties", "data_cluster_paths",
              "data_cluster_current_position")
METRIC = {"clustering_type": "single_cluster", "difficulty_type": "value", "min_difficulty": 1, "max_difficulty": 3,
          "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [1, 2, 3], "max_step": [3, 6]}}


def config(cluster_path):
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GAS,
        "steps_per_print": 10**6,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "data_efficiency": {"enabled": True, "seed": 1234, "data_sampling": {
            "enabled": True, "num_epochs": 10, "num_workers": 0,
            "curriculum_learning": {"enabled": True, "data_cluster_path": str(cluster_path),
                                    "curriculum_metrics": {"difficulty": METRIC}}}},
    }


class Job:
    """One engine of a scenario and the way its ranks read: ``train(steps)`` returns the micro-batches this rank
    trained on."""

    def __init__(self, scenario, mpu, cluster_path):
        self.scenario, self.mpu, self.seen = scenario, mpu, []
        torch.manual_seed(0)
        if scenario == "pipeline":
            module = PipelineModule(layers=[LayerSpec(torch.nn.Linear, 1, 1), LayerSpec(torch.nn.Linear, 1, 1)],
                                    num_stages=2, loss_fn=self.recording_loss)
            data = [(torch.tensor([float(i)]), torch.tensor([float(i)])) for i in range(NUM_SAMPLES)]
            self.engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                                        config=config(cluster_path), training_data=data)
            if dist.get_rank() == 0:
                module.forward_funcs[0].register_forward_pre_hook(lambda _, args: self.record(args[0]))
            self.loader = self.engine.training_dataloader.loader  # inside the pipeline's RepeatingLoader
            return
        model = torch.nn.Linear(1, 1)
        data = [torch.tensor([float(i)]) for i in range(NUM_SAMPLES)]
        if scenario == "tensor-rank0-only" and dist.get_rank() != 0:
            data = None
        self.engine, _, self.loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                              config=config(cluster_path), training_data=data,
                                                              mpu=mpu)
        self.batches = None

    def record(self, batch):
        self.seen.append([int(i) for i in batch.flatten()])

    def recording_loss(self, output, labels):
        if dist.get_rank() == 1:  # the last stage: the labels it reads from its own loader
            self.record(labels)
        return torch.nn.functional.mse_loss(output, labels)

    def train(self, steps):
        start = len(self.seen)
        if self.scenario == "pipeline":
            for _ in range(steps):
                self.engine.train_batch()
            return self.seen[start:]
        reads = self.scenario == "tensor-each-reads" or dist.get_rank() == 0
        if reads and self.batches is None:
            self.batches = iter(self.loader)
        for _ in range(steps * GAS):
            batch = next(self.batches) if reads else torch.empty(MICRO_BATCH, 1)
            if self.scenario != "tensor-each-reads":
                dist.broadcast(batch, 0, group=self.mpu.get_tensor_model_parallel_group())
            self.record(batch)
            self.engine.backward(self.engine(batch).pow(2).mean())
            self.engine.step()
        return self.seen[start:]

    def sampler_state(self):
        # As JSON holds it: 0.19.8 keeps numpy integers in some of these keys. None: this rank has no loader.
        if self.loader is None:
            return None
        state = self.loader.data_sampler.state_dict()
        return json.loads(json.dumps({key: state[key] for key in STATE_KEYS}, default=lambda value: value.tolist()))


def scenario(out_dir, name):
    folder = Path(out_dir) / name
    mpu = TensorParallelMPU() if name != "pipeline" else None
    uninterrupted = Job(name, mpu, folder / "clusters-uninterrupted").train(STEPS)
    job = Job(name, mpu, folder / "clusters")
    died = job.train(SAVE_AT)
    job.engine.save_checkpoint(str(folder / "checkpoints"), tag=f"step{SAVE_AT}")
    saved = job.sampler_state()
    restarted = Job(name, mpu, folder / "clusters")
    restarted.engine.load_checkpoint(str(folder / "checkpoints"), tag=f"step{SAVE_AT}")
    loaded = restarted.sampler_state()
    resumed = restarted.train(STEPS - SAVE_AT)
    return {"uninterrupted": uninterrupted, "died": died, "resumed": resumed, "saved": saved, "loaded": loaded,
            "gradient_accumulation": GAS}


def main():
    out_dir, names = sys.argv[1], sys.argv[2:]
    # Collectives through torch.distributed's Gloo: no shared-memory op compiled (tests/deepspeed/engine_worker.py)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed("gloo")
    run_scenarios(out_dir, names, dist.get_rank(), lambda name: scenario(out_dir, name),
                  world_size=dist.get_world_size(), module=deepspeed.__file__)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
