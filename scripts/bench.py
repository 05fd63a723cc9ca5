"""Benchmarks (issue 7): what the two fixes cost and save, base and patched side by side, and the gate vs its floor.

``python -m scripts.bench [options]`` (``make bench BENCH_ARGS=...``) measures, in one run:

1. Accelerate, one process, ``use_stateful_dataloader=True``, ``num_workers`` 0, 2, 6: wall time of
   ``accelerator.prepare(loader)`` and the worker processes alive right after it;
2. the same loaders: wall time of epoch 0, of prepare + epoch 0, and of epoch 1;
3. DeepSpeed's curriculum ``DeepSpeedDataSampler`` (``barrier``/``broadcast`` stubbed as no-ops): batches per
   second over ``--steps`` micro-batches, and ``state_dict()`` + ``load_state_dict()`` time;
4. the gate (``python -m scripts.gate``, what ``make gate`` runs) against its floor F: the wall time of the two
   bare reproductions, one DeepSpeed resume in a fresh Python process plus one 2-process Accelerate launch
   (``torch.distributed.run --standalone --nproc_per_node=2``); reported as gate / F;
5. with ``--cold-apply``: ``make apply`` on a fresh ``git clone`` of the kit in a temporary directory.

The base side imports each upstream from a second git work tree of its checkout at ``base/<version>``
(``build/bench/worktrees/``, through ``PYTHONPATH``); the patched side is the editable install, i.e. the checkout
``upstream/<name>`` as it is (or ``--patched-from NAME=DIR``). Each measurement runs in a fresh process of the
venv's Python (``scripts/bench_child.py``), and every result is checked to come from the intended tree. Base and
patched processes alternate (base first in even repetitions, patched first in odd ones); a ratio is the median of
the per-repetition ratios patched / base of adjacent processes, a figure the median over repetitions.

Output: ``build/bench/report.json`` and ``report.md`` (``--out``), logs of every process in ``<out>/logs/``.
Exit status 0 when every measurement ran (targets missed do not fail it), 1 on an error (a process failed or
timed out, a tree was not the one asked for, a work tree could not be made); a part that fails is listed under
"Errors" in the report and the other parts still run.
"""

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from scripts import KitError, launch, sources
from scripts.checkout import git, rev
from scripts.gate import pytest_command

CHILD = sources.KIT_ROOT / "scripts" / "bench_child.py"
MARKER = "BENCH-RESULT "  # bench_child.MARKER
SIDES = ("base", "patched")
NUM_WORKERS = (0, 2, 6)
DS_SCENARIOS = ("single_cluster", "several_clusters")
REPRO_SAMPLES = 96  # bench_child.repro_accelerate


class BenchError(KitError):
    """A measurement could not be taken; the message names the process and its log."""


# ---------------------------------------------------------------------------------------------------------------
# Processes: every launch has a timeout and leaves nothing running.


@dataclass
class Run:
    """A finished process: exit status (None when it timed out), wall time in seconds, its log files."""

    returncode: int | None
    seconds: float
    out: Path
    err: Path

    def tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of stderr (and of stdout when stderr is empty)."""
        for path in (self.err, self.out):
            text = path.read_text(errors="replace").strip() if path.exists() else ""
            if text:
                return "\n".join(text.splitlines()[-lines:])
        return "(no output)"


def run_limited(command: list[str], log: Path, timeout: float, cwd: Path = sources.KIT_ROOT,
                env: dict | None = None) -> Run:
    """Run ``command`` in a new session with stdout/stderr in ``log.out``/``log.err``; wall time in seconds.

    On timeout (seconds) the whole process tree is killed and ``returncode`` is None; after a normal exit
    whatever is left in its process group is killed too. Never raises for the command's own failure.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    out, err = log.with_suffix(".out"), log.with_suffix(".err")
    started = time.monotonic()
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            seconds = time.monotonic() - started
            launch.kill_tree(proc)
    return Run(returncode, seconds, out, err)


def check_run(run: Run, what: str, timeout: float) -> None:
    """Raise BenchError when ``run`` timed out or exited non-zero; the message holds the end of its output."""
    if run.returncode is None:
        raise BenchError(f"{what} timed out after {timeout:.0f} s (killed); log {run.err}:\n{run.tail()}")
    if run.returncode != 0:
        raise BenchError(f"{what} exited with status {run.returncode}; log {run.err}:\n{run.tail()}")


# ---------------------------------------------------------------------------------------------------------------
# The two sides of each upstream.


@dataclass
class Side:
    """One side of one upstream: ``pythonpath`` ('' = the editable install) and the tree its module must be in."""

    upstream: str
    name: str
    tree: Path
    pythonpath: str
    commit: str
    note: str = ""
    modules: set = field(default_factory=set)

    def describe(self) -> dict:
        """The JSON record of this side: tree, commit, how it is imported, the module files seen."""
        return {"tree": str(self.tree), "commit": self.commit, "pythonpath": self.pythonpath or None,
                "modules": sorted(self.modules), "note": self.note}


def package_dir(upstream: str, tree: Path) -> Path:
    """The directory that holds the importable package of ``upstream`` inside a source ``tree``."""
    return tree / "src" if (tree / "src" / upstream).is_dir() else tree


