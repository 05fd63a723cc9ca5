"""The flow table's cost (issues 39 and 52): ``make test`` without the flow table, cold and after an edit to a
series, and ``make flows`` (pairwise and ``FULL=1``) cold and warm.

``make test``'s own pytest command runs three times in one repetition: ``cold``, every release column run
(``FLOWS_CACHE=0``, which stores them anew); ``edit``, as after a change to a series: the release columns reused from
``build/flows-cache/`` (``scripts/flows/cache.py``; no input of their key is the series, so an edit to a series reuses
them all, as a kit test shows); and ``without`` the flow table's tests (``--ignore=tests/flows``). ``cold`` comes
first; repetitions alternate whether ``without`` or ``edit`` follows it (both then reuse the stored histories' release
sides, ``scripts/histories/cache.py``). Wall and CPU time (user + system of the whole process tree) give the ratios
to ``without``. Then ``python -m scripts.flows`` cold (``--no-cache``) and warm, for every pair of levels and for every
triple (``--full``); their reports land in ``<out>/flows-*/`` (``build/flows/``, which the gate and ``make pr`` cite,
stays).
"""

import argparse
import os
import shutil

from scripts import launch, sources
from scripts.bench.common import BenchError
from scripts.bench.gate import children_cpu


def _timed(args: argparse.Namespace, label: str, command: list[str], timeout: float, env: dict | None = None) -> dict:
    cpu = children_cpu()
    run = launch.run(command, args.out / "logs" / f"{label}.log", timeout, cwd=sources.KIT_ROOT,
                     env={**os.environ, **(env or {})})
    if run.timed_out:
        raise BenchError(f"{label} timed out after {timeout:.0f} s (killed); log {run.log}")
    return {"seconds": round(run.seconds, 1), "cpu_s": round(children_cpu() - cpu, 1), "exit": run.returncode}


def bench_flows(args: argparse.Namespace) -> dict:
    """{"test": [{"without", "cold", "edit": {...}} per repetition], "flows": {"pairwise" | "full": {"cold",
    "warm": {...}}}}: each {"seconds", "cpu_s", "exit"}."""
    jobs = str(2 * len(os.sched_getaffinity(0)))
    pytest = [str(args.python), "-m", "pytest", "-q", "-n", jobs, "--dist", "loadgroup", "tests"]
    runs = {"without": ([*pytest, "--ignore=tests/flows"], {}), "cold": (pytest, {"FLOWS_CACHE": "0"}),
            "edit": (pytest, {"FLOWS_CACHE": "1"})}
    repetitions = []
    for index in range(args.flows_repeat):
        # cold first (it stores the release sides); without then sees the stored histories as edit does
        order = ("cold", "without", "edit") if index % 2 == 0 else ("cold", "edit", "without")
        measured = {}
        for label in order:
            print(f"bench: flows: make test, {label} ({index + 1}/{args.flows_repeat})", flush=True)
            command, env = runs[label]
            measured[label] = _timed(args, f"test-{label}-{index}", command, args.gate_timeout, env)
        repetitions.append(measured)
    tables = {}
    for selection, extra in (("pairwise", []), ("full", ["--full"])):
        tables[selection] = {}
        for state, cache in (("cold", ["--no-cache"]), ("warm", [])):
            print(f"bench: flows: make flows{' FULL=1' if extra else ''}, {state}", flush=True)
            out = args.out / f"flows-{selection}"
            tables[selection][state] = _timed(args, f"flows-{selection}-{state}", [
                str(args.python), "-m", "scripts.flows", *extra, *cache, "--out", str(out)], args.gate_timeout * 2)
            shutil.rmtree(out / "work", ignore_errors=True)
    return {"test": repetitions, "flows": tables}


def _ratio(a: dict, b: dict) -> str:
    return f"{a['seconds'] / b['seconds']:.2f}, {a['cpu_s'] / b['cpu_s']:.2f}"


def flows_markdown(f: dict) -> list[str]:
    """The part's tables."""
    md = ["## The flow table's cost", "", "`make test`'s pytest command without `tests/flows`, whole with every "
          "release column run (cold), and whole right after (edit: the release columns reused, as after a change to "
          "a series):",
          "", "| repetition | without: wall / CPU s | cold: wall / CPU s | edit: wall / CPU s | cold / without: wall, "
          "CPU | edit / without: wall, CPU | exit |", "|---|---|---|---|---|---|---|"]
    for index, r in enumerate(f["test"]):
        md.append(f"| {index + 1} | " + " | ".join(f"{r[k]['seconds']} / {r[k]['cpu_s']}" for k in
                                                   ("without", "cold", "edit"))
                  + f" | {_ratio(r['cold'], r['without'])} | {_ratio(r['edit'], r['without'])} | "
                  + ", ".join(str(r[k]["exit"]) for k in ("without", "cold", "edit")) + " |")
    md += ["", "`make flows`, cold (`FLOWS_CACHE=0`) and warm (the release columns reused):", "",
           "| selection | cold: wall / CPU s | warm: wall / CPU s | warm / cold: wall, CPU | exit |",
           "|---|---|---|---|---|"]
    for selection, t in f["flows"].items():
        md.append(f"| {'FULL=1' if selection == 'full' else 'pairwise'} | {t['cold']['seconds']} / "
                  f"{t['cold']['cpu_s']} | {t['warm']['seconds']} / {t['warm']['cpu_s']} | "
                  f"{_ratio(t['warm'], t['cold'])} | {t['cold']['exit']}, {t['warm']['exit']} |")
    return [*md, ""]
