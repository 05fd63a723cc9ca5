"""What the Accelerate series' fourth commit (a shuffled stateful dataloader keeps its epoch's seed) costs against
the commit before it: the state's bytes, CPU per epoch and per step, CPU of a resume.

Run in the kit's venv, on the Accelerate checkout as installed (``make apply``: the series applied):
``.venv/bin/python -m scripts.accelerate_cost [--against HEAD~1] [--samples 4096] [--batch-size 32] [--repeat 7]``.
Both ``data_loader.py`` run in this process: the installed one, and the one of ``--against`` (a revision of
``upstream/accelerate``, read with git) imported beside it as ``accelerate.against_data_loader``. One process, no
workers, a shuffled ``DataLoader`` over ``--samples`` integers prepared with ``use_stateful_dataloader=True``, each
step drawing from the global RNG as dropout does.

- State: bytes of ``torch.save(dataloader.state_dict())`` after 3 batches (the file ``save_state()`` writes).
- CPU: seconds of this process (``time.process_time``) per epoch of ``--epochs`` epochs, and per step; each side
  runs ``--repeat`` times in turn, the median is reported with its ratio to ``--against``'s.
- Resume: CPU seconds of ``load_state_dict()`` of a state taken in the middle of an epoch and the first batch after
  it (the restored iterator is built then), median of ``--repeat``.
"""

import argparse
import importlib.util
import io
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import accelerate
import accelerate.data_loader as installed
import torch
from torch.utils.data import DataLoader

UPSTREAM = Path(__file__).resolve().parents[1] / "upstream" / "accelerate"


def module_at(revision, directory):
    """``src/accelerate/data_loader.py`` of ``revision`` of the checkout, as a sibling of the installed modules."""
    shown = subprocess.run(["git", "-C", str(UPSTREAM), "show", f"{revision}:src/accelerate/data_loader.py"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"accelerate_cost: no {revision} in {UPSTREAM}: {shown.stderr.strip()}")
    file = Path(directory) / "against_data_loader.py"
    file.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location("accelerate.against_data_loader", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepared(module, args):
    torch.manual_seed(0)
    loader = DataLoader(list(range(args.samples)), batch_size=args.batch_size, shuffle=True)
    return module.prepare_data_loader(loader, num_processes=1, process_index=0, use_stateful_dataloader=True)


def state_bytes(module, args):
    loader = prepared(module, args)
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    buffer = io.BytesIO()
    torch.save(loader.state_dict(), buffer)
    return len(buffer.getvalue())


def epochs_cpu(module, args):
    loader = prepared(module, args)
    start = time.process_time()
    for _ in range(args.epochs):
        for _ in loader:
            torch.rand(2)
    return (time.process_time() - start) / args.epochs


def resume_cpu(module, args):
    loader = prepared(module, args)
    batches = iter(loader)
    for _ in range(len(loader) // 2):
        next(batches)
    state, rng = loader.state_dict(), torch.get_rng_state()
    restarted = prepared(module, args)
    torch.set_rng_state(rng)
    start = time.process_time()
    restarted.load_state_dict(state)
    next(iter(restarted))
    return time.process_time() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="HEAD~1", help="the revision of upstream/accelerate to compare with")
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    accelerate.Accelerator(cpu=True)  # the state DataLoaderShard reads
    with tempfile.TemporaryDirectory() as directory:
        sides = {"installed": installed, args.against: module_at(args.against, directory)}
        cpu = {name: [] for name in sides}
        resume = {name: [] for name in sides}
        for _ in range(args.repeat):
            for name, module in sides.items():
                cpu[name].append(epochs_cpu(module, args))
                resume[name].append(resume_cpu(module, args))
        steps = -(-args.samples // args.batch_size)
        print(f"{args.samples} samples, batch {args.batch_size} ({steps} steps an epoch), medians of {args.repeat}")
        print("| side | state bytes | CPU s per epoch | CPU us per step | CPU ms of a resume |")
        print("|---|---|---|---|---|")
        base = statistics.median(cpu[args.against])
        for name, module in sides.items():
            epoch = statistics.median(cpu[name])
            print(f"| {name} | {state_bytes(module, args)} | {epoch:.4f} ({epoch / base:.3f}x) | "
                  f"{epoch / steps * 1e6:.1f} | {statistics.median(resume[name]) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