def base_worktree(repo: Path, version: str, root: Path) -> Path:
    """A detached work tree of ``repo`` at ``base/<version>`` under ``root`` (reused when already there).

    Raises BenchError when ``repo`` has no such tag or git cannot make the work tree.
    """
    tag = f"base/{version}"
    path = root / f"{repo.name}-base-{version}"
    try:
        wanted = rev(repo, f"{tag}^{{commit}}")
        git(repo, "worktree", "prune")
        if path.exists():
            if (path / ".git").exists() and rev(path) == wanted and not git(path, "status", "--porcelain",
                                                                          "--untracked-files=no").stdout:
                return path
            git(repo, "worktree", "remove", "--force", str(path), check=False)
            shutil.rmtree(path, ignore_errors=True)
            git(repo, "worktree", "prune")
        git(repo, "worktree", "add", "--quiet", "--detach", str(path), tag)
    except KitError as e:
        raise BenchError(f"cannot make a work tree of {repo} at {tag}: {e}") from None
    return path


def remove_worktree(repo: Path, path: Path) -> None:
    """Remove the work tree ``path`` of ``repo`` and prune git's record of it; never raises."""
    with contextlib.suppress(KitError, OSError):
        git(repo, "worktree", "remove", "--force", str(path), check=False)
        shutil.rmtree(path, ignore_errors=True)
        git(repo, "worktree", "prune", check=False)


def source_changes(repo: Path, version: str, test_paths: tuple[str, ...]) -> list[str]:
    """Files outside ``test_paths`` that differ between ``base/<version>`` and HEAD of ``repo`` (the fix)."""
    changed = git(repo, "diff", "--name-only", f"base/{version}", "HEAD").stdout.split()
    return [name for name in changed if not name.startswith(test_paths)]


