"""``make flows``: run the flow table of each upstream on its release and its series, and write ``build/flows/``.

Exits 1 when a flow is a regression that ``tests/flows/differences.toml`` does not list, 2 on a usage error or when
the flows cannot be run (one line saying what to do).
"""

import json
import shutil
import sys
import time
from pathlib import Path

from scripts import ArgumentParser, KitError, series, stack
from scripts import flows as table
from scripts.flows import judge, report
from scripts.git import git, rev
from scripts.sources import KIT_ROOT

OUT = KIT_ROOT / "build" / "flows"  # the report the gate and make pr cite


def uncommitted(name: str) -> list[str]:
    """The paths ``git status`` names in the checkout of ``name`` (the series that ran is not its HEAD then)."""
    lines = git(KIT_ROOT / "upstream" / name, "status", "--porcelain", check=False).stdout.splitlines()
    return [line[3:] for line in lines if line.strip()]


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="make flows", description=__doc__)
    parser.add_argument("--only", choices=sorted(table.KINDS), action="append", help="this upstream only")
    parser.add_argument("--full", action="store_true", help="every triple of levels, not every pair")
    parser.add_argument("--jobs", type=int, default=2, help="job servers at work side by side")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the reports go (default {OUT})")
    parser.add_argument("--at", default="", metavar="REV",
                        help="run this commit of each checkout as the series, the same for both (e.g. HEAD~1: each "
                        "stack without its last commit; Accelerate's first of 5 is HEAD~4, DeepSpeed's first of 6 "
                        "HEAD~5)")
    parser.add_argument("--no-cache", action="store_true",
                        help="run every release column, reusing none from build/flows-cache (FLOWS_CACHE=0)")
    args = parser.parse_args(argv)
    unlisted = 0
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
        counts, unused = judge.summary(rows), judge.unused(rows, table.differences(name))
        head = rev(KIT_ROOT / "upstream" / name, args.at or "HEAD")
        series_id = "" if args.at else stack.series_id(series.patch_files(KIT_ROOT / "patches" / name))
        args.out.mkdir(parents=True, exist_ok=True)
        text = report.markdown(name, rows, counts, f"{len(rows)}, {selection}; the series at {head[:12]}", unused)
        (args.out / f"{name}.md").write_text(text)
        doc = report.document(name, rows, selection, head, unused) | {"series_id": series_id,
                                                                        "uncommitted": uncommitted(name)}
        (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1))
        print(f"{report.summary_line(name, counts)} ({time.monotonic() - started:.0f} s; {report.reuse_line(counts)}; "
              f"{args.out / name}.md)"
              + (f" [the series at {args.at}]" if args.at else ""))
        unlisted += counts["unlisted_regressions"]
    return 1 if unlisted else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
