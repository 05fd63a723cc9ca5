"""What the DeepSpeed series costs against the pristine release: disk under ``data_cluster_path``, the sampler
state's size, CPU per micro-batch, and ``load_state_dict()``.

Run in the kit's venv, on the DeepSpeed checkout as installed (``make apply``: the series applied):
``.venv/bin/python -m scripts.deepspeed_cost [--samples N] [--passes 1,10,60] [--json PATH]`` (``--help`` for all);
on one commit of the stack, with a work tree of it first on ``PYTHONPATH`` (``git -C upstream/deepspeed worktree add
/tmp/at HEAD~1``, then ``PYTHONPATH=/tmp/at``).
Both samplers run in this process, the release's ``DeepSpeedDataSampler`` read with git from ``base/<version>`` of
``upstream/deepspeed`` and imported beside the installed module; their two collectives are replaced by no-ops (one
process, global rank 0, one data-parallel rank). Prints a table; with ``--json`` also writes the numbers there.

- Disk: the bytes of the files under ``data_cluster_path`` after ``--passes`` passes over a dataset of ``--samples``
  samples (micro-batch ``--disk-micro-batch``), with one difficulty cluster (``single_cluster``) and with three
  (percentile-based, 1/2, 1/4 and 1/4 of the samples, added at curriculum steps 1, 4 and 7). A cluster's file holds
  ``size * itemsize`` bytes of sample ids (``find_fit_int_dtype(0, samples)``: 4 bytes per sample up to 2^32,
  deepspeed/runtime/data_pipeline/data_sampling/utils.py) plus a 62-byte ``.idx``.
- State: bytes of ``state_dict()`` through ``torch.save`` after the last pass (the zip file torch writes), and the
  bytes a cluster adds: the pickled per-cluster entries (file name, position; with the series also the reshuffle's
  generator state and the file's CRC-32) with three clusters less those with one, halved.
- Memory: the bytes of global rank 0's cluster arrays after the last pass that are held in the process's own memory
  rather than mapped from a file (``private_bytes``): the release maps the cluster file it rewrote, the series the
  cache file of the reshuffled cluster. Both copy a cluster once while they reshuffle it (not counted).
- CPU: seconds of this process (``time.process_time``, so other jobs on the machine count less than in wall time) per
  micro-batch over ``--steps`` micro-batches (micro-batch ``--micro-batch``, ``--gradient-accumulation`` of them per
  global batch, a single cluster of ``--cpu-samples`` samples, so that it is reshuffled), without and with
  ``post_process_func`` (then ``state_dict()`` once per micro-batch, as ``DeepSpeedDataLoader.__next__`` calls it),
  and, for the series, tracking the DataLoader's prefetch as with ``data_sampling.num_workers > 0`` (``PREFETCH``
  micro-batches drawn ahead, one report of ``track_consumption()`` per micro-batch). Each variant runs ``--repeat``
  times in turn; the median is reported, and its ratio to the release's of the same ``post_process_func`` setting (the
  release runs the same with and without workers: it tracks nothing). Also the CPU of one ``state_dict()`` call (median
  of ``--repeat`` runs of ``--steps`` calls) after the CPU run, and of one ``np.random.get_state()``, which both call.
- Resume points (a series whose sampler has ``track_consumption``): the memory the points kept for a DataLoader's
  prefetch hold, as ``tracemalloc`` traces it: the traced bytes after ``PREFETCH`` + ``--steps`` / 10 micro-batches
  tracked (one report per micro-batch after the prefetch) less those of the same micro-batches untracked, and how many
  points are kept (``PREFETCH`` + 1).
- Load: CPU and wall seconds of ``load_state_dict()`` of the state after the last pass into a new sampler (the series
  reads each cluster file for its checksum and maps the reshuffled cluster's cache file), and, for the series, with
  the cache files removed first (a restart from a checkpoint older than the last reshuffle: it shuffles each
  reshuffled cluster again and writes its cache).
- Order (``--order-reshuffles N``): what keeping 0.19.8's order of an uninterrupted run past a cluster's second
  reshuffle would cost a restart from a checkpoint whose cache is gone: 0.19.8 permutes the previous permutation, so
  the checkpoint would hold the generator's state of each of the N reshuffles (pickled bytes of N states) and the
  load would shuffle a cluster of ``--order-samples`` samples N times (CPU seconds, measured).

Raises SystemExit with a one-line message when the checkout has no base.
"""