def make_sides(args: argparse.Namespace, upstream: str, worktrees: list) -> dict[str, Side]:
    """The base and patched Side of ``upstream``; the base work tree is appended to ``worktrees`` (repo, path)."""
    pin = sources.pin(upstream, args.versions.get(upstream))
    repo = args.checkouts / upstream
    if not (repo / ".git").exists():
        raise BenchError(f"{repo} does not exist: run `make apply` first")
    tree = base_worktree(repo, pin.version, args.out / "worktrees")
    worktrees.append((repo, tree))
    base = Side(upstream, "base", tree, str(package_dir(upstream, tree)), rev(tree),
                f"work tree at base/{pin.version}")
    if upstream in args.patched_from:
        other = args.patched_from[upstream].resolve()
        patched = Side(upstream, "patched", other, str(package_dir(upstream, other)), "", "--patched-from")
    else:
        changes = source_changes(repo, pin.version, pin.test_paths)
        branch = git(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip()
        note = f"editable install, checkout on {branch}; source files changed from base: {len(changes)}"
        if not changes:
            note += " (NO FIX in the checkout: the patched side equals the base)"
        patched = Side(upstream, "patched", repo, "", rev(repo), note)
    return {"base": base, "patched": patched}


def child_env(side: Side) -> dict:
    """The environment of a measurement process of ``side``: no ACCELERATE_* settings, one OpenMP thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_") and k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    if side.pythonpath:
        env["PYTHONPATH"] = side.pythonpath
    return env


def check_module(side: Side, module: str, what: str) -> None:
    """Raise BenchError unless ``module`` (a ``__file__``) lies in the tree of ``side``; remember it otherwise."""
    if not Path(module).resolve().is_relative_to(side.tree.resolve()):
        raise BenchError(f"{what}: the {side.name} side imported {module}, not a file of {side.tree}")
    side.modules.add(module)


def run_child(args: argparse.Namespace, side: Side, kind: str, params: dict, log: Path) -> dict:
    """Run ``bench_child.py KIND PARAMS`` for ``side``; return its result (module checked). Raises BenchError."""
    run = run_limited([str(args.python), str(CHILD), kind, json.dumps(params)], log, args.timeout, env=child_env(side))
    what = f"{kind} ({side.upstream} {side.name}, {log.name})"
    check_run(run, what, args.timeout)
    lines = [line for line in run.out.read_text(errors="replace").splitlines() if line.startswith(MARKER)]
    if not lines:
        raise BenchError(f"{what} printed no result; log {run.out}")
    result = json.loads(lines[-1][len(MARKER):])
    check_module(side, result["module"], what)
    return result


def side_order(repetition: int) -> tuple[str, str]:
    """Base first in even repetitions, patched first in odd ones."""
    return SIDES if repetition % 2 == 0 else SIDES[::-1]


# ---------------------------------------------------------------------------------------------------------------
# Figures.


def compare(base: list[float], patched: list[float]) -> dict:
    """Medians of both sides and the median (min, max) of the paired ratios patched / base, rounded.

    ``base[i]`` and ``patched[i]`` come from adjacent processes of repetition ``i``. A ratio is None when a base
    value is 0 (a count of workers, say).
    """
    ratios = [p / b for b, p in zip(base, patched, strict=True) if b]
    return {"base": statistics.median(base), "patched": statistics.median(patched),
            "ratio": round(statistics.median(ratios), 4) if ratios else None,
            "ratio_min": round(min(ratios), 4) if ratios else None,
            "ratio_max": round(max(ratios), 4) if ratios else None,
            "runs": len(base), "base_runs": base, "patched_runs": patched}


def bench_accelerate(args: argparse.Namespace, sides: dict[str, Side]) -> dict:
    """Items 1 and 2: {"settings", "by_workers": {nw: {metric: compare(...)}}, "versions"}; times in seconds."""
    params = {"num_workers": list(NUM_WORKERS), "samples": args.samples, "batch_size": args.batch_size,
              "features": 64, "inner": args.inner}
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for repetition in range(args.repeat):
        for name in side_order(repetition):
            log = args.out / "logs" / f"accelerate-{name}-{repetition}"
            runs[name].append(run_child(args, sides[name], "accelerate", params, log))
        print(f"bench: accelerate repetition {repetition + 1}/{args.repeat}", flush=True)
    metrics = ("prepare_s", "workers_after_prepare", "epoch0_s", "prepare_epoch0_s", "epoch1_s")
    by_workers = {str(nw): {m: compare([r["by_workers"][str(nw)][m] for r in runs["base"]],
                                       [r["by_workers"][str(nw)][m] for r in runs["patched"]]) for m in metrics}
                  for nw in NUM_WORKERS}
    return {"settings": params, "by_workers": by_workers, "versions": runs["patched"][0]["versions"]}


def bench_deepspeed(args: argparse.Namespace, sides: dict[str, Side]) -> dict:
    """Item 3: {"settings", "by_scenario": {scenario: {metric: compare(...)}}, "versions"}; seconds, batches/s."""
    params = {"scenarios": list(DS_SCENARIOS), "steps": args.steps, "blocks": 5, "warmup": 20,
              "epoch_samples": 1000, "inner": args.roundtrips}
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for repetition in range(args.repeat):
        for name in side_order(repetition):
            log = args.out / "logs" / f"deepspeed-{name}-{repetition}"
            runs[name].append(run_child(args, sides[name], "deepspeed", params, log))
        print(f"bench: deepspeed repetition {repetition + 1}/{args.repeat}", flush=True)
    metrics = ("batches_per_s", "batches_per_cpu_s", "state_dict_s", "load_state_dict_s", "state_roundtrip_s",
               "state_roundtrip_cpu_s")
    by_scenario = {s: {m: compare([r["by_scenario"][s][m] for r in runs["base"]],
                                  [r["by_scenario"][s][m] for r in runs["patched"]]) for m in metrics}
                   for s in DS_SCENARIOS}
    return {"settings": params, "by_scenario": by_scenario, "versions": runs["patched"][0]["versions"]}


def floor_deepspeed(args: argparse.Namespace, side: Side, index: int) -> dict:
    """The DeepSpeed half of F: the resume reproduction in a fresh process; {"seconds", "differing"}."""
    started = time.monotonic()
    result = run_child(args, side, "repro-deepspeed", {}, args.out / "logs" / f"floor-deepspeed-{index}")
    return {"seconds": time.monotonic() - started, "differing": result["differing"]}


def floor_accelerate(args: argparse.Namespace, side: Side, index: int) -> dict:
    """The Accelerate half of F: one 2-process launch of the reproduction; {"seconds", "missing", "duplicated"}.

    Raises BenchError when the launch fails, times out or a rank wrote no result.
    """
    out = args.out / "floor" / f"accelerate-{index}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    command = [str(args.python), "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(CHILD),
               "repro-accelerate", json.dumps({"out": str(out)})]
    run = run_limited(command, args.out / "logs" / f"floor-accelerate-{index}", args.timeout, cwd=out,
                      env=child_env(side))
    check_run(run, "the 2-process Accelerate reproduction", args.timeout)
    ids = []
    for rank in (0, 1):
        path = out / f"rank{rank}.json"
        if not path.exists():
            raise BenchError(f"the 2-process Accelerate reproduction wrote no result for rank {rank}; log {run.err}")
        result = json.loads(path.read_text())
        check_module(side, result["module"], "the 2-process Accelerate reproduction")
        ids += result["ids"]
    seen = set(ids)
    return {"seconds": run.seconds, "missing": REPRO_SAMPLES - len(seen & set(range(REPRO_SAMPLES))),
            "duplicated": len(ids) - len(seen)}


def run_gate(args: argparse.Namespace, index: int) -> dict:
    """One ``python -m scripts.gate`` (report under ``<out>/gate``); {"seconds", "exit", "verdict", "stages", "runs"}.

    ``stages`` is {upstream: {stage: wall s}} from the gate's own report; ``runs`` {"<stage> <upstream> <suite>":
    wall s} from its one line per pytest run. A gate that fails its contract is recorded, not an error; a
    timeout or a missing report raises BenchError.
    """
    out = args.out / "gate"
    command = [str(args.python), "-m", "scripts.gate", "--out", str(out), "--jobs", args.jobs]
    for name, version in args.versions.items():
        command += ["--version", f"{name}={version}"]
    (out / "report.json").unlink(missing_ok=True)
    run = run_limited(command, args.out / "logs" / f"gate-{index}", args.gate_timeout)
    if run.returncode is None:
        raise BenchError(f"the gate timed out after {args.gate_timeout:.0f} s (killed); log {run.out}")
    record = {"seconds": run.seconds, "exit": run.returncode, "verdict": None, "stages": {}, "runs": {}}
    # scripts.gate prints "gate <stage> <upstream> <kit|upstream> tests: <outcomes> in <s> s (log: ...)" per run.
    for match in re.finditer(r"^gate (\S+) (\S+) (\S+) tests: .* in ([0-9.]+) s", run.out.read_text(errors="replace"),
                             re.M):
        record["runs"][" ".join(match.group(1, 2, 3))] = float(match.group(4))
    with contextlib.suppress(OSError, ValueError):
        report = json.loads((out / "report.json").read_text())
        record["verdict"] = report["verdict"]
        record["stages"] = {name: {stage: entry["wall_s"] for stage, entry in up["stages"].items()}
                            for name, up in report["upstreams"].items()}
    if record["verdict"] is None:
        raise BenchError(f"the gate wrote no report (exit status {run.returncode}); log {run.err}:\n{run.tail()}")
    return record


def bench_gate(args: argparse.Namespace, sides: dict[str, dict[str, Side]]) -> dict:
    """Item 4: the gate and its floor F, alternating (F first in even repetitions); figures are medians (s)."""
    runs: list[dict] = []
    # Untimed: checks that both reproductions run, and compiles the base work trees' bytecode before timing.
    floor_deepspeed(args, sides["deepspeed"]["base"], -1)
    floor_accelerate(args, sides["accelerate"]["base"], -1)
    for index in range(args.gate_repeat):
        entry = {}
        steps = ("floor", "gate") if index % 2 == 0 else ("gate", "floor")
        for step in steps:
            if step == "floor":
                entry["deepspeed"] = floor_deepspeed(args, sides["deepspeed"]["base"], index)
                entry["accelerate"] = floor_accelerate(args, sides["accelerate"]["base"], index)
            else:
                entry["gate"] = run_gate(args, index)
        entry["F_s"] = entry["deepspeed"]["seconds"] + entry["accelerate"]["seconds"]
        runs.append(entry)
        print(f"bench: gate repetition {index + 1}/{args.gate_repeat}: gate {entry['gate']['seconds']:.1f} s "
              f"({entry['gate']['verdict']}), F {entry['F_s']:.1f} s", flush=True)
    med = statistics.median
    stages = {name: {stage: med(r["gate"]["stages"].get(name, {}).get(stage, 0.0) for r in runs) for stage in by_stage}
              for name, by_stage in runs[0]["gate"]["stages"].items()}
    pytest_runs = {label: med(r["gate"]["runs"].get(label, 0.0) for r in runs) for label in runs[0]["gate"]["runs"]}
    gate_s, floor_s = med(r["gate"]["seconds"] for r in runs), med(r["F_s"] for r in runs)
    return {"runs": runs, "gate_s": gate_s, "F_s": floor_s,
            "deepspeed_repro_s": med(r["deepspeed"]["seconds"] for r in runs),
            "accelerate_repro_s": med(r["accelerate"]["seconds"] for r in runs),
            "gate_over_F": round(med(r["gate"]["seconds"] / r["F_s"] for r in runs), 2),
            "verdicts": [r["gate"]["verdict"] for r in runs], "stages_s": stages,
            "runs_s": pytest_runs}


def profile_items(args: argparse.Namespace) -> list[tuple[str, list[str], Path]]:
    """The gate's parts, each as (label, command, cwd): interpreter start, imports, and per upstream its pytest runs.

    The pytest commands are the gate's own (``scripts.gate.pytest_command``, same rootdir) with the JUnit XML under
    ``<out>/profile``, run on the checkouts as they are; then variants: the kit suite without xdist, its collection,
    its 2-process launch without pytest, and "what if" runs that put the kit suite and the upstream tests of one
    upstream (or of both) in one pytest process without xdist, from the kit's root.
    """
    py, kit, table = str(args.python), sources.KIT_ROOT, sources.load()
    xml = args.out / "profile" / "junit.xml"
    items = [("python -c pass", [py, "-c", "pass"], kit),
             ("import torch", [py, "-c", "import torch"], kit),
             ("import the DeepSpeed sampler", [py, "-c", "import deepspeed.runtime.data_pipeline.data_sampling."
                                                     "data_sampler"], kit),
             ("import accelerate", [py, "-c", "import accelerate"], kit)]
    merged_all = []
    for name in ("deepspeed", "accelerate"):
        suite = [f"--rootdir={kit}", str(kit / "tests" / name)]
        items += [(f"{name} kit suite, -n {args.jobs} (as the gate)", pytest_command(py, xml, args.jobs, suite, True),
                   kit),
                  (f"{name} kit suite, -n 0", pytest_command(py, xml, "0", suite, True), kit),
                  (f"{name} kit suite, collection only",
                   pytest_command(py, xml, "0", ["--collect-only", *suite], True), kit)]
        worker = kit / "tests" / name / f"{name}_worker.py"
        if worker.exists():  # the suite's one 2-process launch of every scenario, without pytest
            launch = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(worker),
                      str(args.out / "profile" / f"{name}-launch")]
            items.append((f"{name} kit suite's 2-process launch alone", launch, kit))
        upstream_tests = table.get(name, {}).get("gate", {}).get("upstream_tests", [])
        if upstream_tests:
            command = pytest_command(py, xml, "0", ["--rootdir=.", *upstream_tests], False)
            items.append((f"{name} upstream tests (as the gate)", command, args.checkouts / name))
            merged = [str(kit / "tests" / name), *(str(args.checkouts / name / test) for test in upstream_tests)]
            merged_all += merged
            items.append((f"what if: {name} kit suite + upstream tests in one process, -n 0",
                          pytest_command(py, xml, "0", [f"--rootdir={kit}", *merged], True), kit))
    items.append(("what if: one stage (both upstreams, kit + upstream tests) in one process, -n 0",
                  pytest_command(py, xml, "0", [f"--rootdir={kit}", *merged_all], True), kit))
    return items


def bench_gate_profile(args: argparse.Namespace) -> dict:
    """Where the gate's time goes: each of ``profile_items`` ``--gate-repeat`` times, round-robin.

    Returns {label: {"seconds": median, "runs": [s, ...], "exits": [status, ...], "last_line": of the last run's
    output}}. A non-zero exit status is recorded, not an error (the suite may fail on purpose); a timeout raises
    BenchError.
    """
    items, seconds = profile_items(args), {}
    (args.out / "profile").mkdir(parents=True, exist_ok=True)
    for label, command, _ in items:
        if label.endswith("launch alone"):
            Path(command[-1]).mkdir(exist_ok=True)
    for index in range(args.gate_repeat):
        for number, (label, command, cwd) in enumerate(items):
            run = run_limited(command, args.out / "logs" / f"profile-{number}-{index}", args.timeout, cwd=cwd)
            if run.returncode is None:
                raise BenchError(f"profile: {label} timed out after {args.timeout:.0f} s; log {run.out}")
            entry = seconds.setdefault(label, {"runs": [], "exits": []})
            entry["runs"].append(run.seconds)
            entry["exits"].append(run.returncode)
            lines = run.out.read_text(errors="replace").split("\n")
            entry["last_line"] = next((line.strip("= ") for line in reversed(lines) if line.strip()), "")
            if label.endswith("launch alone"):
                for scenario, delta in scenario_times(Path(command[-1])).items():
                    entry.setdefault("scenarios", {}).setdefault(scenario, []).append(delta)
        print(f"bench: gate profile repetition {index + 1}/{args.gate_repeat}", flush=True)
    for entry in seconds.values():
        entry["seconds"] = statistics.median(entry["runs"])
        if "scenarios" in entry:
            entry["scenarios"] = {name: statistics.median(values) for name, values in entry["scenarios"].items()}
    return seconds


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

    Returns {"runs": [s, ...], "seconds": median, "commit", "exit"}; raises BenchError when a run fails.
    """
    seconds, commit = [], rev(sources.KIT_ROOT)
    for index in range(args.cold_apply):
        with tempfile.TemporaryDirectory(prefix="kit-cold-apply-") as tmp:
            clone = Path(tmp) / "kit"
            git(sources.KIT_ROOT, "clone", "--quiet", "--no-hardlinks", str(sources.KIT_ROOT), str(clone))
            run = run_limited(["make", "apply"], args.out / "logs" / f"cold-apply-{index}", args.gate_timeout,
                              cwd=clone)
            check_run(run, "cold `make apply`", args.gate_timeout)
            seconds.append(run.seconds)
        print(f"bench: cold make apply {index + 1}/{args.cold_apply}: {seconds[-1]:.1f} s", flush=True)
    return {"runs": seconds, "seconds": statistics.median(seconds), "commit": commit}


