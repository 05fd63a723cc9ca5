"""Run a part of the suite N times, optionally under CPU contention; count failures and timeouts per test.

Flakiness is measured, not guessed (issues 5 and 12): ``python -m scripts.stress --repeat N [--load L] [--on WHAT]
[PATHS]`` runs pytest on PATHS (default ``tests/accelerate``, the 2-process Gloo suite) N times, each run through
scripts/launch.py (timeout, stack dumps), while L busy processes (``while True: pass``) compete for the CPUs. WHAT
is the code under test: ``checkouts`` (default: the editable installs, the checkouts as they are), ``base`` (a tree
of each upstream at ``base/<version>``) or ``series`` (a tree with ``patches/<name>/`` applied), the
trees first on ``PYTHONPATH`` as in the gate.

With ``--scenario NAME`` (repeatable) a run is instead one 2-process launch of
``tests/accelerate/accelerate_worker.py`` with only those scenarios (no pytest; timeout SCENARIO_TIMEOUT): a
scenario completed when both ranks wrote its result, failed when a rank recorded an exception, timed out when the
launch was killed before both ranks wrote it. Completed is not passed: what the results must show is asserted by the
tests of tests/accelerate, which this mode does not run (a scenario that reproduces the bug completes).

Each run's JUnit XML is read; a test whose failure says that a launch timed out counts as a timeout, not a
failure. Every launch of a run that timed out (a ``launch.json`` with ``"timed_out": true`` under the run's pytest
temporary directory, as tests/accelerate writes it) is listed with the last scenario each rank finished (its
newest ``<scenario>.rank<N>.json``), and its log, which ends with every process's stacks, is copied to
``<out>/stacks/``. Writes ``<out>/report.{json,md}``. Exit status 0 when every run of every test passed, 1
otherwise.
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from scripts import KitError, launch, runlock, series, sources, worktree
from scripts.gate import grading
from scripts.git import git, rev
from scripts.sources import KIT_ROOT

RUN_TIMEOUT = 900.0  # seconds of one pytest run
SCENARIO_TIMEOUT = 120.0  # seconds of one launch of chosen scenarios; a healthy one takes a few seconds
WORKER = KIT_ROOT / "tests" / "accelerate" / "accelerate_worker.py"
OK = ("passed", "completed")  # a test's good outcome, a scenario's (--scenario)
TIMED_OUT = re.compile(r"'timed_out': True|timed out after")  # tests/accelerate's and pytest_launch's words


@contextlib.contextmanager
def cpu_load(processes: int):
    """``processes`` busy Python loops, killed when the block ends (and if this process is killed)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                              preexec_fn=launch.die_with_parent) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def trees(on: str, root: Path) -> dict[str, tuple[Path, str]]:
    """{upstream: (the directory to put first on PYTHONPATH, what it holds)} for ``--on base|series``; {} for
    ``checkouts``. Raises KitError when a checkout is missing or the series does not apply."""
    found = {}
    if on == "checkouts":
        return found
    for name in sources.names():
        pin, repo = sources.pin(name), KIT_ROOT / "upstream" / name
        base = series.require_base(repo, pin.version)
        worktree.clean(repo, root)
        tree = worktree.add(repo, root / name, base)
        if on == "series":
            failed = worktree.apply_series(tree, series.patch_files(KIT_ROOT / "patches" / name))
            if failed:
                raise KitError(f"{failed} does not apply to {name} {base}: run `make apply` to see why")
        found[name] = (worktree.package_dir(tree, pin.package.replace("-", "_")), f"{on} {rev(tree)[:12]}")
    return found


def hung_launches(tmp: Path, run: int, out: Path) -> list[dict]:
    """The launches under ``tmp`` that timed out: {"run", "launch", "last_scenario": {rank: name}, "stacks"}; each
    one's log is copied to ``out/stacks/``."""
    hung = []
    for summary in sorted(tmp.rglob("launch.json")):
        with contextlib.suppress(OSError, ValueError):
            if not json.loads(summary.read_text()).get("timed_out"):
                continue
            directory, last = summary.parent, {}
            for rank in (0, 1):
                files = sorted(directory.glob(f"*.rank{rank}.json"), key=lambda p: p.stat().st_mtime)
                last[rank] = files[-1].name.removesuffix(f".rank{rank}.json") if files else "(none)"
            target = out / "stacks" / f"run-{run}-{directory.name}.log"
            target.parent.mkdir(parents=True, exist_ok=True)
            if (directory / "launch.log").exists():
                shutil.copyfile(directory / "launch.log", target)
            hung.append({"run": run, "launch": directory.name, "last_scenario": last,
                         "stacks": target.relative_to(out).as_posix()})
    return hung


