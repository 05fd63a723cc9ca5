"""Benchmarks (issues 7 and 12): what the two fixes cost and save, base and patched side by side, and the gate vs its
floor.

``python -m scripts.bench [options]`` (``make bench BENCH_ARGS=...``) measures, in one run, the parts chosen with
``--only`` (default: accelerate, deepspeed; ``--gate`` adds gate):

- ``accelerate``, ``deepspeed``: items 1-3, base and patched side by side (scripts/bench/upstreams.py);
- ``gate``: item 4, the gate against its floor F, as gate / F (scripts/bench/gate.py); ``profile``
  (``--profile-gate``): where the gate's time goes; ``cold-apply`` (``--cold-apply``): item 5;
- ``flows`` (``--flows``): ``make test`` without the flow table, cold and after a one-line edit to each upstream's
  series, and ``make flows`` cold and after such edits (scripts/bench/flows.py).

The sides, the measurement processes and the figures are described in scripts/bench/common.py.
Output: ``build/bench/report.json`` and ``report.md`` (``--out``), logs of every process in ``<out>/logs/``.
The report and the console end with one verdict (scripts/bench/targets.py). Exit status 0 when every part was
measured and no target is missed (a target within noise does not fail it: the verdict says how many repetitions
would decide it), 1 when a target is not met or on an error (a process failed or timed out, a tree was not the one
asked for, a work tree could not be made; such a part is listed under "Errors" and the other parts still run), 130
on Ctrl-C (the report holds what was measured until then).
"""

import argparse
import contextlib
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from scripts import ArgumentParser, KitError, runlock, sources, worktree
from scripts.bench import flows as bench_flows
from scripts.bench import gate as bench_gate
from scripts.bench import targets
from scripts.bench import upstreams as bench_upstreams
from scripts.bench.common import make_sides

PARTS = ("accelerate", "deepspeed", "gate", "profile", "cold-apply", "flows")
# Defaults that keep `make bench` within 5 minutes on 2 shared cores (issue 22); more with --repeat, --inner, --gate
# and --gate-repeat (the defaults before: 7 repetitions of 5 rounds and 3 of the gate, about 25 minutes).
REPEAT = 3
INNER = 3
GATE_REPEAT = 1


def machine_info() -> dict:
    """nproc, CPU model, kernel, load average (1 min) and the Python running the bench."""
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "cpu": model,
            "kernel": platform.release(), "load_1min_start": round(os.getloadavg()[0], 2),
            "bench_python": platform.python_version()}


