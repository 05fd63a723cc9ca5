"""One measurement process of ``python -m scripts.bench``: one side (base or patched) of one upstream, one kind.

Run with the kit's venv Python, never imported by the kit: ``.venv/bin/python scripts/bench/child.py KIND
PARAMS_JSON``. Which upstream tree is measured is decided by the parent through ``PYTHONPATH`` (a work tree of
the base) or its absence (the editable install, the patched side); every result names the ``__file__`` of the
module it imported so that the parent can check. KIND is one of:

- ``accelerate``: ``Accelerator.prepare()`` of a ``DataLoader`` with ``use_stateful_dataloader=True`` in one
  process, per ``num_workers``: wall time of ``prepare()`` (s), worker processes alive right after it, wall time
  of epoch 0 and epoch 1 (s);
- ``deepspeed``: ``DeepSpeedDataSampler`` with ``deepspeed.comm.barrier/broadcast`` stubbed as no-ops: batches per
  second over ``steps`` micro-batches, and the time (s) of ``state_dict()`` + ``load_state_dict()``;
- ``repro-deepspeed``: the minimal DeepSpeed #8787 resume reproduction (30 micro-batches, resume after 15);
- ``repro-cluster-files``: the minimal reproduction of the DeepSpeed follow-up "cluster-files" (a restart from a state
  saved before a cluster reshuffle, ``docs/issues/cluster-files.md``);
- ``repro-io-workers``: the minimal reproduction of the DeepSpeed follow-up "io-workers" (a resume with
  ``data_sampling.num_workers = 2``, ``docs/issues/io-workers.md``);
- ``repro-consumed-samples``: the minimal reproduction of the DeepSpeed follow-up "consumed-samples" (the count after
  a resume, ``docs/issues/consumed-samples.md``);
- ``repro-accelerate``: one rank of the minimal Accelerate #4204 reproduction, started by
  ``torch.distributed.run --standalone --nproc_per_node=2``; PARAMS_JSON names the directory of the ranks' results.

Output: one line ``BENCH-RESULT <json>`` on stdout (``repro-accelerate``: a file per rank instead). A failure is
an exception and a non-zero exit status; the parent reports the end of stderr.
"""

import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

MARKER = "BENCH-RESULT "


def live_children() -> set[int]:
    """Pids of this process's live (not zombie) children, read from /proc: the DataLoader workers."""
    me, pids = os.getpid(), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if int(fields[1]) == me and fields[0] != "Z":
            pids.add(int(entry.name))
    return pids


def wait_for_no_children(before: set[int], timeout: float = 20.0) -> None:
    """Collect garbage and wait (up to ``timeout`` s) until no child beyond ``before`` is alive."""
    gc.collect()
    deadline = time.monotonic() + timeout
    while live_children() - before and time.monotonic() < deadline:
        time.sleep(0.02)


