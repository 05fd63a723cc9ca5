"""One rank of the DeepSpeed history search: a curriculum-sampling training job that takes its steps one at a time.

Launched by ``scripts/histories/servers.py`` (``DS_ACCELERATOR=cpu``; 2 ranks by ``scripts/ranks.py``, one as
``python deepspeed_job.py``) with the code of one side first on ``sys.path``, and served as
``tests/histories/server.py`` says: the subject and the uninterrupted model, each with its own random states and its
own ``data_cluster_path``. The job is the flow table's (``tests/flows/deepspeed_job.py``: ``engine_for``, ``train``):
``deepspeed.initialize(training_data=...)`` with ``DeepSpeedDataSampler`` over 32 samples. Steps:

- ``train`` (data): ``k`` optimizer steps, the sample ids of every micro-batch;
- ``save``: ``how`` = ``engine`` (``save_checkpoint(tag=folder)``) or ``sampler`` (the sampler's ``state_dict()`` in
  the user's own file, ``torch.save``), whose ``np_rng_state`` is written in a ``shape``: ``native`` (as the code under
  test writes it); ``pr8406``: the sampler generator's ``bit_generator.state`` there in place of the code's own key
  (as the open DeepSpeed PR #8406 writes it on 0.19.8, and as the code under test would on top of it); ``legacy``:
  0.19.8's keys, numpy's global ``RandomState`` tuple there (as 0.19.8 writes it);
- ``keep_last``: the saved folders before the last k deleted (``folders``), as a job that keeps its last k does;
- ``break_loop``: the subject's training loop is left by ``break``; its next ``train`` iterates the loader again (with
  io workers the iterator left behind has fetched micro-batches ahead);
- ``restart``: a new engine on the subject's ``data_cluster_path`` (``iterator_first``: the training iterator,
  ``RepeatingLoader``, built before the load, as the pipeline engine does), then ``load_checkpoint(tag=folder)``
  (``module_only``: with ``load_module_only=True``, so the data begins again) or ``load_state_dict()`` of the file,
  with what it logged and raised.

The configuration's ``parallel`` (two ranks; ``data`` when absent): ``data``-parallel ranks, or an ``mpu`` of
tensor-parallel size 2, each rank a data-parallel group of its own, with rank 0 reading and broadcasting each
micro-batch (``tensor``) or each rank reading its own loader (``tensor-each``), or a 2-stage pipeline trained by
``train_batch()``, which reads its own ``RepeatingLoader`` (``pipeline``), as the flow table's job.
"""

import logging
import shutil
import sys
from pathlib import Path

import deepspeed
import numpy as np
import torch
from deepspeed.runtime.data_pipeline import constants
from deepspeed.runtime.dataloader import RepeatingLoader
from deepspeed.utils import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the kit's root
from tests.flows import deepspeed_job as flows_job  # noqa: E402
from tests.histories import server  # noqa: E402
from tests.rank_worker import said_while, stop_forkserver, use_forkserver  # noqa: E402

WARNERS = ("deepspeed",)
OLDER_KEYS = [getattr(constants, f"CURRICULUM_LEARNING_{name}") for name in (  # what 0.19.8's state_dict() holds
    "BATCH", "CONSUMED_SAMPLES", "STEP", "CURRENT_DIFFICULTIES", "DATA_CLUSTER_PATHS",
    "DATA_CLUSTER_CURRENT_POSITION")]
# where the code under test saves the sampler generator's state (the stack; 0.19.8 has no such key)
GENERATOR_KEY = getattr(constants, "CURRICULUM_LEARNING_NP_RNG_BIT_GENERATOR_STATE", None)