# ---------------------------------------------------------------------------------------------------------------
# The report.


def machine_info() -> dict:
    """nproc, CPU model, kernel, load average (1 min) and the Python running the bench."""
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "cpu": model,
            "kernel": platform.release(), "load_1min_start": round(os.getloadavg()[0], 2),
            "bench_python": platform.python_version()}


def fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    """``value * scale`` with ``digits`` decimals, or '-' for None."""
    return "-" if value is None else f"{value * scale:.{digits}f}"


def verdict(row: dict) -> str:
    """'met', or 'not met' with '(better than base)' when every miss is in the good direction, bold otherwise."""
    if row["met"]:
        return "met"
    return "not met (better than base)" if row.get("better") else "**not met**"


def band(ratios: list[float], goal: str, lower_is_better: bool = True) -> dict:
    """A target row for ratios patched/base that should lie within 1.00 +- 0.05.

    ``better`` is True when every ratio outside the band lies on the good side (below for times, above for rates).
    """
    outside = [r for r in ratios if abs(r - 1) > 0.05]
    better = bool(outside) and all((r < 1) == lower_is_better for r in outside)
    return {"goal": goal, "measured": ", ".join(f"{r:.3f}" for r in ratios), "met": not outside, "better": better}


def targets(doc: dict) -> list[dict]:
    """The issue's goals against the measured figures: [{"goal", "measured", "met", "better"}]."""
    rows = []
    acc, ds, gate = doc.get("accelerate"), doc.get("deepspeed"), doc.get("gate")
    if acc:
        nw6 = acc["by_workers"]["6"]
        ratio, workers = nw6["prepare_s"]["ratio"], nw6["workers_after_prepare"]["patched"]
        rows.append({"goal": "prepare() at num_workers=6: patched >= 20x faster than base, 0 worker processes",
                     "measured": f"{1 / ratio:.1f}x faster, {workers:g} workers",
                     "met": 1 / ratio >= 20 and workers == 0})
        labels = {"epoch0_s": "epoch 0 (patched includes starting the workers, base does that in prepare())",
                  "prepare_epoch0_s": "prepare() + epoch 0", "epoch1_s": "epoch 1"}
        for metric, label in labels.items():
            ratios = [acc["by_workers"][str(nw)][metric]["ratio"] for nw in NUM_WORKERS]
            rows.append(band(ratios, f"Accelerate {label}: ratio patched/base within 1.00 +- 0.05 (nw 0, 2, 6)"))
    if ds:
        for metric, label, lower in (("batches_per_s", "sampler batches/s (wall)", False),
                                     ("batches_per_cpu_s", "sampler batches per CPU second", False),
                                     ("state_roundtrip_s", "state_dict() + load_state_dict() (wall)", True),
                                     ("state_roundtrip_cpu_s", "state_dict() + load_state_dict() (CPU)", True)):
            ratios = [ds["by_scenario"][s][metric]["ratio"] for s in DS_SCENARIOS]
            rows.append(band(ratios, f"DeepSpeed {label}: ratio patched/base within 1.00 +- 0.05 "
                                     f"({', '.join(DS_SCENARIOS)})", lower_is_better=lower))
    if gate:
        rows.append({"goal": "gate <= 3 F", "measured": f"{gate['gate_over_F']:.2f} F",
                     "met": gate["gate_over_F"] <= 3})
    return rows


