"""Run a part of the suite N times on the checkouts as they are; count failures per test.

Flakiness is measured, not guessed (issue 5): ``python -m scripts.stress --repeat N [PATHS]`` runs pytest on
PATHS (default ``tests/accelerate``, the 2-process Gloo suite) N times, reads each run's JUnit XML, and
writes ``build/stress/report.{json,md}``: per test, how many runs passed and how many did not. Exit status 0
when every run of every test passed, 1 otherwise.
"""

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from scripts import KitError, sources
from scripts.checkout import git, rev
from scripts.gate import pytest_command, read_junit
from scripts.sources import KIT_ROOT


def main(argv: list[str] | None = None) -> int:
    """Parse ``--repeat N``, ``--jobs``, ``--out`` and PATHS; run, tally, report; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m scripts.stress", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--jobs", default="auto")
    parser.add_argument("--out", type=Path, default=KIT_ROOT / "build" / "stress")
    parser.add_argument("paths", nargs="*", default=["tests/accelerate"])
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    passed, other, walls = Counter(), Counter(), []
    for run in range(1, args.repeat + 1):
        xml = args.out / f"run-{run}.xml"
        started = time.monotonic()
        subprocess.run(pytest_command(sys.executable, xml.resolve(), args.jobs, args.paths, True), cwd=KIT_ROOT,
                       stdout=subprocess.DEVNULL)
        walls.append(round(time.monotonic() - started, 1))
        try:
            results = read_junit(xml)
        except KitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        for key, result in results.items():
            (passed if result.outcome == "passed" else other)[key] += 1
        print(f"stress run {run}/{args.repeat}: {sum(r.outcome != 'passed' for r in results.values())} not passed "
              f"of {len(results)} in {walls[-1]} s", flush=True)
    tests = {key: {"passed": passed[key], "not_passed": other[key]} for key in sorted(set(passed) | set(other))}
    repos = {name: KIT_ROOT / "upstream" / name for name in sources.names()}
    commits = {name: f"{git(repo, 'rev-parse', '--abbrev-ref', 'HEAD').stdout.strip()} {rev(repo)[:12]}"
               for name, repo in repos.items() if (repo / ".git").is_dir()}
    doc = {"repeat": args.repeat, "paths": args.paths, "checkouts": commits, "wall_s": walls, "tests": tests,
           "failures": sum(other.values())}
    (args.out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = [f"# Stress: {' '.join(args.paths)} x {args.repeat}", "",
          "Checkouts: " + ", ".join(f"{name} `{where}`" for name, where in commits.items()), "",
          f"Runs not passed in total: {doc['failures']}; wall time per run (s): {walls}", "",
          "| test | passed | not passed |", "|---|---|---|"]
    md += [f"| `{k}` | {v['passed']} | {v['not_passed']} |" for k, v in tests.items()]
    (args.out / "report.md").write_text("\n".join(md) + "\n")
    print(f"stress: {doc['failures']} failures in {args.repeat} runs of {len(tests)} tests; "
          f"report in {args.out}/report.md")
    return 0 if doc["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