class Job:
    """One training job: its engine, the loader's iterator, and (while the other job runs) its random states."""

    def __init__(self, config, rank, name):
        self.rank = rank
        self.factors = {"clusters": config["clusters"], "workers": config["workers"],
                        "parallel": config.get("parallel", "data")}
        clusters = Path(rank.root) / ("clusters" if name == "subject" else "clusters-model")
        if name == "subject":  # the model reads what the job reads alone
            flows_job.other_experiment(self.factors, rank.root, clusters)
        self.engine, self.loader = flows_job.engine_for(self.factors, rank.root, clusters)
        self.batches = None

    def close(self):
        flows_job.stop(self.loader)
        flows_job.LOADERS.remove(self.loader)
        self.engine = self.loader = self.batches = None

    def data_step(self, op, args):
        if self.batches is None:  # None again on a tensor-parallel rank that reads no loader
            self.batches = flows_job.batches_of(self.factors, self.loader)
        return {"batches": flows_job.train(self.factors, self.engine, self.batches, args["k"]), "ended": False}


class Rank(server.Rank):
    """The DeepSpeed operations of this rank."""

    def checkpoints(self):
        return Path(self.root) / "checkpoints"

    def sampler_file(self, folder):
        return self.checkpoints() / folder / f"sampler_rank{self.rank}.pt"

    def save(self, job, how, folder, shape):
        if how == "engine":
            job.engine.save_checkpoint(str(self.checkpoints()), tag=folder)
        else:
            sampler = job.loader.data_sampler
            state = sampler.state_dict()
            if shape == "pr8406":  # the generator's state under np_rng_state, as #8406 writes it on 0.19.8, and as
                # the code under test writes it on top of #8406 (its state of what training consumed, in place of its
                # own key; its other keys kept: they go with its cluster files, which it does not rewrite)
                state[constants.CURRICULUM_LEARNING_NP_RNG_STATE] = state.pop(GENERATOR_KEY,
                                                                              sampler.np_rng.bit_generator.state)
            elif shape == "legacy":  # the keys 0.19.8 writes, numpy's global RandomState under np_rng_state
                state = {key: state[key] for key in OLDER_KEYS}
                state[constants.CURRICULUM_LEARNING_NP_RNG_STATE] = np.random.get_state()
            path = self.sampler_file(folder)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"data_sampler": state}, path)
        self.barrier()
        return {}

    def restart(self, config, folder, how, iterator_first, module_only):
        job = self.fresh("subject", config)
        if folder is None:
            return {}
        if iterator_first and not (job.factors["parallel"] == "tensor" and self.rank != 0):  # a rank that reads
            job.batches = RepeatingLoader(job.loader)

        def load():
            if how == "engine":
                loaded, _ = job.engine.load_checkpoint(str(self.checkpoints()), tag=folder,
                                                       load_module_only=bool(module_only))
                if loaded is None:
                    raise FileNotFoundError(f"load_checkpoint() found no checkpoint {folder}")
            else:
                state = torch.load(self.sampler_file(folder), map_location="cpu", weights_only=False)
                job.loader.data_sampler.load_state_dict(state["data_sampler"])

        return said_while(load, WARNERS)

    def other(self, op, args):
        if op == "restart":
            return self.restart(args["config"], args.get("folder"), args.get("saved_how"), args.get("iterator_first"),
                                args.get("module_only"))
        if op == "keep_last":  # all but the last k saved folders deleted, as a job keeping its last k does
            if self.rank == 0:
                for folder in args["folders"]:
                    shutil.rmtree(self.checkpoints() / folder, ignore_errors=True)
            self.barrier()
            return {}
        if op == "save":
            return self.save(self.switch("subject"), args["how"], args["folder"], args.get("shape", "native"))
        if op == "break_loop":
            self.switch("subject").batches = None
            return {}
        raise ValueError(f"unknown operation {op!r}")


def main():
    logger.setLevel(logging.WARNING)
    flows_job.without_dynamo_import()
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # Gloo's collectives (tests/flows/deepspeed_job.py)
    use_forkserver(["torch", "deepspeed", "deepspeed.runtime.dataloader"])
    deepspeed.init_distributed("gloo")
    rank = Rank(torch.distributed.get_rank(), torch.distributed.get_world_size(), Job)
    server.serve(rank, deepspeed.__file__, {})
    rank.barrier()
    stop_forkserver()


if __name__ == "__main__":
    main()
