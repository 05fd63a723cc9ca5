"""``make bench`` items 4 and 5: the gate against its floor F, where the gate's time goes, and a cold ``make apply``.

4. The gate (``python -m scripts.gate``, what ``make gate`` runs) against its floor F: the wall time of the bare
   reproductions of the bugs the series fix, one per pull request (issue 21), each in fresh processes on the base
   work trees: the DeepSpeed #8787 resume, its follow-ups (``cluster-files``, ``io-workers``, ``consumed-samples``;
   their bug reports in docs/issues/), one Python process each, and one 2-process Accelerate launch
   (``torch.distributed.run --standalone --nproc_per_node=2``); reported as gate / F,
   with the gate's per-stage figures from its own report (wall time of each stage's pytest, and of it the seconds
   the JUnit XML gives the kit's tests and the upstream tests; the rest is interpreter start, imports, collection).
   ``--profile-gate`` adds the parts alone: interpreter start, the imports, the gate with its stages one after the
   other (``--jobs 1``), and tests/accelerate's 2-process launch alone with the time of each scenario.
5. ``--cold-apply``: ``make apply`` on a fresh ``git clone`` of the kit in a temporary directory.
"""

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import tempfile
from pathlib import Path

from scripts import launch, sources
from scripts.bench.common import CHILD, BenchError, Side, check, check_module, child_env, cut_short, runs_cell
from scripts.git import git, rev

REPRO_SAMPLES = 96  # child.repro_accelerate


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and the descendants they waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# The DeepSpeed pull requests' reproductions: {PR key: child.py kind}; each result holds what it measured besides
# "module" ("differing" batches, or how many micro-batches "late" the resume goes on).
DEEPSPEED_REPROS = {"8787": "repro-deepspeed", "cluster-files": "repro-cluster-files",
                    "io-workers": "repro-io-workers", "consumed-samples": "repro-consumed-samples"}


def floor_deepspeed(args: argparse.Namespace, side: Side, index: int, kind: str) -> dict:
    """A DeepSpeed part of F: the reproduction ``kind`` (scripts/bench/child.py) in a fresh process; {"seconds",
    "cpu_s", and what it measured}."""
    cpu = children_cpu()
    run = launch.run([str(args.python), str(CHILD), kind, "{}"],
                     args.out / "logs" / f"floor-{kind}-{index}.log", args.timeout, cwd=sources.KIT_ROOT,
                     env=child_env(side))
    check(run, f"the DeepSpeed reproduction {kind}", args.timeout)
    line = [x for x in run.log.read_text(errors="replace").splitlines() if x.startswith("BENCH-RESULT ")][-1]
    result = json.loads(line.removeprefix("BENCH-RESULT "))
    check_module(side, result.pop("module"), f"the DeepSpeed reproduction {kind}")
    return {"seconds": run.seconds, "cpu_s": round(children_cpu() - cpu, 1), **result}


def floor_accelerate(args: argparse.Namespace, side: Side, index: int) -> dict:
    """The Accelerate half of F: one 2-process launch of the reproduction; {"seconds", "missing", "duplicated"}.

    Raises BenchError when the launch fails, times out or a rank wrote no result.
    """
    out = args.out / "floor" / f"accelerate-{index}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    command = [str(args.python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(CHILD),
               "repro-accelerate", json.dumps({"out": str(out)})]
    cpu = children_cpu()
    run = launch.run(command, args.out / "logs" / f"floor-accelerate-{index}.log", args.timeout, cwd=out,
                     env=child_env(side))
    cpu = round(children_cpu() - cpu, 1)
    check(run, "the 2-process Accelerate reproduction", args.timeout)
    ids = []
    for rank in (0, 1):
        path = out / f"rank{rank}.json"
        if not path.exists():
            raise BenchError(f"the 2-process Accelerate reproduction wrote no result for rank {rank}; log {run.log}")
        result = json.loads(path.read_text())
        check_module(side, result["module"], "the 2-process Accelerate reproduction")
        ids += result["ids"]
    seen = set(ids)
    return {"seconds": run.seconds, "cpu_s": cpu, "missing": REPRO_SAMPLES - len(seen & set(range(REPRO_SAMPLES))),
            "duplicated": len(ids) - len(seen)}


