"""``make flows``: run the flow table of each upstream on its release and its series, and write ``build/flows/``.

Exits 1 when a flow is a regression that ``tests/flows/differences.toml`` does not list, 2 on a usage error or when
the flows cannot be run (one line saying what to do). ``--render`` runs nothing: it writes the reports again from
``build/flows/<name>.json`` (the report is a function of the recorded rows), e.g. after a change to the report's code.
"""

import importlib.metadata
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from scripts import ArgumentParser, KitError, series, sources, stack
from scripts import flows as table
from scripts.flows import judge, report, run
from scripts.git import git, rev
from scripts.sources import KIT_ROOT

OUT = KIT_ROOT / "build" / "flows"  # the report the gate and make pr cite
# AT, as make help and the README say it
AT_HELP = ("the commit of each checkout that runs as the series (default HEAD), the same rev for both: HEAD~1 is each "
           "stack without its last commit; Accelerate's first commit alone is HEAD~4 (a stack of 5), DeepSpeed's "
           "HEAD~7 (a stack of 8); one upstream alone: python -m scripts.flows --only deepspeed --at HEAD~7")


def uncommitted(name: str) -> list[str]:
    """The paths ``git status`` names in the checkout of ``name`` (the series that ran is not its HEAD then)."""
    lines = git(KIT_ROOT / "upstream" / name, "status", "--porcelain", check=False).stdout.splitlines()
    return [line[3:] for line in lines if line.strip()]


def about(name: str, head: str = "HEAD") -> dict:
    """What the report says of upstream ``name`` beyond its rows: ``release`` (the version installed, whose
    ``base/<version>`` the release column ran; else the default pin of ``upstream/sources.toml``), ``url`` (the
    upstream's git URL there), ``environment`` (Python, torch, torchdata and numpy where installed, the CPU cores) and
    ``stack``: the commits from the base to ``head`` in the checkout (else every patch of ``patches/<name>/``), each
    with its ``subject`` and, from ``[[<name>.gate.commits]]``, its ``key`` (an upstream issue number, or the slug of a
    follow-up) and ``proposal_on`` (the open PR it is offered to)."""
    pins = sources.load()[name]
    try:
        release = run.release_version(name)
    except importlib.metadata.PackageNotFoundError:
        release = pins["version"]
    checkout = KIT_ROOT / "upstream" / name
    logged = git(checkout, "log", "--reverse", "--format=%s", f"base/{release}..{head}", check=False) if (
        checkout.is_dir()) else None
    subjects = (logged.stdout.splitlines() if logged and logged.returncode == 0 else
                [stack.subject(p) for p in series.patch_files(KIT_ROOT / "patches" / name)])
    commits = pins.get("gate", {}).get("commits", [])
    libraries = []
    for library in ("torch", "torchdata", "numpy"):
        try:
            libraries.append(f"{library} {importlib.metadata.version(library)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    environment = f"Python {platform.python_version()}, {', '.join(libraries)}, CPU, {os.cpu_count()} cores"
    return {"release": release, "url": pins.get("git", ""), "environment": environment,
            "stack": [{"subject": subject, "key": commits[n]["key"] if n < len(commits) else str(n + 1),
                       "proposal_on": commits[n].get("proposal_on") if n < len(commits) else None}
                      for n, subject in enumerate(subjects)]}


def write(out: Path, doc: dict) -> None:
    """Write ``doc`` (``report.document``) as ``<name>.json``, and its reports ``<name>.md`` and
    ``<name>-details.md``, into ``out``."""
    name = doc["upstream"]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{name}.md").write_text(report.markdown(doc, f"{name}-details.md"))
    (out / f"{name}-details.md").write_text(report.details(doc, f"{name}.md"))


def render(name: str, out: Path) -> None:
    """Write the reports of ``out/<name>.json`` again, running nothing: its recorded rows judged as they were; what a
    JSON of an older kit lacks (the release, the stack, the summary lines) is taken from the kit as it is now."""
    path = out / f"{name}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KitError(f"{path} cannot be read ({e}): run make flows") from None
    context = doc.get("about") or about(name, doc.get("series") or "HEAD")
    differences = doc.get("differences") or table.differences(name)
    kept = {key: doc[key] for key in ("series_id", "uncommitted", "at") if key in doc}
    write(out, report.document(name, doc["flows"], doc["selection"], doc["series"], doc.get("unused_differences", []),
                               context, differences) | kept)


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="make flows", description=__doc__)
    parser.add_argument("--only", choices=sorted(table.KINDS), action="append", help="this upstream only")
    parser.add_argument("--full", action="store_true", help="every triple of levels, not every pair")
    parser.add_argument("--jobs", type=int, default=2, help="job servers at work side by side")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the reports go (default {OUT})")
    parser.add_argument("--at", default="", metavar="REV", help=AT_HELP)
    parser.add_argument("--no-cache", action="store_true",
                        help="run every release column, reusing none from build/flows-cache (FLOWS_CACHE=0)")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: write the reports again from their JSON in --out")
    args = parser.parse_args(argv)
    unlisted = 0
    if args.render:
        try:
            for name in args.only or sorted(table.KINDS):
                render(name, args.out)
                print(f"{args.out / name}.md written again from {name}.json")
        except KitError as e:
            print(f"error: make flows: {e}", file=sys.stderr)
            return 2
        return 0
    for name in args.only or sorted(table.KINDS):
        flows = table.selection(name, args.full)
        work = args.out / "work" / name
        shutil.rmtree(work, ignore_errors=True)
        started = time.monotonic()
        try:
            rows = table.judged(name, flows, work, parallel=args.jobs, at=args.at, reuse=not args.no_cache)
        except KitError as e:
            print(f"error: make flows: {e}", file=sys.stderr)
            return 2
        selection = "every triple of levels (strength 3)" if args.full else "every pair of levels (strength 2)"
        differences = table.differences(name)
        counts, unused = judge.summary(rows), judge.unused(rows, differences)
        head = rev(KIT_ROOT / "upstream" / name, args.at or "HEAD")
        series_id = "" if args.at else stack.series_id(series.patch_files(KIT_ROOT / "patches" / name))
        doc = report.document(name, rows, selection, head, unused, about(name, head), differences)
        write(args.out, doc | {"series_id": series_id, "uncommitted": uncommitted(name), "at": args.at})
        print(f"{name} ({time.monotonic() - started:.0f} s; {report.reuse_line(counts)}; {args.out / name}.md)"
              + (f" [the series at {args.at}]" if args.at else "") + ":")
        for line in doc["lines"]:
            print(f"  {line}")
        unlisted += counts["unlisted_regressions"]
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