def markdown(doc: dict) -> str:
    """The Markdown report of ``doc`` (the JSON document)."""
    m, md = doc["machine"], ["# Benchmarks", ""]
    versions = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    md += [f"Command: `{doc['command']}`", "",
           f"Machine: {m['nproc']} cores ({m['cpu']}), kernel {m['kernel']}, load (1 min) {m['load_1min_start']} at "
           f"start and {m['load_1min_end']} at end; venv: {versions}.",
           f"Started {doc['started']}, took {doc['wall_s']:.0f} s. Every figure is a median over repetitions; every "
           "ratio patched/base is the median of per-repetition ratios of adjacent base/patched processes "
           "(range in brackets).", ""]
    md += ["## Sides", "", "| upstream | side | commit | imported from | note |", "|---|---|---|---|---|"]
    for upstream, by_side in doc["sides"].items():
        for name, side in by_side.items():
            modules = ", ".join(f"`{x}`" for x in side["modules"])
            md.append(f"| {upstream} | {name} | `{side['commit'][:12]}` | {modules} | {side['note']} |")
    md.append("")
    if doc.get("accelerate"):
        acc = doc["accelerate"]
        s, processes = acc["settings"], acc["by_workers"]["0"]["prepare_s"]["runs"]
        md += ["## Accelerate: prepare() and one epoch (items 1, 2)", "",
               f"One process, `DataLoaderConfiguration(use_stateful_dataloader=True)`, `DataLoader(TensorDataset("
               f"{s['samples']} x {s['features']}), batch_size={s['batch_size']}, shuffle=True)`; per process "
               f"{s['inner']} timed rounds after a warm-up round (median), {processes} processes per side. "
               "Epoch 0 on the patched side includes starting the workers, which the base does "
               "in prepare(); prepare + epoch 0 compares the same work; epoch 1 runs code the patch does not "
               "change, so its ratio shows this run's noise floor.", "",
               "| num_workers | prepare base ms | prepare patched ms | ratio | speed-up | workers after prepare "
               "base / patched | epoch 0 base ms | epoch 0 patched ms | ratio | prepare + epoch 0 ratio | epoch 1 "
               "ratio |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for nw, row in acc["by_workers"].items():
            p, w, e0, pe, e1 = (row[k] for k in ("prepare_s", "workers_after_prepare", "epoch0_s", "prepare_epoch0_s",
                                                 "epoch1_s"))
            md.append(f"| {nw} | {fmt(p['base'], 1e3)} | {fmt(p['patched'], 1e3)} | {fmt(p['ratio'], digits=3)} | "
                      f"{fmt(1 / p['ratio'], digits=1)}x | {w['base']:g} / {w['patched']:g} | "
                      f"{fmt(e0['base'], 1e3, 0)} | {fmt(e0['patched'], 1e3, 0)} | {ratio_cell(e0)} | "
                      f"{ratio_cell(pe)} | {ratio_cell(e1)} |")
        md.append("")
    if doc.get("deepspeed"):
        ds = doc["deepspeed"]
        s, processes = ds["settings"], ds["by_scenario"][DS_SCENARIOS[0]]["batches_per_s"]["runs"]
        md += ["## DeepSpeed: curriculum sampler (item 3)", "",
               f"`DeepSpeedDataSampler`, micro-batch 4, gradient accumulation 2, one data-parallel rank, "
               f"{s['epoch_samples']} samples per epoch, `barrier`/`broadcast` stubbed as no-ops. Throughput over "
               f"{s['steps']} micro-batches after {s['warmup']}, median of {s['blocks']} blocks, by the wall clock "
               f"and per CPU second of the process (not inflated by waiting for a core); state_dict() of that "
               f"sampler + load_state_dict() into a new one, median of {s['inner']}; {processes} processes per side. "
               "The patch does not change the iteration: the batches/s ratios show this run's noise floor.", "",
               "| scenario | batches/s base | batches/s patched | ratio (wall) | ratio (CPU) | state_dict + "
               "load_state_dict base us | patched us | ratio (wall) | ratio (CPU) | state_dict base / patched us | "
               "load_state_dict base / patched us |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for scenario, row in ds["by_scenario"].items():
            t, r = row["batches_per_s"], row["state_roundtrip_s"]
            sd, ld = row["state_dict_s"], row["load_state_dict_s"]
            md.append(f"| {scenario} | {fmt(t['base'], digits=0)} | {fmt(t['patched'], digits=0)} | {ratio_cell(t)} | "
                      f"{ratio_cell(row['batches_per_cpu_s'])} | {fmt(r['base'], 1e6, 1)} | "
                      f"{fmt(r['patched'], 1e6, 1)} | {ratio_cell(r)} | {ratio_cell(row['state_roundtrip_cpu_s'])} | "
                      f"{fmt(sd['base'], 1e6, 1)} / {fmt(sd['patched'], 1e6, 1)} | "
                      f"{fmt(ld['base'], 1e6, 1)} / {fmt(ld['patched'], 1e6, 1)} |")
        md.append("")
    if doc.get("gate"):
        g = doc["gate"]
        stages = "; ".join(f"{name} " + ", ".join(f"{stage} {v:.1f}" for stage, v in by_stage.items())
                           for name, by_stage in g["stages_s"].items())
        runs = ", ".join(f"{label} {v:.1f}" for label, v in g["runs_s"].items())
        md += ["## The gate against its floor F (item 4)", "",
               f"F = one DeepSpeed resume reproduction in a fresh Python process + one 2-process Accelerate "
               f"reproduction (`torch.distributed.run --standalone --nproc_per_node=2`, 2 workers), both on the base "
               f"work trees; the gate is `python -m scripts.gate` (as `make gate`). {len(g['runs'])} repetitions, "
               "alternating.", "",
               "| figure | median s | runs s |", "|---|---|---|",
               f"| gate | {g['gate_s']:.1f} | {runs_cell(r['gate']['seconds'] for r in g['runs'])} |",
               f"| F | {g['F_s']:.1f} | {runs_cell(r['F_s'] for r in g['runs'])} |",
               f"| DeepSpeed reproduction | {g['deepspeed_repro_s']:.1f} | "
               f"{runs_cell(r['deepspeed']['seconds'] for r in g['runs'])} |",
               f"| Accelerate 2-process reproduction | {g['accelerate_repro_s']:.1f} | "
               f"{runs_cell(r['accelerate']['seconds'] for r in g['runs'])} |",
               "", f"**gate / F = {g['gate_over_F']:.2f}** (median of per-repetition ratios; goal <= 3). Gate "
               f"verdicts: {', '.join(str(v) for v in g['verdicts'])}. Reproductions on the base: DeepSpeed batches "
               f"differing after the resume {[r['deepspeed']['differing'] for r in g['runs']]} of 15; Accelerate "
               f"samples missing in epoch 0 {[r['accelerate']['missing'] for r in g['runs']]} of {REPRO_SAMPLES}.", "",
               f"Gate stages (median s, from the gate's report): {stages}. Its pytest runs (median s): {runs}.", ""]
    if doc.get("gate_profile"):
        md += ["## Where the gate's time goes (--profile-gate)", "",
               "Each part alone, on the checkouts as they are (after the gate: series applied), median of the "
               "repetitions (s); the last column is the end of the last run's output and the exit statuses.", "",
               "| part | median s | runs s | last output (exit statuses) |", "|---|---|---|---|"]
        md += [f"| {label} | {entry['seconds']:.1f} | {runs_cell(entry['runs'])} | {entry['last_line'][:60]} "
               f"({', '.join(str(e) for e in entry['exits'])}) |" for label, entry in doc["gate_profile"].items()]
        for label, entry in doc["gate_profile"].items():
            if entry.get("scenarios"):
                times = entry["scenarios"]
                md += ["", f"Inside \"{label}\" ({entry['seconds']:.1f} s), per scenario (median s, gap between the "
                       f"rank-0 result files; the first scenario has none): {sum(times.values()):.1f} s in all; "
                       + ", ".join(f"{name} {value:.2f}" for name, value in times.items()) + "."]
        md.append("")
    if doc.get("cold_apply"):
        c = doc["cold_apply"]
        md += ["## Cold `make apply` (item 5)", "",
               f"Fresh `git clone` of the kit at `{c['commit'][:12]}` (committed files only) in a temporary "
               f"directory, then `make apply` (pip's own cache as it is): {c['seconds']:.0f} s (runs: "
               f"{runs_cell(c['runs'], 0)}).", ""]
    if doc["errors"]:
        md += ["## Errors (these parts were not measured)", ""] + [f"- {error}" for error in doc["errors"]] + [""]
    md += ["## Targets (goals of issue 7; measured figures reported whether met or not)", "",
           "| goal | measured | |", "|---|---|---|"]
    md += [f"| {t['goal']} | {t['measured']} | {verdict(t)} |" for t in doc["targets"]]
    return "\n".join(md) + "\n"


def runs_cell(values, digits: int = 1) -> str:
    """The values of the repetitions, comma-separated, with ``digits`` decimals."""
    return ", ".join(f"{value:.{digits}f}" for value in values)


def ratio_cell(entry: dict) -> str:
    """``ratio [min-max]`` of a compare() entry."""
    if entry["ratio"] is None:
        return "-"
    return f"{entry['ratio']:.3f} [{entry['ratio_min']:.2f}-{entry['ratio_max']:.2f}]"


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the options; ``--version``/``--patched-from`` become dicts ``versions``/``patched_from``."""
    parser = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--python", type=Path, default=sources.KIT_ROOT / ".venv" / "bin" / "python",
                        help="the venv Python of the measurement processes (default .venv/bin/python)")
    parser.add_argument("--version", action="append", default=[], metavar="NAME=VERSION",
                        help="another pinned release (default: upstream/sources.toml); passed on to the gate")
    parser.add_argument("--only", choices=("accelerate", "deepspeed", "gate", "profile", "cold-apply"),
                        action="append", help="run only these parts (repeatable); default accelerate, deepspeed, gate")
    parser.add_argument("--profile-gate", action="store_true",
                        help="also time the gate's parts: interpreter start, imports, each pytest run (slow)")
    parser.add_argument("--repeat", type=int, default=7, help="processes per side for items 1-3 (default 7)")
    parser.add_argument("--inner", type=int, default=5, help="timed rounds per Accelerate process (default 5)")
    parser.add_argument("--samples", type=int, default=8192, help="samples of the Accelerate dataset (default 8192)")
    parser.add_argument("--batch-size", type=int, default=32, help="Accelerate batch size (default 32)")
    parser.add_argument("--steps", type=int, default=5000, help="timed DeepSpeed sampler micro-batches (default 5000)")
    parser.add_argument("--roundtrips", type=int, default=200, help="state round trips per DeepSpeed process")
    parser.add_argument("--gate-repeat", type=int, default=3, help="gate and floor repetitions (default 3)")
    parser.add_argument("--jobs", default="auto", help="the gate's pytest-xdist workers (default auto)")
    parser.add_argument("--cold-apply", type=int, nargs="?", const=1, default=0, metavar="N",
                        help="also time `make apply` on a fresh clone N times (default 1 when given; slow)")
    parser.add_argument("--patched-from", action="append", default=[], metavar="NAME=DIR",
                        help="measure the source tree DIR as the patched side of NAME instead of the checkout")
    parser.add_argument("--keep-worktrees", action="store_true", help="leave build/bench/worktrees/ for a next run")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per measurement process (default 600)")
    parser.add_argument("--gate-timeout", type=float, default=1800, help="seconds per gate / cold apply run")
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--out", type=Path, default=sources.KIT_ROOT / "build" / "bench")
    args = parser.parse_args(argv)
    args.versions = sources.versions(args.version)
    args.patched_from = {n: Path(d) for n, _, d in (p.partition("=") for p in args.patched_from)}
    args.parts = set(args.only or ("accelerate", "deepspeed", "gate")) | ({"profile"} if args.profile_gate else set())
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
    worktrees: list = []
    try:
        sides = {name: make_sides(args, name, worktrees) for name in ("accelerate", "deepspeed")}
        parts = [("accelerate", lambda: bench_accelerate(args, sides["accelerate"])),
                 ("deepspeed", lambda: bench_deepspeed(args, sides["deepspeed"])),
                 ("gate", lambda: bench_gate(args, sides)), ("gate_profile", lambda: bench_gate_profile(args)),
                 ("cold_apply", lambda: bench_cold_apply(args))]
        for key, measure in parts:
            if {"gate_profile": "profile", "cold_apply": "cold-apply"}.get(key, key) in args.parts:
                try:
                    doc[key] = measure()
                except KitError as e:  # reported, and the other parts still run
                    print(f"error: {e}", file=sys.stderr)
                    doc["errors"].append(f"{key}: {e}")
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_worktrees:
            for repo, path in worktrees:
                remove_worktree(repo, path)
    doc["sides"] = {name: {side.name: side.describe() for side in by_side.values()} for name, by_side in sides.items()}
    for part in ("accelerate", "deepspeed"):
        doc["versions"].update(doc.get(part, {}).get("versions", {}))
    doc["machine"]["load_1min_end"] = round(os.getloadavg()[0], 2)
    doc["wall_s"] = round(time.monotonic() - started, 1)
    doc["targets"] = targets(doc)
    (args.out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "report.md").write_text(markdown(doc))
    print(f"bench: report in {args.out}/report.md ({doc['wall_s']:.0f} s)")
    for row in doc["targets"]:
        print(f"  {verdict(row)}: {row['goal']}: {row['measured']}")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