def run_gate(args: argparse.Namespace, label: str, *options: str) -> dict:
    """One ``python -m scripts.gate OPTIONS`` (report under ``<out>/gate``); {"seconds", "cpu_s", "exit", "verdict",
    "counts", "ran", "reused", "stages"}.

    ``stages`` is {stage: {"wall_s", "cpu_s", "<upstream> kit tests", "<upstream> upstream tests"}} from the gate's own
    report; ``ran`` / ``reused``: the ``<upstream> <stage>`` that ran or whose results were reused (scripts/gate/
    cache.py); ``counts``: ``counts`` of the report. A gate that fails its contract is recorded, not an error; a
    timeout or a missing report raises BenchError.
    """
    out = args.out / "gate"
    command = [str(args.python), "-m", "scripts.gate", "--out", str(out), *options]
    for name, version in args.versions.items():
        command += ["--version", f"{name}={version}"]
    (out / "report.json").unlink(missing_ok=True)
    cpu = children_cpu()
    run = launch.run(command, args.out / "logs" / f"gate-{label}.log", args.gate_timeout, cwd=sources.KIT_ROOT)
    if run.timed_out:
        raise BenchError(f"the gate timed out after {args.gate_timeout:.0f} s (killed); log {run.log}")
    record = {"seconds": run.seconds, "cpu_s": round(children_cpu() - cpu, 1), "exit": run.returncode,
              "verdict": None, "stages": {}}
    with contextlib.suppress(OSError, ValueError):
        report = json.loads((out / "report.json").read_text())
        record["verdict"] = report["verdict"]
        record["counts"] = counts(report)
        record["ran"] = sorted(f"{name} {stage}" for name, up in report["upstreams"].items()
                               for stage, entry in up["stages"].items() if not entry.get("reused"))
        record["reused"] = sorted(f"{name} {stage}" for name, up in report["upstreams"].items()
                                  for stage, entry in up["stages"].items() if entry.get("reused"))
        for name, up in report["upstreams"].items():
            for stage, entry in up["stages"].items():
                figures = record["stages"].setdefault(stage, {"wall_s": entry["wall_s"], "cpu_s": entry.get("cpu_s")})
                if "kit_results_of" not in entry:  # else the stage ran no kit suite of it: "-" in the table
                    figures[f"{name} kit tests"] = entry.get("kit_tests_s", 0.0)
                figures[f"{name} upstream tests"] = entry.get("upstream_tests_s", 0.0)
    if record["verdict"] is None:
        raise BenchError(f"the gate wrote no report (exit status {run.returncode}); log {run.log}:\n{run.tail()}")
    return record


def counts(report: dict) -> dict[str, list[list]]:
    """{upstream: [[commit ("1/4", or "series"), FAIL_TO_PASS, PASS_TO_PASS, violations, verdict], ...]} of a gate's
    report.json: what two gates must agree on to have judged the same."""
    found = {}
    for name, up in report["upstreams"].items():
        steps = up.get("steps") or [{**up, "commit": "series", "of": ""}]
        found[name] = [[f"{s['commit']}/{s['of']}" if s["of"] else s["commit"], len(s["FAIL_TO_PASS"]),
                        len(s["PASS_TO_PASS"]), len(s["violations"]), s["verdict"]] for s in steps]
    return found


