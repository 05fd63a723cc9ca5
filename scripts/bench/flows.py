"""The flow table's cost (issue 39): ``make test`` with and without its pairwise flows, and ``make flows FULL=1``.

``make test``'s own pytest command is run twice in one repetition, once without the flow table's tests
(``--ignore=tests/flows``) and once whole, alternating which comes first; its wall and CPU time (user + system of the
whole process tree) give the ratio with / without. Then one ``python -m scripts.flows --full`` (every triple of
levels), whose report lands in ``<out>/flows-full/`` (``build/flows/``, which the gate and ``make pr`` cite, stays).
"""

import argparse
import os
import shutil

from scripts import launch, sources
from scripts.bench.common import BenchError
from scripts.bench.gate import children_cpu


def _timed(args: argparse.Namespace, label: str, command: list[str], timeout: float) -> dict:
    cpu = children_cpu()
    run = launch.run(command, args.out / "logs" / f"{label}.log", timeout, cwd=sources.KIT_ROOT)
    if run.timed_out:
        raise BenchError(f"{label} timed out after {timeout:.0f} s (killed); log {run.log}")
    return {"seconds": round(run.seconds, 1), "cpu_s": round(children_cpu() - cpu, 1), "exit": run.returncode}


def bench_flows(args: argparse.Namespace) -> dict:
    """{"test": [{"without": {...}, "with": {...}} per repetition], "full": {...}}: seconds, CPU seconds, exit."""
    jobs = str(2 * len(os.sched_getaffinity(0)))
    pytest = [str(args.python), "-m", "pytest", "-q", "-n", jobs, "--dist", "loadgroup", "tests"]
    repetitions = []
    for index in range(args.flows_repeat):
        pair = {}
        order = ("without", "with") if index % 2 == 0 else ("with", "without")
        for label in order:
            extra = ["--ignore=tests/flows"] if label == "without" else []
            print(f"bench: flows: make test {label} the flow table ({index + 1}/{args.flows_repeat})", flush=True)
            pair[label] = _timed(args, f"test-{label}-flows-{index}", [*pytest, *extra], args.gate_timeout)
        repetitions.append(pair)
    print("bench: flows: make flows FULL=1", flush=True)
    full = _timed(args, "flows-full", [str(args.python), "-m", "scripts.flows", "--full", "--out",
                                       str(args.out / "flows-full")], args.gate_timeout * 2)
    shutil.rmtree(args.out / "flows-full" / "work", ignore_errors=True)
    return {"test": repetitions, "full": full}


def flows_markdown(f: dict) -> list[str]:
    """The part's tables."""
    md = ["## The flow table's cost", "", "`make test`'s pytest command without `tests/flows` and whole, alternating:",
          "", "| repetition | without: wall / CPU s | with: wall / CPU s | with / without: wall, CPU | exit |",
          "|---|---|---|---|---|"]
    for index, pair in enumerate(f["test"]):
        a, b = pair["without"], pair["with"]
        md.append(f"| {index + 1} | {a['seconds']} / {a['cpu_s']} | {b['seconds']} / {b['cpu_s']} | "
                  f"{b['seconds'] / a['seconds']:.2f}, {b['cpu_s'] / a['cpu_s']:.2f} | {a['exit']}, {b['exit']} |")
    full = f["full"]
    md += ["", f"`make flows FULL=1`: {full['seconds']} s wall, {full['cpu_s']} s CPU, exit {full['exit']} (its "
           "report: `flows-full/` beside this one).", ""]
    return md
