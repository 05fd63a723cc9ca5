"""``make fuzz``: search histories of Accelerate and DeepSpeed jobs for ``--seconds`` and store what it finds.

Prints the histories run, the flows found and the seed (``--seed`` draws a search's histories again, given the
same stored kinds of finding and a budget that reaches as many rounds). A found history, shrunk, is added to
``tests/histories/<upstream>.json`` (``--no-store``: only reported) and to ``build/histories/found.json``, which
``build/histories/report.md`` says in words (``scripts/histories/report.py``; ``--render`` writes it again from
``found.json``, running nothing). Exits 1 when it found a regression, 2 on a usage error or when the servers cannot
run.
"""

import json
import random
import sys
import time
from pathlib import Path

from scripts import ArgumentParser, KitError, launch
from scripts.flows.__main__ import about
from scripts.histories import report as words
from scripts.histories import search, stored
from scripts.histories.servers import JOBS, for_sides
from scripts.sources import KIT_ROOT

OUT = KIT_ROOT / "build" / "histories"
UPSTREAMS = tuple(JOBS)


def fuzz(upstream: str, seconds: float, seed: int, known: set, work: Path) -> dict:
    """One upstream's search (``search.search``) on servers started for it and ended after it."""
    servers = {}
    try:
        servers = for_sides(upstream, work / upstream)
        return search.search(upstream, servers, work / upstream / "checkpoints", seconds, seed, known,
                             say=lambda line: print(f"{line[:6]}{upstream}: {line[6:]}", flush=True))
    finally:
        for group in servers.values():
            group.close()


def write_report(out: Path, found: dict) -> Path:
    """Write ``out/report.md`` from ``found`` (the record of a search, as ``found.json`` holds it), the stored
    histories and what each upstream's sides are now; returns its path."""
    upstreams = [u for u in UPSTREAMS if u in found]
    path = out / "report.md"
    path.write_text(words.markdown(found, {u: stored.load(u) for u in upstreams}, {u: about(u) for u in upstreams}))
    return path


def main(argv: list[str]) -> int:
    parser = ArgumentParser(prog="make fuzz", description=__doc__)
    parser.add_argument("--seconds", type=float, default=600, help="the search's budget, shared by the upstreams "
                                                                   "(default 600)")
    parser.add_argument("--seed", type=int, default=None, help="replay the search of this seed (default: a new one)")
    parser.add_argument("--only", choices=UPSTREAMS, action="append", help="this upstream only")
    parser.add_argument("--no-store", action="store_true", help="do not add what it finds to tests/histories/")
    parser.add_argument("--ignore-stored", action="store_true",
                        help="search as if nothing were stored: a kind of finding stored as known or accepted stops "
                             "it again")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the report goes (default {OUT})")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: write report.md again from found.json in --out")
    args = parser.parse_args(argv)
    if args.render:
        try:
            found = json.loads((args.out / "found.json").read_text())
            print(f"{write_report(args.out, found)} written again from found.json")
        except (OSError, ValueError, KitError) as e:
            print(f"error: make fuzz: {args.out / 'found.json'} cannot be rendered ({e}): run make fuzz",
                  file=sys.stderr)
            return 2
        return 0
    upstreams = args.only or list(UPSTREAMS)
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    seconds = args.seconds / len(upstreams)
    print(f"fuzz: seed {seed}, {args.seconds:.0f} s ({seconds:.0f} s for each of {', '.join(upstreams)}); replay: "
          f"make fuzz FUZZ_SEED={seed} FUZZ_SECONDS={args.seconds:.0f}", flush=True)
    report, regressions = {"seed": seed, "budget": args.seconds}, 0
    for upstream in upstreams:
        known = set() if args.ignore_stored else stored.known(stored.load(upstream))
        print(f"fuzz: {upstream}: {len(known)} kinds of finding stored as known or accepted", flush=True)
        started, cpu = time.monotonic(), time.process_time()
        try:
            with launch.sigterm_as_interrupt():
                result = fuzz(upstream, seconds, seed, set(known), args.out / "work")
        except KitError as e:
            print(f"error: make fuzz: {e}", file=sys.stderr)
            return 2
        (args.out / f"found-{upstream}.json").parent.mkdir(parents=True, exist_ok=True)
        (args.out / f"found-{upstream}.json").write_text(json.dumps(result, indent=1))  # before anything can fail
        entries = [stored.entry_of(upstream, f["record"], f["findings"], f"make fuzz FUZZ_SEED={seed}, after "
                                                                         f"{f['after']} histories, {f['seconds']} s")
                   for f in result["found"]]
        added = [] if args.no_store else stored.add(upstream, entries)
        report[upstream] = {**result, "entries": entries}
        for entry in entries:
            print(f"fuzz: found {entry['id']} ({', '.join(entry['signatures'])}): {entry['words']}")
        minutes = (time.monotonic() - started) / 60
        print(f"fuzz: {upstream}: {result['histories']} histories in {minutes:.1f} min "
              f"({result['histories'] / max(minutes, 1e-9):.1f} a minute, shrinking's replays included), "
              f"{len(entries)} regressions found, {len(added)} stored in {stored.path(upstream)}; seed {seed} "
              f"(controller CPU {time.process_time() - cpu:.0f} s)", flush=True)
        regressions += len(entries)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "found.json").write_text(json.dumps(report, indent=1))
    print(f"fuzz: report in {write_report(args.out, report)}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