def run_scenarios(scenarios: list[str], run: int, out: Path, env: dict) -> tuple[dict[str, str], float, list[dict]]:
    """One launch of the worker with ``scenarios``: ({scenario: completed|failed|timeout}, wall s, hung launches)."""
    directory = out / "runs" / f"{run}-tmp" / "accelerate-scenarios"
    directory.mkdir(parents=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
               str(directory), *scenarios]
    result = launch.run(command, directory / "launch.log", SCENARIO_TIMEOUT, cwd=directory,
                        env={**env, "OMP_NUM_THREADS": "1"})
    (directory / "launch.json").write_text(json.dumps({"timed_out": result.timed_out}))
    outcomes = {}
    for scenario in scenarios:
        files = [directory / f"{scenario}.rank{rank}.json" for rank in (0, 1)]
        if not all(f.exists() for f in files):
            outcomes[scenario] = "timeout" if result.timed_out else "failed"
        else:
            outcomes[scenario] = "failed" if any("error" in json.loads(f.read_text()) for f in files) else "completed"
    return outcomes, result.seconds, hung_launches(directory.parent, run, out)


def classify(result: grading.Result) -> str:
    """``passed``, ``timeout`` (the failure says a launch timed out), ``failed``, ``error`` or ``skipped``."""
    if result.outcome != "passed" and TIMED_OUT.search(result.message + result.text):
        return "timeout"
    return result.outcome


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.stress", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--load", type=int, default=0, help="busy processes competing for the CPUs (default 0)")
    parser.add_argument("--on", choices=("checkouts", "base", "series"), default="checkouts",
                        help="the code under test (default: the checkouts as they are)")
    parser.add_argument("--jobs", default="auto", help="pytest-xdist workers per run ('0': none)")
    parser.add_argument("--out", type=Path, default=KIT_ROOT / "build" / "stress")
    parser.add_argument("--scenario", action="append", default=[],
                        help="launch tests/accelerate's worker with only this scenario (repeatable), without pytest")
    parser.add_argument("paths", nargs="*", default=["tests/accelerate"])
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    """Run, tally, report; return the exit status (1 with one line on stderr on a KitError)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    counts: dict[str, Counter] = {}
    regression, hung, walls = set(), [], []
    try:
        under_test = trees(args.on, args.out / "trees")
        code = {name: where for name, (_, where) in under_test.items()} or checkouts()
        env = dict(os.environ)
        if under_test:
            env["PYTHONPATH"] = os.pathsep.join([*(str(path) for path, _ in under_test.values()), str(KIT_ROOT)])
        with cpu_load(args.load):
            for run in range(1, args.repeat + 1):
                if args.scenario:
                    outcomes, seconds, found = run_scenarios(args.scenario, run, args.out, env)
                    walls.append(seconds)
                    hung += found
                    for scenario, outcome in outcomes.items():
                        counts.setdefault(scenario, Counter())[outcome] += 1
                    print(f"stress run {run}/{args.repeat}: " + ", ".join(f"{k} {v}" for k, v in outcomes.items())
                          + f" in {seconds} s", flush=True)
                    write_report(args, counts, regression, hung, walls, code)
                    continue
                xml, tmp = args.out / "runs" / f"{run}.xml", args.out / "runs" / f"{run}-tmp"
                command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "scripts.pytest_regression",
                           "-o", "junit_family=xunit1", f"--junitxml={xml}", f"--basetemp={tmp}", "-q"]
                command += (["-n", args.jobs] if args.jobs != "0" else []) + args.paths
                result = launch.run(command, args.out / "runs" / f"{run}.log", RUN_TIMEOUT, cwd=KIT_ROOT, env=env)
                walls.append(result.seconds)
                if result.timed_out:
                    raise KitError(f"run {run} timed out after {RUN_TIMEOUT:.0f} s; stacks in {result.log}")
                results = grading.read_junit(xml)
                for key, r in results.items():
                    counts.setdefault(key, Counter())[classify(r)] += 1
                    if r.regression:
                        regression.add(key)
                hung += hung_launches(tmp, run, args.out)
                shutil.rmtree(tmp, ignore_errors=True)
                bad = Counter(classify(r) for r in results.values() if r.outcome != "passed")
                print(f"stress run {run}/{args.repeat}: {len(results) - sum(bad.values())} of {len(results)} passed"
                      + "".join(f", {n} {kind}" for kind, n in sorted(bad.items())) + f" in {result.seconds} s",
                      flush=True)
                write_report(args, counts, regression, hung, walls, code)
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for name in sources.names():
            worktree.remove(args.out / "trees" / name)
    timeouts = sum(c["timeout"] for c in counts.values())
    doc = write_report(args, counts, regression, hung, walls, code)
    print(f"stress: {doc['not_passed']} test results not passed ({timeouts} of them timeouts) in {len(walls)} runs "
          f"of {len(counts)} tests under load {args.load}, {len(hung)} launches hung; report in "
          f"{os.path.relpath(args.out)}/report.md")
    return 0 if doc["not_passed"] == 0 and len(walls) == args.repeat else 1


def write_report(args: argparse.Namespace, counts: dict, regression: set, hung: list, walls: list, code: dict) -> dict:
    """Write ``report.json`` and ``report.md`` of the runs so far (after every run, so a stopped stress keeps its
    figures); return the JSON document."""
    doc = {"repeat": args.repeat, "runs_done": len(walls), "load": args.load, "on": args.on,
           "paths": args.scenario or args.paths, "scenarios": bool(args.scenario), "code": code, "wall_s": walls,
           "tests": {key: dict(counts[key]) | {"regression": key in regression} for key in sorted(counts)},
           "hung_launches": hung,
           "not_passed": sum(n for c in counts.values() for kind, n in c.items() if kind not in OK)}
    (args.out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "report.md").write_text(markdown(doc))
    return doc


def checkouts() -> dict[str, str]:
    """{upstream: "<branch> <commit>"} of the checkouts as they are."""
    found = {}
    for name in sources.names():
        repo = KIT_ROOT / "upstream" / name
        if (repo / ".git").is_dir():
            found[name] = f"checkout {git(repo, 'rev-parse', '--abbrev-ref', 'HEAD').stdout.strip()} {rev(repo)[:12]}"
    return found


def markdown(doc: dict) -> str:
    """The report: per test (or scenario: completed), runs passed, failed, timed out and other; then the launches
    that hung."""
    ok = "completed" if doc["scenarios"] else "passed"
    md = [f"# Stress: {' '.join(doc['paths'])}, {doc['runs_done']} of {doc['repeat']} runs, load {doc['load']}", "",
          "Code under test: " + ", ".join(f"{name} `{where}`" for name, where in doc["code"].items()), "",
          f"Test results not passed in total: {doc['not_passed']}; wall time per run (s): {doc['wall_s']}", "",
          f"| test | regression | {ok} | failed | timeout | other |", "|---|---|---|---|---|---|"]
    for key, c in doc["tests"].items():
        other = sum(n for kind, n in c.items() if kind not in (ok, "failed", "timeout", "regression"))
        md.append(f"| `{key}` | {'yes' if c['regression'] else ''} | {c.get(ok, 0)} | {c.get('failed', 0)} | "
                  f"{c.get('timeout', 0)} | {other} |")
    if doc["hung_launches"]:
        md += ["", "Launches that timed out (the last scenario each rank finished; the log ends with the stacks):", ""]
        md += [f"- run {h['run']}: {h['launch']}: " + ", ".join(f"rank {r} after `{s}`"
                                                                 for r, s in h["last_scenario"].items())
               + f" ([stacks]({h['stacks']}))" for h in doc["hung_launches"]]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    sys.exit(runlock.interruptible(main))  # Ctrl-C: exit 130, no traceback, one line on the checkouts