def accelerate_loaders(params: dict) -> dict:
    """``prepare()`` / worker / epoch figures per ``num_workers`` (see the module docstring); medians of ``inner``.

    params: ``num_workers`` (list of int), ``samples``, ``batch_size``, ``features``, ``inner`` (timed rounds after
    one untimed warm-up round). Returns {"module": accelerate.__file__, "versions": {...}, "by_workers": {nw: {...}}}
    where each entry holds the median ``prepare_s``, ``workers_after_prepare``, ``epoch0_s``, ``epoch1_s`` and
    ``prepare_epoch0_s`` (prepare + epoch 0, per round), all times in seconds.
    """
    import accelerate
    import torch
    import torchdata
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    dataset = TensorDataset(torch.randn(params["samples"], params["features"]))
    rounds = {nw: [] for nw in params["num_workers"]}
    for round_index in range(1 + params["inner"]):
        for nw in params["num_workers"]:
            torch.manual_seed(round_index)
            before = live_children()
            loader = DataLoader(dataset, batch_size=params["batch_size"], shuffle=True, num_workers=nw)
            started = time.perf_counter()
            prepared = accelerator.prepare(loader)
            prepare_s = time.perf_counter() - started
            workers = len(live_children() - before)
            epochs = []
            for _ in range(2):
                started = time.perf_counter()
                count = sum(1 for _ in prepared)
                epochs.append(time.perf_counter() - started)
                if count != len(loader):
                    raise RuntimeError(f"num_workers={nw}: an epoch yielded {count} batches, expected {len(loader)}")
            accelerator._dataloaders.clear()  # the accelerator keeps every prepared loader; let this one go
            del loader, prepared
            wait_for_no_children(before)
            if round_index:  # round 0 warms up (lazy imports, first fork)
                rounds[nw].append({"prepare_s": prepare_s, "workers_after_prepare": workers, "epoch0_s": epochs[0],
                                   "epoch1_s": epochs[1], "prepare_epoch0_s": prepare_s + epochs[0]})
    by_workers = {str(nw): {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                  for nw, runs in rounds.items()}
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "torchdata": torchdata.__version__,
                "accelerate": accelerate.__version__}
    return {"module": accelerate.__file__, "versions": versions, "by_workers": by_workers}


class FakeGroup:
    """Stands in for the data-parallel process group: the sampler only asks it for its size."""

    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size