def markdown(doc: dict) -> str:
    """The Markdown report of ``doc`` (the JSON document): the verdict and the targets first, then how and where it
    was measured, then each part's figures."""
    m, md = doc["machine"], ["# Benchmarks", ""]
    versions = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    md += [f"Verdict: **{doc['verdict']}**", "",
           *([f"**Interrupted** {doc['interrupted']}: only what was measured until then is below.", ""]
             if doc.get("interrupted") else []),
           "## Targets", "",
           "Each target is judged on its repetitions: met when every one is on the good side of the bound, not met "
           "when every one is on the bad side, within noise otherwise (scripts/bench/targets.py). Figures that are "
           "not targets are in the parts' tables below.", "",
           "| goal | measured: median [range] | verdict |", "|---|---|---|"]
    md += [f"| {t['goal']} | {t['measured']} | {targets.cell(t)} |" for t in doc["targets"]]
    md += ["", f"Command: `{doc['command']}`", "",
           f"Machine: {m['nproc']} cores ({m['cpu']}), kernel {m['kernel']}, load (1 min) {m['load_1min_start']} at "
           f"start and {m['load_1min_end']} at end; venv: {versions}.", "",
           f"Started {doc['started']}, took {doc['wall_s']:.0f} s. Every figure is a median over repetitions; every "
           "ratio patched/base is the median of per-repetition ratios of adjacent base/patched processes "
           "(range in brackets).", ""]
    if doc["errors"]:
        md += ["## Errors (these parts were not measured)", ""] + [f"- {error}" for error in doc["errors"]] + [""]
    md += ["## Sides", "", "| upstream | side | commit | imported from | note |", "|---|---|---|---|---|"]
    for upstream, by_side in doc["sides"].items():
        for name, side in by_side.items():
            modules = ", ".join(f"`{x}`" for x in side["modules"])
            md.append(f"| {upstream} | {name} | `{side['commit'][:12]}` | {modules} | {side['note']} |")
    md.append("")
    sections = (("accelerate", bench_upstreams.accelerate_markdown), ("deepspeed", bench_upstreams.deepspeed_markdown),
                ("gate", bench_gate.gate_markdown), ("gate_profile", bench_gate.profile_markdown),
                ("cold_apply", bench_gate.cold_apply_markdown), ("flows", bench_flows.flows_markdown))
    for key, section in sections:
        if doc.get(key):
            md += section(doc[key])
    return "\n".join(md) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the options; ``--version``/``--patched-from`` become dicts ``versions``/``patched_from``."""
    parser = ArgumentParser(prog="python -m scripts.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=sources.KIT_ROOT / ".venv" / "bin" / "python",
                        help="the venv Python of the measurement processes (default .venv/bin/python)")
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VERSION",
                        help="another pinned release (default: upstream/sources.toml); passed on to the gate")
    parser.add_argument("--only", choices=PARTS, action="append",
                        help="run only these parts (repeatable); default accelerate, deepspeed (and gate with --gate)")
    parser.add_argument("--gate", action="store_true",
                        help="also the gate against its floor F (item 4; a gate run, about 3 minutes more)")
    parser.add_argument("--profile-gate", action="store_true",
                        help="also time the gate's parts: interpreter start, imports, stages one at a time (slow)")
    parser.add_argument("--repeat", type=int, default=REPEAT,
                        help=f"processes per side for items 1-3 (default {REPEAT})")
    parser.add_argument("--inner", type=int, default=INNER,
                        help=f"timed rounds per Accelerate process (default {INNER})")
    parser.add_argument("--samples", type=int, default=8192, help="samples of the Accelerate dataset (default 8192)")
    parser.add_argument("--batch-size", type=int, default=32, help="Accelerate batch size (default 32)")
    parser.add_argument("--steps", type=int, default=5000, help="timed DeepSpeed sampler micro-batches (default 5000)")
    parser.add_argument("--roundtrips", type=int, default=200, help="state round trips per DeepSpeed process")
    parser.add_argument("--flows", action="store_true",
                        help="also make test without the flow table, cold and after a one-line edit to each "
                        "upstream's series, and make flows cold and after such edits (slow)")
    parser.add_argument("--flows-repeat", type=int, default=1,
                        help="make test repetitions of --flows (default 1; 0: make flows only)")
    parser.add_argument("--no-flows-tables", dest="flows_tables", action="store_false",
                        help="--flows measures make test only, not make flows")
    parser.add_argument("--gate-repeat", type=int, default=GATE_REPEAT,
                        help=f"gate and floor repetitions (default {GATE_REPEAT})")
    parser.add_argument("--cold-apply", type=int, nargs="?", const=1, default=0, metavar="N",
                        help="also time `make apply` on a fresh clone N times (default 1 when given; slow)")
    parser.add_argument("--patched-from", action="append", default=[], metavar="NAME=DIR",
                        help="measure the source tree DIR as the patched side of NAME instead of the checkout")
    parser.add_argument("--keep-worktrees", action="store_true", help="leave build/bench/worktrees/ for a next run")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per measurement process (default 600)")
    parser.add_argument("--gate-timeout", type=float, default=3600,
                        help="seconds per gate / cold apply run (a cold gate took 2465 s at a load of 20)")
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--out", type=Path, default=sources.KIT_ROOT / "build" / "bench")
    args = parser.parse_args(argv)
    args.versions = sources.versions(args.version)
    args.interrupted = ""  # set by a part that Ctrl-C cut short: where it stopped
    args.patched_from = {n: Path(d) for n, _, d in (p.partition("=") for p in args.patched_from)}
    args.parts = (set(args.only or ("accelerate", "deepspeed")) | ({"gate"} if args.gate else set())
                  | ({"profile"} if args.profile_gate else set()) | ({"flows"} if args.flows else set()))
    if args.cold_apply:
        args.parts.add("cold-apply")
    args.cold_apply = args.cold_apply or ("cold-apply" in args.parts)
    args.out, args.python = args.out.resolve(), args.python.absolute()
    return args


def main(argv: list[str] | None = None) -> int:
    """Measure, write ``report.json`` and ``report.md``; return 0, or 1 after printing an error."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started, started_at = time.monotonic(), time.strftime("%Y-%m-%d %H:%M:%S %z")
    command = shlex.join([os.path.relpath(sys.executable, sources.KIT_ROOT), "-m", "scripts.bench", *argv])
    if os.environ.get("MAKELEVEL"):
        command = f"make bench (runs: {command})"
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"command": command, "started": started_at, "machine": machine_info(), "sides": {}, "versions": {},
           "errors": []}
    sides: dict = {}
    try:
        for name in ("accelerate", "deepspeed"):
            sides[name] = make_sides(args, name)
        print(f"bench: parts {', '.join(sorted(args.parts))}; {args.repeat} repetitions per side"
              f"{f', {args.gate_repeat} of the gate' if 'gate' in args.parts else ''} (more: make bench "
              "BENCH_ARGS='--repeat N --gate --gate-repeat N')", flush=True)
        parts = [("accelerate", "accelerate", lambda: bench_upstreams.bench_accelerate(args, sides["accelerate"])),
                 ("deepspeed", "deepspeed", lambda: bench_upstreams.bench_deepspeed(args, sides["deepspeed"])),
                 ("gate", "gate", lambda: bench_gate.bench_gate(args, sides)),
                 ("gate_profile", "profile", lambda: bench_gate.bench_gate_profile(args)),
                 ("cold_apply", "cold-apply", lambda: bench_gate.bench_cold_apply(args)),
                 ("flows", "flows", lambda: bench_flows.bench_flows(args))]
        for key, part, measure in parts:
            if part in args.parts:
                try:
                    doc[key] = measure()
                except KitError as e:  # reported, and the other parts still run
                    print(f"error: {e}", file=sys.stderr)
                    doc["errors"].append(f"{key}: {e}")
                if args.interrupted:  # a part cut short by Ctrl-C returned what it measured: the report says so
                    break
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # before a part had a complete repetition: the parts done so far are reported
        args.interrupted = args.interrupted or "before the first complete repetition of the part under way"
    finally:
        if not args.keep_worktrees:
            worktree.remove(args.out / "worktrees")
        worktree.remove(args.out / "gate" / "trees")  # of a gate run that was killed
    doc["sides"] = {name: {side.name: side.describe() for side in by_side.values()} for name, by_side in sides.items()}
    for part in ("accelerate", "deepspeed"):
        doc["versions"].update(doc.get(part, {}).get("versions", {}))
    doc["machine"]["load_1min_end"] = round(os.getloadavg()[0], 2)
    doc["wall_s"] = round(time.monotonic() - started, 1)
    doc["targets"] = targets.targets(doc)
    doc["interrupted"] = args.interrupted
    doc["verdict"], failed = targets.overall(doc["targets"], doc["errors"], args.interrupted)
    (args.out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "report.md").write_text(markdown(doc))
    if args.interrupted:
        print(f"bench: interrupted {args.interrupted}; what was measured until then is in "
              f"{os.path.relpath(args.out)}/report.md ({doc['wall_s']:.0f} s)", file=sys.stderr)
        return 130
    print(f"bench: report in {os.path.relpath(args.out)}/report.md ({doc['wall_s']:.0f} s)")
    for row in doc["targets"]:
        print(f"  {targets.cell(row)}: {row['goal']}: {row['measured']}")
    print(f"bench: {doc['verdict']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(runlock.interruptible(main))  # Ctrl-C: exit 130, no traceback, one line on the checkouts