import argparse
import importlib.util
import io
import json
import mmap
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np

KIT_ROOT = Path(__file__).resolve().parents[1]
CHECKOUT = KIT_ROOT / "upstream" / "deepspeed"
SAMPLER_PATH = "deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py"
PREFETCH = 4  # num_workers * prefetch_factor with 2 workers and torch's default prefetch factor
# The state's per-cluster lists (data_pipeline/constants.py); the last two are the series'.
PER_CLUSTER_KEYS = (
    "data_cluster_paths",
    "data_cluster_current_position",
    "data_cluster_reshuffle_rng_states",
    "data_cluster_checksums",
)


def pristine_sampler_class():
    """``DeepSpeedDataSampler`` of ``base/<installed version>``, imported as a sibling of the installed module."""
    import deepspeed
    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler

    version = deepspeed.__version__.strip().split("+")[0]
    shown = subprocess.run(
        ["git", "-C", str(CHECKOUT), "show", f"base/{version}:{SAMPLER_PATH}"], capture_output=True, text=True
    )
    if shown.returncode != 0:
        raise SystemExit(f"no base/{version} in {CHECKOUT}: run `make apply` first")
    path = Path(tempfile.mkdtemp(prefix="pristine-")) / "pristine_data_sampler.py"
    path.write_text(shown.stdout)
    package = data_sampler.__name__.rpartition(".")[0]
    spec = importlib.util.spec_from_file_location(f"{package}.pristine_data_sampler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DeepSpeedDataSampler


def metric(root: str, samples: int, clusters: int) -> dict:
    """The difficulty metric of ``clusters`` clusters (1 or 3), writing its index_to_sample map under ``root``."""
    if clusters == 1:
        return {
            "clustering_type": "single_cluster",
            "difficulty_type": "value",
            "min_difficulty": 1,
            "max_difficulty": 3,
            "schedule_type": "fixed_discrete",
            "schedule_config": {"difficulty": [1, 2, 3], "max_step": [3, 6]},
        }
    from deepspeed.runtime.data_pipeline.data_sampling.utils import (
        close_mmap_dataset_builder,
        create_mmap_dataset_builder,
        find_fit_int_dtype,
    )

    path = os.path.join(root, "index_to_sample")
    if not os.path.exists(path + ".idx"):
        builder = create_mmap_dataset_builder(path, find_fit_int_dtype(0, samples))
        for row in np.array_split(np.random.default_rng(0).permutation(samples), 8):
            builder.add_item_numpy(row)
        close_mmap_dataset_builder(builder, path)
    return {
        "clustering_type": "schedule_based",
        "difficulty_type": "percentile",
        "min_difficulty": 2,
        "max_difficulty": 4,
        "index_to_sample_path": path,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": [2, 3, 4], "max_step": [3, 6]},
    }


def make_sampler(cls, root: str, run: str, samples: int, micro_batch: int, accumulation: int, clusters: int = 1):
    """A curriculum sampler of class ``cls`` on global rank 0, one data-parallel rank, ``data_cluster_path``
    ``root/run``."""
    curriculum = {
        "enabled": True,
        "data_cluster_path": os.path.join(root, run),
        "curriculum_metrics": {"difficulty": metric(root, samples, clusters)},
    }
    config = {"seed": 1234, "data_sampling": {"num_epochs": 10**6, "curriculum_learning": curriculum}}
    return cls(config, samples, micro_batch, 0, 1, SimpleNamespace(size=lambda: 1), accumulation, 0)


def directory_bytes(path: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())


def torch_saved_bytes(state: dict) -> int:
    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return len(buffer.getvalue())


def per_cluster_bytes(state: dict) -> int:
    """Pickled bytes of the per-cluster entries of ``state``."""
    keys = [key for key in PER_CLUSTER_KEYS if key in state]
    clusters = range(len(state["data_cluster_paths"]))
    return len(pickle.dumps([[state[key][index] for key in keys] for index in clusters]))


def private_bytes(array) -> int:
    """``array.nbytes`` unless its memory is mapped from a file (an ``np.memmap``, or a buffer of an ``mmap``)."""
    base = array
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return 0
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return array.nbytes


def remove_caches(directory: str) -> int:
    """Removes the series' caches of reshuffled clusters (``*.npy``) under ``directory``; how many."""
    caches = [entry.path for entry in os.scandir(directory) if entry.name.endswith(".npy")]
    for path in caches:
        os.remove(path)
    return len(caches)


def timed_load(cls, root: str, run: str, args, clusters: int, state: dict) -> tuple[float, float]:
    """CPU and wall seconds of ``load_state_dict(state)`` into a new sampler."""
    loader = make_sampler(cls, root, run, args.samples, args.disk_micro_batch, 1, clusters)
    state = pickle.loads(pickle.dumps(state))
    cpu, wall = time.process_time(), time.perf_counter()
    loader.load_state_dict(state)
    return time.process_time() - cpu, time.perf_counter() - wall


def disk_and_state(classes: dict, args, root: str) -> dict:
    """{clusters: {label: {"bytes_after_passes", "state_bytes", "state_bytes_per_cluster", "memory_bytes",
    "load_cpu_s", "files"}}} over the passes of ``args.passes``."""
    results = {}
    for clusters in (1, 3):
        for label, cls in classes.items():
            run = f"disk-{label}-{clusters}"
            sampler = make_sampler(cls, root, run, args.samples, args.disk_micro_batch, 1, clusters)
            batches, after = iter(sampler), {}
            for passes in args.passes:
                while sampler.consumed_samples < passes * args.samples:
                    next(batches)
                after[passes] = directory_bytes(os.path.join(root, run))
            state = sampler.state_dict()
            memory = sum(private_bytes(cluster[0]) for cluster in sampler.data_clusters)
            load_cpu, load_wall = timed_load(cls, root, run, args, clusters, state)
            result = {
                "bytes_after_passes": after,
                "files": len(os.listdir(os.path.join(root, run))),
                "state_bytes": torch_saved_bytes(state),
                "per_cluster_entries_bytes": per_cluster_bytes(state),
                "memory_bytes": memory,
                "load_cpu_s": load_cpu,
                "load_wall_s": load_wall,
            }
            if remove_caches(os.path.join(root, run)):
                result["load_without_caches_cpu_s"], result["load_without_caches_wall_s"] = timed_load(
                    cls, root, run, args, clusters, state
                )
            results.setdefault(clusters, {})[label] = result
    for label in classes:
        results[3][label]["state_bytes_per_cluster"] = (
            results[3][label]["per_cluster_entries_bytes"] - results[1][label]["per_cluster_entries_bytes"]
        ) / 2
    return results


def order_cost(reshuffles: int, samples: int) -> dict:
    """Keeping 0.19.8's order across ``reshuffles`` reshuffles of a ``samples``-sample cluster: the pickled bytes of
    the generator's state of each reshuffle, and CPU seconds of as many shuffles, each of the previous permutation."""
    rng = np.random.default_rng(1234)
    states = []
    cluster = np.arange(samples, dtype=np.int32)
    started = time.process_time()
    for _ in range(reshuffles):
        states.append(rng.bit_generator.state)
        rng.shuffle(cluster)
    return {
        "reshuffles": reshuffles,
        "samples": samples,
        "state_bytes": len(pickle.dumps(states)),
        "load_cpu_s": time.process_time() - started,
    }


def cpu_run(sampler, steps: int, post_process: bool, track: bool) -> float:
    """CPU seconds per micro-batch over ``steps`` micro-batches: with ``post_process``, ``state_dict()`` after each;
    with ``track``, ``PREFETCH`` micro-batches drawn ahead and the ``track_consumption()`` report for each consumed."""
    consumed = sampler.track_consumption() if track else None
    batches = iter(sampler)
    if track:
        for _ in range(PREFETCH):
            next(batches)
    started = time.process_time()
    for _ in range(steps):
        next(batches)
        if track:
            consumed()
        if post_process:
            sampler.state_dict()
    return (time.process_time() - started) / steps


def state_dict_call(sampler, calls: int) -> float:
    """CPU seconds of one ``state_dict()`` call, over ``calls`` calls."""
    started = time.process_time()
    for _ in range(calls):
        sampler.state_dict()
    return (time.process_time() - started) / calls


def cpu_per_micro_batch(classes: dict, args, root: str) -> tuple[dict, dict]:
    """{variant: median CPU seconds per micro-batch} and {variant: median CPU seconds of a state_dict() call};
    variants "<label>" and "<label>, post_process_func", and for a series that tracks the DataLoader's prefetch (its
    sampler has ``track_consumption``: from the io-workers commit on) also "<label>, workers" and "<label>,
    workers, post_process_func" (the calls: of the variants without post_process_func)."""
    variants = []
    for label, cls in classes.items():
        for track in (False, True) if hasattr(cls, "track_consumption") else (False,):
            for post_process in (False, True):
                name = label + (", workers" if track else "") + (", post_process_func" if post_process else "")
                variants.append((name, cls, post_process, track))
    seconds = {name: [] for name, *_ in variants}
    calls = {name: [] for name, _, post_process, _ in variants if not post_process}
    for _ in range(args.repeat):
        for name, cls, post_process, track in variants:
            sampler = make_sampler(
                cls,
                root,
                f"cpu-{len(seconds[name])}-{name}",
                args.cpu_samples,
                args.micro_batch,
                args.gradient_accumulation,
            )
            seconds[name].append(cpu_run(sampler, args.steps, post_process, track))
            if name in calls:
                calls[name].append(state_dict_call(sampler, args.steps))
    calls["np.random.get_state()"] = [
        state_dict_call(SimpleNamespace(state_dict=np.random.get_state), args.steps) for _ in range(args.repeat)
    ]
    return median_by_name(seconds), median_by_name(calls)


def resume_points_bytes(cls, args, root: str) -> tuple[int, int]:
    """(bytes, points): the memory the resume points of ``cls`` hold with ``PREFETCH`` micro-batches fetched ahead
    (traced bytes tracked less untracked, after the same micro-batches) and how many points it keeps."""
    traced = {}
    for track in (False, True):
        sampler = make_sampler(
            cls, root, f"points-{track}", args.cpu_samples, args.micro_batch, args.gradient_accumulation
        )
        tracemalloc.start()
        consumed = sampler.track_consumption() if track else None
        batches = iter(sampler)
        for step in range(PREFETCH + args.steps // 10):
            next(batches)
            if track and step >= PREFETCH:
                consumed()
        traced[track] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    return traced[True] - traced[False], len(sampler._prefetched) + 1


def median_by_name(values_by_name: dict) -> dict:
    return {name: statistics.median(values) for name, values in values_by_name.items()}


def passes_list(text: str) -> list[int]:
    return sorted({int(part) for part in text.split(",")})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000, help="dataset of the disk part (default 200000)")
    parser.add_argument("--passes", type=passes_list, default=[1, 10, 60], help="passes to measure (default 1,10,60)")
    parser.add_argument("--disk-micro-batch", type=int, default=4096, help="micro-batch of the disk part")
    parser.add_argument("--cpu-samples", type=int, default=20_000, help="dataset of the CPU part (default 20000)")
    parser.add_argument("--micro-batch", type=int, default=8, help="micro-batch of the CPU part (default 8)")
    parser.add_argument("--gradient-accumulation", type=int, default=16, help="CPU part (default 16)")
    parser.add_argument("--steps", type=int, default=20_000, help="micro-batches per CPU run (default 20000)")
    parser.add_argument("--repeat", type=int, default=3, help="CPU runs per variant (default 3)")
    parser.add_argument("--order-reshuffles", type=int, default=0, help="reshuffles of the order part (default 0)")
    parser.add_argument("--order-samples", type=int, default=10**7, help="the order part's cluster (default 10^7)")
    parser.add_argument("--skip-cpu", action="store_true", help="no CPU part")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)

    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler
    from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler

    data_sampler.dist.barrier = lambda *a, **k: None
    data_sampler.dist.broadcast = lambda *a, **k: None
    classes = {"0.19.8": pristine_sampler_class(), "series": DeepSpeedDataSampler}
    with tempfile.TemporaryDirectory(prefix="kit-deepspeed-cost-") as root:
        disk = disk_and_state(classes, args, root)
        cpu, calls = ({}, {}) if args.skip_cpu else cpu_per_micro_batch(classes, args, root)
        tracks = hasattr(classes["series"], "track_consumption") and not args.skip_cpu
        points = resume_points_bytes(classes["series"], args, root) if tracks else None
    order = order_cost(args.order_reshuffles, args.order_samples) if args.order_reshuffles else None
    ratios = {
        name: value / cpu["0.19.8" + (", post_process_func" if "post_process_func" in name else "")]
        for name, value in cpu.items()
    }
    numbers = {
        "args": {key: value for key, value in vars(args).items() if key != "json"},
        "disk_and_state": disk,
        "cpu_s_per_micro_batch": cpu,
        "cpu_ratio_to_release": ratios,
        "state_dict_cpu_s": calls,
        "order": order,
        "resume_points": None if points is None else {"bytes": points[0], "points": points[1]},
    }
    print(f"disk under data_cluster_path, {args.samples} samples (bytes after passes {args.passes}; files):")
    for clusters, by_label in disk.items():
        for label, d in by_label.items():
            sizes = ", ".join(f"{d['bytes_after_passes'][p]:,}" for p in args.passes)
            print(f"  {clusters} cluster(s) {label:8} {sizes}; {d['files']} files")
    print(
        f"state after {args.passes[-1]} passes (torch.save bytes); rank 0's permutations in memory; load_state_dict:"
    )
    for clusters, by_label in disk.items():
        for label, d in by_label.items():
            without = (
                f"; without the caches {d['load_without_caches_cpu_s'] * 1e3:.1f} ms CPU, "
                f"{d['load_without_caches_wall_s'] * 1e3:.1f} ms wall"
                if "load_without_caches_cpu_s" in d
                else ""
            )
            print(
                f"  {clusters} cluster(s) {label:8} {d['state_bytes']:,} bytes; in memory {d['memory_bytes']:,} "
                f"bytes; load_state_dict {d['load_cpu_s'] * 1e3:.1f} ms CPU, {d['load_wall_s'] * 1e3:.1f} ms wall"
                f"{without}"
            )
    for label, d in disk[3].items():
        print(f"  bytes a cluster adds to the state, {label}: {d['state_bytes_per_cluster']:.0f}")
    if order:
        print(
            f"keeping 0.19.8's order across {order['reshuffles']} reshuffles of a {order['samples']:,}-sample "
            f"cluster: {order['state_bytes']:,} bytes of generator states, {order['load_cpu_s']:.2f} s CPU of shuffles"
        )
    if args.skip_cpu:
        if args.json:
            args.json.write_text(json.dumps(numbers, indent=1))
        return 0
    print(
        f"CPU per micro-batch ({args.steps} micro-batches of {args.micro_batch}, global batch "
        f"{args.micro_batch * args.gradient_accumulation}, median of {args.repeat}; ratio to 0.19.8):"
    )
    for name, value in cpu.items():
        print(f"  {name:40} {value * 1e6:8.1f} us   x{ratios[name]:.2f}")
    print("CPU of one state_dict() call, and of np.random.get_state() (median):")
    for name, value in calls.items():
        print(f"  {name:40} {value * 1e6:8.1f} us   x{value / calls['0.19.8']:.2f}")
    if points:
        print(
            f"resume points with {PREFETCH} micro-batches fetched ahead (global batch "
            f"{args.micro_batch * args.gradient_accumulation}): {points[1]} points, {points[0]:,} bytes traced, "
            f"{points[0] / points[1]:,.0f} bytes a point"
        )
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