# The two curriculum set-ups of the kit's suite (tests/deepspeed): one cluster holding the whole dataset, and
# percentile-based clusters, for which each global batch also draws its per-cluster mix.
SCHEDULE = {"schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [1, 2, 3], "max_step": [3, 6]}}
METRICS = {
    "single_cluster": {"clustering_type": "single_cluster", "difficulty_type": "value", "min_difficulty": 1,
                       "max_difficulty": 3, **SCHEDULE},
    "several_clusters": {"clustering_type": "schedule_based", "difficulty_type": "percentile", "min_difficulty": 1,
                         "max_difficulty": 3, **SCHEDULE},
}


def stub_collectives() -> None:
    """Replace ``barrier`` and ``broadcast`` where the sampler module looks them up, as tests/deepspeed does."""
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler

    def no_op(*args, **kwargs):
        return None

    data_sampler.dist.barrier = no_op
    data_sampler.dist.broadcast = no_op


def make_sampler(root: Path, run: str, scenario: str, epoch_samples: int, seed: int = 1234):
    """A curriculum ``DeepSpeedDataSampler`` as global rank 0 of 1 builds it; ``run`` names its cluster directory.

    Micro-batch 4, gradient accumulation 2 (global batch 8). For ``several_clusters`` the data analyzer's
    ``index_to_sample`` map (8 rows of shuffled sample ids) is written under ``root`` once.
    """
    import numpy as np
    from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler
    from deepspeed.runtime.data_pipeline.data_sampling.utils import (
        close_mmap_dataset_builder,
        create_mmap_dataset_builder,
    )

    metric = dict(METRICS[scenario])
    if metric["clustering_type"] != "single_cluster":
        index_path = root / "index_to_sample"
        if not (root / "index_to_sample.idx").exists():
            ids = np.random.default_rng(0).permutation(epoch_samples)
            builder = create_mmap_dataset_builder(str(index_path), np.int64)
            for row in np.array_split(ids, 8):
                builder.add_item_numpy(row)
            close_mmap_dataset_builder(builder, str(index_path))
        metric["index_to_sample_path"] = str(index_path)
    config = {"seed": seed, "data_sampling": {"num_epochs": 1000, "curriculum_learning": {
        "enabled": True, "data_cluster_path": str(root / run), "curriculum_metrics": {"difficulty": metric}}}}
    return DeepSpeedDataSampler(config, one_epoch_total_samples=epoch_samples, micro_batch_size=4,
                                data_parallel_rank=0, data_parallel_size=1, data_parallel_group=FakeGroup(1),
                                gradient_accumulation_steps=2, global_rank=0)


def deepspeed_sampler(params: dict) -> dict:
    """Sampler throughput and state round trip per scenario (see the module docstring).

    params: ``scenarios`` (names of METRICS), ``steps`` (timed micro-batches, in ``blocks`` equal blocks, after
    ``warmup`` untimed ones), ``epoch_samples``, ``inner`` (state round trips). Returns {"module":
    data_sampler.__file__, "versions": {...}, "by_scenario": {name: {...}}} with, per scenario, the median over
    blocks of ``batches_per_s`` (wall clock) and ``batches_per_cpu_s`` (this process's CPU time, which time spent
    waiting for a core on a busy machine does not inflate), and the medians over ``inner`` round trips of
    ``state_dict_s``, ``load_state_dict_s``, ``state_roundtrip_s`` (wall) and ``state_roundtrip_cpu_s``, in
    seconds. A round trip saves the state of the sampler that ran ``warmup + steps`` batches and loads it into a
    new sampler (built beforehand, not timed), as a resume does.
    """
    import deepspeed
    import numpy as np
    import torch
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler

    stub_collectives()
    results = {}
    with tempfile.TemporaryDirectory(prefix="kit-bench-ds-") as tmp:
        for scenario in params["scenarios"]:
            root = Path(tmp) / scenario
            root.mkdir()
            sampler = make_sampler(root, "run", scenario, params["epoch_samples"])
            iterator = iter(sampler)
            for _ in range(params["warmup"]):  # past the difficulty changes of the schedule (new clusters)
                next(iterator)
            per_block = params["steps"] // params["blocks"]
            wall_rates, cpu_rates = [], []
            for _ in range(params["blocks"]):
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(per_block):
                    next(iterator)
                wall_rates.append(per_block / (time.perf_counter() - wall))
                cpu_rates.append(per_block / max(time.process_time() - cpu, 1e-9))
            fresh = [make_sampler(root, "run", scenario, params["epoch_samples"]) for _ in range(params["inner"])]
            saves, loads, both, cpu_both = [], [], [], []
            for other in fresh:
                cpu, started = time.process_time(), time.perf_counter()
                state = sampler.state_dict()
                middle = time.perf_counter()
                other.load_state_dict(state)
                ended, cpu_ended = time.perf_counter(), time.process_time()
                saves.append(middle - started)
                loads.append(ended - middle)
                both.append(ended - started)
                cpu_both.append(cpu_ended - cpu)
            results[scenario] = {"batches_per_s": statistics.median(wall_rates),
                                 "batches_per_cpu_s": statistics.median(cpu_rates),
                                 "state_dict_s": statistics.median(saves),
                                 "load_state_dict_s": statistics.median(loads),
                                 "state_roundtrip_s": statistics.median(both),
                                 "state_roundtrip_cpu_s": statistics.median(cpu_both)}
            del fresh, iterator, sampler
            gc.collect()
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
                "deepspeed": deepspeed.__version__.strip()}
    return {"module": data_sampler.__file__, "versions": versions, "by_scenario": results}


# The one difficulty cluster of the follow-ups' reproductions (docs/issues/): difficulties 1 and 2, every sample
# from curriculum step 3 on.
REPRO_METRIC = {"clustering_type": "single_cluster", "difficulty_type": "value", "min_difficulty": 1,
                "max_difficulty": 2, "schedule_type": "fixed_discrete",
                "schedule_config": {"difficulty": [1, 2], "max_step": [3]}}


def repro_config(tmp: str, run: str, num_epochs: int) -> dict:
    """The data efficiency config of the follow-ups' reproductions: seed 1234, ``num_epochs``, REPRO_METRIC, the
    cluster files under ``tmp/run``."""
    curriculum = {"enabled": True, "data_cluster_path": f"{tmp}/{run}",
                  "curriculum_metrics": {"difficulty": REPRO_METRIC}}
    return {"seed": 1234, "data_sampling": {"num_epochs": num_epochs, "curriculum_learning": curriculum}}


