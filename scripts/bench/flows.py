"""The flow table's cost (issues 39 and 52): ``make test`` with and without the flow table after a one-line edit to
each upstream's series, and cold; and ``make flows`` (pairwise and ``FULL=1``) cold and after such an edit.

``make test``'s own pytest command runs five times in one repetition: ``cold``, every column of the flow table and
every side of the stored histories run (``FLOWS_CACHE=0``, which stores them anew); then for each upstream, ``edit
<upstream>``, as after a one-line change to that upstream's series (a copy of its package as the checkout holds it,
one comment line added, first on ``PYTHONPATH``: ``edited``), so that its series columns and the series sides of its
stored histories run and everything else is reused from ``build/flows-cache/`` (``scripts/flows/cache.py``,
``scripts/histories/cache.py``); and ``without <upstream>``, the same after another such edit, without the flow
table's tests (``--ignore=tests/flows``): what the suite costs after that edit anyway. ``cold`` comes first; the
others follow in an order that turns with each repetition. Wall and CPU time (user + system of the whole process tree)
give the ratios ``edit`` / ``without`` (the flow table's cost after an edit) and ``cold`` / ``without``. Then, unless
``--no-flows-tables``, ``python -m scripts.flows`` cold (``--no-cache``) and after an edit of each upstream, for every
pair of levels and for every triple (``--full``); their reports land in ``<out>/flows-*/`` (``build/flows/``, which the
gate and ``make pr`` cite, stays).
"""

import argparse
import os
import shutil
from pathlib import Path

from scripts import launch, sources
from scripts.bench.common import BenchError
from scripts.bench.gate import children_cpu
from scripts.flows import KINDS
from scripts.flows.run import series_package

UPSTREAMS = sorted(KINDS)


def _timed(args: argparse.Namespace, label: str, command: list[str], timeout: float, env: dict | None = None) -> dict:
    cpu = children_cpu()
    run = launch.run(command, args.out / "logs" / f"{label}.log", timeout, cwd=sources.KIT_ROOT,
                     env={**os.environ, **(env or {})})
    if run.timed_out:
        raise BenchError(f"{label} timed out after {timeout:.0f} s (killed); log {run.log}")
    return {"seconds": round(run.seconds, 1), "cpu_s": round(children_cpu() - cpu, 1), "exit": run.returncode}


def edited(name: str, folder: Path, line: str) -> dict:
    """The environment of a run after a one-line edit to upstream ``name``'s series: a copy of its package as this
    Python imports it (the checkout, uncommitted edits included) in ``folder``, ``line`` appended to its
    ``__init__.py`` as a comment, first on ``PYTHONPATH``. Raises KitError when the package cannot be found."""
    package = series_package(name)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(package, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    init = folder / name / "__init__.py"
    init.write_text(init.read_text() + f"# {line}\n")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p),
            "FLOWS_CACHE": "1"}


def bench_flows(args: argparse.Namespace) -> dict:
    """{"test": [{"cold", "edit <upstream>", "without <upstream>"...: {...}} per repetition], "flows": {"pairwise" |
    "full": {"cold", "edit <upstream>"...: {...}}}} (no table with ``args.flows_tables`` false): each {"seconds",
    "cpu_s", "exit"}."""
    jobs = str(2 * len(os.sched_getaffinity(0)))
    pytest = [str(args.python), "-m", "pytest", "-q", "-n", jobs, "--dist", "loadgroup", "tests"]
    later = [f"{how} {name}" for name in UPSTREAMS for how in ("edit", "without")]
    repetitions = []
    for index in range(args.flows_repeat):
        measured = {}
        for label in ["cold", *later[index % len(later):], *later[:index % len(later)]]:
            print(f"bench: flows: make test, {label} ({index + 1}/{args.flows_repeat})", flush=True)
            command, env = pytest, {"FLOWS_CACHE": "0"}
            if label != "cold":  # an edit of its own: the other run's stored series sides do not answer this one
                how, name = label.split(" ")
                command = [*pytest, "--ignore=tests/flows"] if how == "without" else pytest
                env = edited(name, args.out / "edited" / name, f"a one-line edit (make bench, {label}, {index})")
            measured[label] = _timed(args, f"test-{label.replace(' ', '-')}-{index}", command, args.gate_timeout, env)
        repetitions.append(measured)
    tables = {}
    for selection, extra in (("pairwise", []), ("full", ["--full"])) if args.flows_tables else ():
        tables[selection] = {}
        out = args.out / f"flows-{selection}"
        for label in ("cold", *(f"edit {name}" for name in UPSTREAMS)):
            print(f"bench: flows: make flows{' FULL=1' if extra else ''}, {label}", flush=True)
            name = label.removeprefix("edit ")
            env = {} if label == "cold" else edited(name, args.out / "edited" / name,
                                                    f"a one-line edit (make bench, make flows {selection})")
            tables[selection][label] = _timed(args, f"flows-{selection}-{label.replace(' ', '-')}", [
                str(args.python), "-m", "scripts.flows", *extra, *(["--no-cache"] if label == "cold" else []),
                "--out", str(out)], args.gate_timeout * 2, env)
            shutil.rmtree(out / "work", ignore_errors=True)
    return {"test": repetitions, "flows": tables}


def _ratio(a: dict, b: dict) -> str:
    return f"{a['seconds'] / b['seconds']:.2f}, {a['cpu_s'] / b['cpu_s']:.2f}"


def flows_markdown(f: dict) -> list[str]:
    """The part's tables."""
    edits = [f"edit {name}" for name in UPSTREAMS]
    runs = ["cold", *(f"{how} {name}" for name in UPSTREAMS for how in ("edit", "without"))]
    md = ["## The flow table's cost", "", "`make test`'s pytest command, whole with every column run (cold); and "
          "after a one-line edit to one upstream's series, whole (edit: that upstream's series columns and the "
          "series sides of its stored histories run, the rest reused) and without `tests/flows` (without, after "
          "another such edit):", "",
          "| repetition | " + " | ".join(f"{k}: wall / CPU s" for k in runs) + " | "
          + " | ".join(f"{k} / without {k[5:]}: wall, CPU" for k in edits) + " | exit |",
          "|---" * (2 + len(runs) + len(edits)) + "|"]
    for index, r in enumerate(f["test"]):
        md.append(f"| {index + 1} | " + " | ".join(f"{r[k]['seconds']} / {r[k]['cpu_s']}" for k in runs) + " | "
                  + " | ".join(_ratio(r[k], r[f"without {k[5:]}"]) for k in edits) + " | "
                  + ", ".join(str(r[k]["exit"]) for k in runs) + " |")
    if f["flows"]:
        md += ["", "`make flows`, cold (`FLOWS_CACHE=0`) and after a one-line edit to one upstream's series:", "",
               "| selection | cold: wall / CPU s | " + " | ".join(f"{k}: wall / CPU s" for k in edits) + " | "
               + " | ".join(f"{k} / cold: wall, CPU" for k in edits) + " | exit |",
               "|---" * (3 + 2 * len(edits)) + "|"]
    for selection, t in f["flows"].items():
        md.append(f"| {'FULL=1' if selection == 'full' else 'pairwise'} | "
                  + " | ".join(f"{t[k]['seconds']} / {t[k]['cpu_s']}" for k in ("cold", *edits)) + " | "
                  + " | ".join(_ratio(t[k], t["cold"]) for k in edits) + " | "
                  + ", ".join(str(t[k]["exit"]) for k in ("cold", *edits)) + " |")
    return [*md, ""]