def one_line_change(patches: Path, into: Path) -> str:
    """Copy the series ``patches`` (patches/<name>/) to ``into`` and change one line of code of the last patch of the
    first upstream (by name) that has one: a comment line the patch adds to a ``.py`` file outside ``tests/``, with
    words appended (the hunk's line counts stay); return what was changed. Raises BenchError when no patch adds such a
    line."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(patches, into)
    for series_dir in sorted(p for p in into.iterdir() if p.is_dir()):
        last = sorted(series_dir.glob("*.patch"))[-1:]
        lines = last[0].read_text().splitlines(keepends=True) if last else []
        file = ""
        for number, line in enumerate(lines):
            if line.startswith("diff --git "):
                file = line.split()[-1].removeprefix("b/")
            elif (file.endswith(".py") and not file.startswith("tests/") and line.startswith("+")
                  and not line.startswith("+++") and line[1:].lstrip().startswith("#")):
                lines[number] = line.rstrip("\n") + " (a one-line change of the bench)\n"
                last[0].write_text("".join(lines))
                return f"{series_dir.name}/{last[0].name}: a comment line of {file}"
    raise BenchError(f"no last patch under {patches} adds a comment line to a .py file outside tests/ to change")


def bench_reuse(args: argparse.Namespace, cold: dict, cache: Path) -> dict:
    """After a cold gate ``cold`` (run_gate, its results stored in ``cache``): a warm gate (nothing changed) and a
    gate after a one-line change to the last commit's patch of an upstream (``one_line_change``), both with
    ``cache``; {"cold", "warm", "one_line": run_gate records, "changed", and the wall and CPU ratios to the cold
    gate}."""
    print("bench: the gate again with nothing changed (its stage results reused)", flush=True)
    warm = run_gate(args, "warm", "--cache-dir", str(cache))
    changed = one_line_change(sources.KIT_ROOT / "patches", args.out / "one-line-patches")
    print(f"bench: the gate after a one-line change ({changed})", flush=True)
    one_line = run_gate(args, "one-line", "--cache-dir", str(cache), "--patches", str(args.out / "one-line-patches"))
    result = {"cold": cold, "warm": warm, "one_line": one_line, "changed": changed}
    for label in ("warm", "one_line"):
        result[f"{label}_wall_ratio"] = round(result[label]["seconds"] / cold["seconds"], 3)
        result[f"{label}_cpu_ratio"] = round(result[label]["cpu_s"] / cold["cpu_s"], 3) if cold["cpu_s"] else None
    return result


def bench_gate(args: argparse.Namespace, sides: dict[str, dict[str, Side]]) -> dict:
    """Item 4: the gate and its floor F, alternating (F first in even repetitions), each gate cold (no stored stage
    result); then, after the last cold gate, a warm one and one after a one-line change (``bench_reuse``). Figures
    are medians (s)."""
    runs: list[dict] = []
    reuse: dict = {}
    cache = args.out / "gate-cache"
    # Untimed: checks that every reproduction runs, and compiles the base work trees' bytecode before timing.
    for kind in DEEPSPEED_REPROS.values():
        floor_deepspeed(args, sides["deepspeed"]["base"], -1, kind)
    floor_accelerate(args, sides["accelerate"]["base"], -1)
    try:
        for index in range(args.gate_repeat):
            entry = {}
            for step in (("floor", "gate") if index % 2 == 0 else ("gate", "floor")):
                if step == "floor":
                    print(f"bench: the floor F (the {len(DEEPSPEED_REPROS) + 1} bare reproductions)", flush=True)
                    entry["deepspeed"] = {key: floor_deepspeed(args, sides["deepspeed"]["base"], index, kind)
                                          for key, kind in DEEPSPEED_REPROS.items()}
                    entry["accelerate"] = floor_accelerate(args, sides["accelerate"]["base"], index)
                else:
                    print("bench: the gate, cold (python -m scripts.gate --no-cache; a few minutes)", flush=True)
                    shutil.rmtree(cache, ignore_errors=True)
                    entry["gate"] = run_gate(args, str(index), "--no-cache", "--cache-dir", str(cache))
            floors = [*entry["deepspeed"].values(), entry["accelerate"]]
            entry["F_s"] = round(sum(floor["seconds"] for floor in floors), 1)
            entry["F_cpu_s"] = round(sum(floor["cpu_s"] for floor in floors), 1)
            runs.append(entry)
            print(f"bench: gate repetition {index + 1}/{args.gate_repeat}: gate {entry['gate']['seconds']:.1f} s "
                  f"({entry['gate']['verdict']}), F {entry['F_s']:.1f} s", flush=True)
        reuse = bench_reuse(args, runs[-1]["gate"], cache)
    except KeyboardInterrupt:
        cut_short(args, "gate", {"gate": runs}, args.gate_repeat)
    med = statistics.median
    stages = {stage: {label: med(r["gate"]["stages"].get(stage, {}).get(label) or 0.0 for r in runs)
                      for label in figures} for stage, figures in runs[0]["gate"]["stages"].items()}
    return {"runs": runs, "gate_s": med(r["gate"]["seconds"] for r in runs), "F_s": med(r["F_s"] for r in runs),
            "deepspeed_repro_s": {key: med(r["deepspeed"][key]["seconds"] for r in runs)
                                  for key in DEEPSPEED_REPROS},
            "accelerate_repro_s": med(r["accelerate"]["seconds"] for r in runs),
            "gate_over_F": round(med(r["gate"]["seconds"] / r["F_s"] for r in runs), 2),
            "gate_cpu_s": med(r["gate"]["cpu_s"] for r in runs), "F_cpu_s": med(r["F_cpu_s"] for r in runs),
            "gate_cpu_over_F_cpu": round(med(r["gate"]["cpu_s"] / r["F_cpu_s"] for r in runs), 2),
            "verdicts": [r["gate"]["verdict"] for r in runs], "stages_s": stages, "reuse": reuse}


def bench_gate_profile(args: argparse.Namespace) -> dict:
    """Where the gate's time goes: interpreter start, the imports, the gate with one stage at a time, and
    tests/accelerate's 2-process launch alone, ``--gate-repeat`` times round-robin.

    Returns {label: {"seconds": median, "runs": [s, ...], "exits": [...]}}, the serial gate's per-stage figures
    under "serial gate stages", and the launch's per-scenario times under "scenarios". A non-zero exit status is
    recorded, not an error; a timeout raises BenchError.
    """
    py, kit = str(args.python), sources.KIT_ROOT
    launch_dir = args.out / "profile" / "accelerate-launch"
    worker = kit / "tests" / "accelerate" / "accelerate_worker.py"
    items = [("python -c pass", [py, "-c", "pass"]), ("import torch", [py, "-c", "import torch"]),
             ("import the DeepSpeed sampler", [py, "-c", "import deepspeed.runtime.data_pipeline.data_sampling."
                                                     "data_sampler"]),
             ("import accelerate", [py, "-c", "import accelerate"]),
             ("tests/accelerate's 2-process launch alone", [py, "-m", "torch.distributed.run", "--standalone",
                                                            "--nproc_per_node=2", str(worker), str(launch_dir)])]
    profile: dict = {label: {"runs": [], "exits": []} for label, _ in items}
    profile["gate, one stage at a time (--jobs 1)"] = {"runs": [], "exits": []}
    scenarios: dict[str, list[float]] = {}
    serial: list[dict] = []
    for index in range(args.gate_repeat):
        for number, (label, command) in enumerate(items):
            launch_dir.mkdir(parents=True, exist_ok=True)
            run = launch.run(command, args.out / "logs" / f"profile-{number}-{index}.log", args.timeout, cwd=kit,
                             env=child_env(Side("kit", "patched", kit, "", "")))
            if run.timed_out:
                raise BenchError(f"profile: {label} timed out after {args.timeout:.0f} s; log {run.log}")
            profile[label]["runs"].append(run.seconds)
            profile[label]["exits"].append(run.returncode)
        for scenario, delta in scenario_times(launch_dir).items():
            scenarios.setdefault(scenario, []).append(delta)
        record = run_gate(args, f"serial-{index}", "--jobs", "1")
        profile["gate, one stage at a time (--jobs 1)"]["runs"].append(record["seconds"])
        profile["gate, one stage at a time (--jobs 1)"]["exits"].append(record["exit"])
        serial.append(record["stages"])
        print(f"bench: gate profile repetition {index + 1}/{args.gate_repeat}", flush=True)
    for entry in profile.values():
        entry["seconds"] = statistics.median(entry["runs"])
    return {"parts": profile, "scenarios": {name: statistics.median(v) for name, v in scenarios.items()},
            "serial gate stages": serial[len(serial) // 2]}


def scenario_times(launch_dir: Path) -> dict[str, float]:
    """{scenario: s} inside one launch of tests/accelerate's worker, from the times its rank-0 files were written.

    Each scenario's time is the gap to the previous scenario's file, so the first scenario has none. The files are
    removed afterwards, so that the next launch starts from an empty directory.
    """
    files = sorted(launch_dir.glob("*.rank0.json"), key=lambda path: path.stat().st_mtime)
    times = {later.name.removesuffix(".rank0.json"): later.stat().st_mtime - earlier.stat().st_mtime
             for earlier, later in zip(files, files[1:], strict=False)}
    for path in launch_dir.glob("*.json"):
        path.unlink()
    return times


def bench_cold_apply(args: argparse.Namespace) -> dict:
    """Item 5: ``make apply`` in a fresh ``git clone`` of the kit (committed HEAD) in a temporary directory.

    Returns {"runs": [s, ...], "seconds": median, "commit"}; raises BenchError when a run fails.
    """
    seconds, commit = [], rev(sources.KIT_ROOT)
    for index in range(args.cold_apply):
        with tempfile.TemporaryDirectory(prefix="kit-cold-apply-") as tmp:
            clone = Path(tmp) / "kit"
            git(sources.KIT_ROOT, "clone", "--quiet", "--no-hardlinks", str(sources.KIT_ROOT), str(clone))
            run = launch.run(["make", "apply"], args.out / "logs" / f"cold-apply-{index}.log", args.gate_timeout,
                             cwd=clone)
            check(run, "cold `make apply`", args.gate_timeout)
            seconds.append(run.seconds)
        print(f"bench: cold make apply {index + 1}/{args.cold_apply}: {seconds[-1]:.1f} s", flush=True)
    return {"runs": seconds, "seconds": statistics.median(seconds), "commit": commit}


def stages_table(stages: dict) -> list[str]:
    """A table of per-stage figures {stage: {label: s}} (wall time first); a stage without a label's figure (a stage
    of a stack in which only one upstream runs, or one that reads an upstream's kit suite from an earlier stage of the
    same code) shows "-" there."""
    labels = list(dict.fromkeys(label for figures in stages.values() for label in figures
                                if label not in ("wall_s", "cpu_s")))
    md = ["| stage | pytest wall s | pytest CPU s | " + " | ".join(f"{label} s" for label in labels) +
          " | start, imports, collection s |", "|---" * (len(labels) + 4) + "|"]
    for stage, figures in stages.items():
        rest = figures["wall_s"] - sum(figures.get(label, 0.0) for label in labels)
        cells = [f"{figures[label]:.1f}" if label in figures else "-" for label in labels]
        cpu = f"{figures['cpu_s']:.1f}" if figures.get("cpu_s") is not None else "-"
        md.append(f"| {stage} | {figures['wall_s']:.1f} | {cpu} | " + " | ".join(cells) + f" | {rest:.1f} |")
    return md


def gate_markdown(g: dict) -> list[str]:
    """The report's section of the gate against its floor F."""
    return ["## The gate against its floor F", "",
            "F = one bare reproduction per pull request of the series, on the base work trees: the DeepSpeed #8787 "
            "resume, the `cluster-files` restart, the `io-workers` resume and the `consumed-samples` count (each in a "
            "fresh Python process), and "
            "one 2-process Accelerate #4204 reproduction (`torch.distributed.run --standalone --nproc_per_node=2`, 2 "
            f"workers); the gate is `python -m scripts.gate` (as `make gate`: its stages side by side). "
            f"{len(g['runs'])} repetitions, alternating.", "",
            "| figure | median s | runs s |", "|---|---|---|",
            f"| gate | {g['gate_s']:.1f} | {runs_cell(r['gate']['seconds'] for r in g['runs'])} |",
            f"| F | {g['F_s']:.1f} | {runs_cell(r['F_s'] for r in g['runs'])} |",
            *(f"| DeepSpeed reproduction `{key}` | {seconds:.1f} | "
              f"{runs_cell(r['deepspeed'][key]['seconds'] for r in g['runs'])} |"
              for key, seconds in g["deepspeed_repro_s"].items()),
            f"| Accelerate 2-process reproduction | {g['accelerate_repro_s']:.1f} | "
            f"{runs_cell(r['accelerate']['seconds'] for r in g['runs'])} |",
            "", f"**gate / F = {g['gate_over_F']:.2f}** (median of per-repetition ratios; goal <= 3). Gate "
            f"verdicts: {', '.join(str(v) for v in g['verdicts'])}. Reproductions on the base: DeepSpeed batches "
            f"differing after the #8787 resume {[r['deepspeed']['8787']['differing'] for r in g['runs']]} of 15, "
            f"after the cluster-files restart {[r['deepspeed']['cluster-files']['differing'] for r in g['runs']]} of "
            f"22; the io-workers resume goes on {[r['deepspeed']['io-workers']['late'] for r in g['runs']]} "
            "micro-batches late (None: at no offset up to 7; on the base the #8787 bug shows in the follow-ups' "
            "reproductions too); the state after 5 micro-batches counts "
            f"{[r['deepspeed']['consumed-samples']['behind'] for r in g['runs']]} samples too few; Accelerate samples "
            "missing "
            f"in epoch 0 {[r['accelerate']['missing'] for r in g['runs']]} of {REPRO_SAMPLES}.", "",
            f"CPU time (user + system, all processes): gate {g['gate_cpu_s']:.1f} s, F {g['F_cpu_s']:.1f} s, "
            f"gate CPU / F CPU = {g['gate_cpu_over_F_cpu']:.2f}; on {os.cpu_count()} cores the gate needs at least "
            f"{g['gate_cpu_s'] / (os.cpu_count() or 1):.1f} s of wall time even with nothing else running, F's wall "
            "time is mostly waiting (process start, imports, the rendezvous).", "",
            "The gate's stages (median s, from its report; the stages ran side by side, so their walls overlap):", "",
            *stages_table(g["stages_s"]), "", *(reuse_markdown(g["reuse"]) if g.get("reuse") else [])]