def repro_deepspeed(params: dict) -> dict:
    """Minimal DeepSpeed #8787 reproduction: 30 micro-batches uninterrupted vs 15 + ``state_dict`` + a new sampler.

    Returns {"module", "differing": how many of the 15 batches after the resume differ (base: most; patched: 0)}.
    """
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler

    stub_collectives()
    with tempfile.TemporaryDirectory(prefix="kit-bench-repro-") as tmp:
        root = Path(tmp)
        expected_iter = iter(make_sampler(root, "uninterrupted", "single_cluster", 48))
        expected = [next(expected_iter) for _ in range(30)]
        first = make_sampler(root, "resumed", "single_cluster", 48)
        first_iter = iter(first)
        head = [next(first_iter) for _ in range(15)]
        second = make_sampler(root, "resumed", "single_cluster", 48)
        second.load_state_dict(first.state_dict())
        resumed = iter(second)
        tail = [next(resumed) for _ in range(15)]
    differing = sum(a != b for a, b in zip(expected, head + tail, strict=True))
    return {"module": data_sampler.__file__, "differing": differing}


def repro_cluster_files(params: dict) -> dict:
    """The "cluster-files" reproduction (docs/issues/cluster-files.md): single cluster of 40 samples, global batch 4
    (a reshuffle every 10 batches); a job saves its state at batch 8, trains on to batch 13 and dies; a restart with
    the same ``data_cluster_path`` loads the state and takes 22 batches.

    Returns {"module", "differing": how many of those 22 differ from the uninterrupted run's}.
    """
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler
    from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler

    stub_collectives()

    def take(sampler, count):
        batches = iter(sampler)
        return [next(batches) for _ in range(count)]

    with tempfile.TemporaryDirectory(prefix="kit-bench-repro-") as tmp:

        def sampler(run):
            return DeepSpeedDataSampler(repro_config(tmp, run, 100), 40, 4, 0, 1, FakeGroup(1), 1, 0)

        uninterrupted = take(sampler("uninterrupted"), 30)
        job = sampler("job")
        take(job, 8)
        state = job.state_dict()
        take(job, 5)
        restarted = sampler("job")
        restarted.load_state_dict(state)
        after = take(restarted, 22)
    return {"module": data_sampler.__file__,
            "differing": sum(a != b for a, b in zip(after, uninterrupted[8:], strict=True))}


def repro_io_workers(params: dict) -> dict:
    """The "io-workers" reproduction (docs/issues/io-workers.md): a ``DeepSpeedDataLoader`` with 2 workers saves the
    sampler's state after 6 micro-batches; a new loader that loads it takes 10.

    Returns {"module", "late": how many micro-batches after the checkpoint the resumed run goes on (None: no
    offset up to 7 matches)}.
    """
    import torch
    from deepspeed.runtime.constants import DATA_PARALLEL_GROUP, GLOBAL_RANK, GRADIENT_ACCUMULATION_STEPS
    from deepspeed.runtime.data_pipeline.constants import (
        CURRICULUM_LEARNING,
        DATA_EFFICIENCY,
        DATA_SAMPLING_NUM_WORKERS,
    )
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler
    from deepspeed.runtime.dataloader import DeepSpeedDataLoader

    stub_collectives()
    dataset = [torch.tensor([float(i)]) for i in range(48)]

    def take(loader, count):
        batches = iter(loader)
        taken = [next(batches)[:, 0].int().tolist() for _ in range(count)]
        loader.data_iterator = None  # its workers stop now
        return taken

    with tempfile.TemporaryDirectory(prefix="kit-bench-repro-") as tmp:

        def loader(run):
            config = {CURRICULUM_LEARNING: True, DATA_PARALLEL_GROUP: FakeGroup(1), GRADIENT_ACCUMULATION_STEPS: 2,
                      GLOBAL_RANK: 0, DATA_SAMPLING_NUM_WORKERS: 2, DATA_EFFICIENCY: repro_config(tmp, run, 100)}
            return DeepSpeedDataLoader(dataset, batch_size=2, pin_memory=False, local_rank=0, tput_timer=None,
                                       data_parallel_world_size=1, data_parallel_rank=0,
                                       deepspeed_dataloader_config=config)

        uninterrupted = take(loader("uninterrupted"), 20)
        job = loader("job")
        take(job, 6)
        state = job.data_sampler.state_dict()
        resumed = loader("job")
        resumed.data_sampler.load_state_dict(state)
        after = take(resumed, 10)
    late = next((skip for skip in range(8) if after == uninterrupted[6 + skip:16 + skip]), None)
    return {"module": data_sampler.__file__, "late": late}


