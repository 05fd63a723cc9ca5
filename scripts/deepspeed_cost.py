"""What the DeepSpeed series' follow-ups cost: disk per cluster reshuffle, and sampler time per step.

Run in the kit's venv, on the DeepSpeed checkout as installed (``make apply``: the series applied):
``.venv/bin/python -m scripts.deepspeed_cost [--samples N] [--micro-batch B] [--epochs E] [--json PATH]``.

Disk (commit 2, "Write each curriculum cluster reshuffle to a new file"): every reshuffle of a difficulty cluster
writes a new MMapIndexedDataset pair under ``data_cluster_path``: ``.bin`` holds the permuted sample ids,
``size * itemsize`` bytes, with ``itemsize`` from ``find_fit_int_dtype(0, one_epoch_total_samples)``
(deepspeed/runtime/data_pipeline/data_sampling/utils.py: 1, 2, 4 or 8 bytes); ``.idx`` holds a fixed header and
per item an int32 size, an int64 pointer and an int64 document index (indexed_dataset.py, class
``MMapIndexedDataset.Index.writer``). The script computes that for 10^8 samples and checks the formula against the
bytes a run of ``--samples`` samples (single cluster) leaves on disk after ``--epochs`` epochs.

Time: CPU seconds of this process per curriculum step (one global batch drawn and sliced) of the sampler of the
pristine release (``base/<version>``, read with git from ``upstream/deepspeed`` and imported beside the installed
module), of the installed one, and of the installed one tracking the DataLoader's prefetch (commit 3, what
``data_sampling.num_workers > 0`` turns on), all in this process, reported as ratios to the pristine release.
The sampler's two collectives are replaced by no-ops (one process, global rank 0). Prints a table; with ``--json``
also writes the numbers there. Raises SystemExit with a one-line message when the checkout has no base.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

KIT_ROOT = Path(__file__).resolve().parents[1]
CHECKOUT = KIT_ROOT / "upstream" / "deepspeed"
SAMPLER_PATH = "deepspeed/runtime/data_pipeline/data_sampling/data_sampler.py"
# MMapIndexedDataset.Index.writer: magic (9 bytes), version (<Q), dtype code (<B), len(sizes) (<Q),
# len(doc_idx) (<Q); then sizes int32, pointers int64, doc_idx int64.
IDX_HEADER = 9 + 8 + 1 + 8 + 8


def idx_bytes(items: int, documents: int) -> int:
    """Bytes of an ``.idx`` file with ``items`` items and a document index of ``documents`` entries."""
    return IDX_HEADER + 4 * items + 8 * items + 8 * documents


def reshuffle_bytes(samples: int) -> int:
    """Bytes one reshuffle of a cluster of ``samples`` samples adds (``.bin`` + ``.idx``; one item, doc_idx [0, 1])."""
    from deepspeed.runtime.data_pipeline.data_sampling.utils import find_fit_int_dtype

    return samples * np.dtype(find_fit_int_dtype(0, samples)).itemsize + idx_bytes(1, 2)


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


def make_sampler(cls, cluster_dir: str, samples: int, micro_batch: int, epochs: int):
    """A single-cluster curriculum sampler of class ``cls`` on global rank 0, one data-parallel rank."""
    metric = {
        "clustering_type": "single_cluster",
        "difficulty_type": "value",
        "min_difficulty": 1,
        "max_difficulty": 3,
        "schedule_type": "fixed_discrete",
        "schedule_config": {"difficulty": [1, 2, 3], "max_step": [3, 6]},
    }
    config = {
        "seed": 1234,
        "data_sampling": {
            "num_epochs": epochs + 1,
            "curriculum_learning": {
                "enabled": True,
                "data_cluster_path": cluster_dir,
                "curriculum_metrics": {"difficulty": metric},
            },
        },
    }
    return cls(config, samples, micro_batch, 0, 1, SimpleNamespace(size=lambda: 1), 1, 0)


def directory_bytes(path: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())


def run(sampler, steps: int, consume: bool) -> float:
    """CPU seconds of this process per step (``time.process_time``: other jobs on the machine count less than in
    wall time) over ``steps`` micro-batches (one per global batch here); ``consume``: call
    ``batch_consumed()`` after each, as DeepSpeedDataLoader does with workers."""
    batches = iter(sampler)
    start = time.process_time()
    for _ in range(steps):
        next(batches)
        if consume:
            sampler.batch_consumed()
    return (time.process_time() - start) / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000, help="samples of the toy dataset (default 200000)")
    parser.add_argument("--micro-batch", type=int, default=256, help="micro-batch size (default 256)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs to run, one reshuffle each (default 3)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)

    from deepspeed.runtime.data_pipeline.data_sampling import data_sampler
    from deepspeed.runtime.data_pipeline.data_sampling.data_sampler import DeepSpeedDataSampler

    data_sampler.dist.barrier = lambda *a, **k: None
    data_sampler.dist.broadcast = lambda *a, **k: None
    steps = args.epochs * args.samples // args.micro_batch
    pristine = pristine_sampler_class()
    numbers = {"samples": args.samples, "micro_batch": args.micro_batch, "steps": steps}
    with tempfile.TemporaryDirectory() as root:
        seconds = {}
        for label, cls, track in (
            ("0.19.8", pristine, False),
            ("series", DeepSpeedDataSampler, False),
            ("series, tracking the prefetch", DeepSpeedDataSampler, True),
        ):
            cluster_dir = os.path.join(root, label.replace(" ", "_").replace(",", ""))
            sampler = make_sampler(cls, cluster_dir, args.samples, args.micro_batch, args.epochs)
            if track:
                sampler.track_prefetch()
            seconds[label] = run(sampler, steps, track)
            if label == "series":
                files = sorted(os.listdir(cluster_dir))
                reshuffles = sum(name.endswith(".bin") for name in files) - 1
                measured = (directory_bytes(cluster_dir) - reshuffle_bytes(args.samples)) / max(reshuffles, 1)
                numbers.update(
                    reshuffles=reshuffles,
                    measured_bytes_per_reshuffle=measured,
                    computed_bytes_per_reshuffle=reshuffle_bytes(args.samples),
                )
    numbers["bytes_per_reshuffle_1e8_samples"] = reshuffle_bytes(10**8)
    numbers["seconds_per_step"] = seconds
    numbers["ratio_to_pristine"] = {label: seconds[label] / seconds["0.19.8"] for label in seconds}
    print(
        f"disk: {numbers['reshuffles']} reshuffles of a single cluster of {args.samples} samples: "
        f"{numbers['measured_bytes_per_reshuffle']:.0f} bytes each on disk, "
        f"{numbers['computed_bytes_per_reshuffle']} computed from the file format"
    )
    print(
        f"disk: 10^8 samples: {numbers['bytes_per_reshuffle_1e8_samples']} bytes per reshuffle "
        f"({numbers['bytes_per_reshuffle_1e8_samples'] / 1e6:.1f} MB)"
    )
    print(f"CPU time per step ({steps} steps of micro-batch {args.micro_batch}, one rank):")
    for label, value in seconds.items():
        print(f"  {label:32} {value * 1e6:9.1f} us   x{numbers['ratio_to_pristine'][label]:.3f}")
    if args.json:
        args.json.write_text(json.dumps(numbers, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