def reuse_markdown(r: dict) -> list[str]:
    """The report's section of the gate's stage results reused (``bench_reuse``): each gate's wall and CPU time as
    ratios to the cold one, the stages it ran, and whether it judged as the cold one did."""
    md = ["### Stage results reused by content (issue 42)", "",
          "The last cold gate above (every stage run, `--no-cache`), then with the same cache: the gate again with "
          f"nothing changed (warm), and after a one-line change ({r['changed']}).", "",
          "| gate | wall s | CPU s | wall / cold | CPU / cold | stages run | stages reused | verdict | same counts as "
          "cold |", "|---|---|---|---|---|---|---|---|---|"]
    for label, key in (("cold", "cold"), ("warm", "warm"), ("one-line change", "one_line")):
        g = r[key]
        wall, cpu = (f"{r[f'{key}_{of}_ratio']:.3f}" if r.get(f"{key}_{of}_ratio") is not None else
                     "1" if key == "cold" else "-" for of in ("wall", "cpu"))
        md.append(f"| {label} | {g['seconds']:.1f} | {g['cpu_s']:.1f} | {wall} | {cpu} | {len(g['ran'])} | "
                  f"{len(g['reused'])} | {g['verdict']} | {'yes' if g['counts'] == r['cold']['counts'] else 'no'} |")
    md += ["", f"Stages the one-line change ran: {', '.join(r['one_line']['ran']) or 'none'}.", "",
           "FAIL_TO_PASS / PASS_TO_PASS / violations per commit (cold gate): " + "; ".join(
               f"{name} " + ", ".join(f"{c[0]}: {c[1]}/{c[2]}/{c[3]}" for c in commits)
               for name, commits in r["cold"]["counts"].items()) + ".", ""]
    return md