def repro_consumed_samples(params: dict) -> dict:
    """The "consumed-samples" reproduction (docs/issues/consumed-samples.md): 40 samples, one epoch, micro-batches of
    4; ``consumed_samples`` in the state after each micro-batch, uninterrupted and with a resume after micro-batch 5.

    Returns {"module", "behind": how many samples the state after micro-batch 5 counts fewer than 5 micro-batches
    hold (base: 4, fixed: 0), "extra": micro-batches the resumed run yields beyond the uninterrupted one}.
    """
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler
    from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler

    stub_collectives()

    def counts(sampler, limit=None):
        seen = []
        for _ in sampler:
            seen.append(sampler.state_dict()["consumed_samples"])
            if len(seen) == limit:
                break
        return seen

    with tempfile.TemporaryDirectory(prefix="kit-bench-repro-") as tmp:

        def sampler(run):
            return DeepSpeedDataSampler(repro_config(tmp, run, 1), 40, 4, 0, 1, FakeGroup(1), 2, 0)

        uninterrupted = counts(sampler("uninterrupted"))
        job = sampler("job")
        before = counts(job, 5)
        resumed = sampler("job")
        resumed.load_state_dict(job.state_dict())
        after = counts(resumed)
    return {"module": data_sampler.__file__, "behind": 5 * 4 - before[-1],
            "extra": len(before) + len(after) - len(uninterrupted)}


def repro_accelerate(params: dict) -> None:
    """One rank of the minimal Accelerate #4204 reproduction; writes ``rank<N>.json`` into ``params["out"]``.

    96 samples, batch 4, 2 workers, ranks seeded differently before ``prepare()``; the file holds this rank's
    sample ids of epoch 0, the world size and ``accelerate.__file__``.
    """
    import accelerate
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader

    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    rank = accelerator.process_index
    torch.manual_seed(1000 + rank)
    loader = accelerator.prepare(DataLoader(list(range(96)), batch_size=4, shuffle=True, num_workers=2))
    ids = [int(i) for batch in loader for i in batch]
    result = {"rank": rank, "world_size": accelerator.num_processes, "ids": ids, "module": accelerate.__file__}
    path = Path(params["out"], f"rank{rank}.json")
    path.with_suffix(".tmp").write_text(json.dumps(result))
    path.with_suffix(".tmp").replace(path)
    accelerator.end_training()


KINDS = {"accelerate": accelerate_loaders, "deepspeed": deepspeed_sampler, "repro-deepspeed": repro_deepspeed,
         "repro-cluster-files": repro_cluster_files, "repro-io-workers": repro_io_workers,
         "repro-consumed-samples": repro_consumed_samples,
         "repro-accelerate": repro_accelerate}


def main() -> None:
    """Run KIND with PARAMS_JSON (argv 1 and 2) and print its result after the marker."""
    kind, params = sys.argv[1], json.loads(sys.argv[2])
    # DeepSpeed's MMapIndexedDataset prints a few lines per cluster file it opens: keep stdout for the result.
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        result = KINDS[kind](params)
    if result is not None:
        print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