def profile_markdown(p: dict) -> list[str]:
    """The report's section of ``--profile-gate``."""
    md = ["## Where the gate's time goes (--profile-gate)", "",
          "Each part alone, median of the repetitions (s), with the exit statuses.", "",
          "| part | median s | runs s | exit statuses |", "|---|---|---|---|"]
    md += [f"| {label} | {entry['seconds']:.1f} | {runs_cell(entry['runs'])} | "
           f"{', '.join(str(e) for e in entry['exits'])} |" for label, entry in p["parts"].items()]
    md += ["", "The gate with one stage at a time (its median run), per stage:", "",
           *stages_table(p["serial gate stages"]), ""]
    if p["scenarios"]:
        times = p["scenarios"]
        md += [f"Inside tests/accelerate's launch, per scenario (median s, gap between the rank-0 result files; the "
               f"first scenario has none): {sum(times.values()):.1f} s in all; "
               + ", ".join(f"{name} {value:.2f}" for name, value in times.items()) + ".", ""]
    return md


def cold_apply_markdown(c: dict) -> list[str]:
    """The report's section of the cold ``make apply``."""
    return ["## Cold `make apply`", "",
            f"Fresh `git clone` of the kit at `{c['commit'][:12]}` (committed files only) in a temporary directory, "
            f"then `make apply` (pip's own cache as it is): {c['seconds']:.0f} s (runs: {runs_cell(c['runs'], 0)}).",
            ""]
