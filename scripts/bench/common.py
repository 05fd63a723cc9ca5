"""What the parts of ``make bench`` share: the base and patched sides, measurement processes, figures, formatting.

A side is one upstream's code under measurement: the base side imports it from a tree (a shared clone) at
``base/<version>`` (scripts/worktree.py, under ``<out>/worktrees/``) through ``PYTHONPATH``; the patched side is the
editable install, i.e. the checkout ``upstream/<name>`` as it is (or ``--patched-from NAME=DIR``). Each measurement
runs in a fresh process of the venv's Python (``scripts/bench/child.py``) through scripts/launch.py (timeout, stack
dumps, nothing left running), and every result is checked to come from the intended tree.
"""

import argparse
import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from scripts import KitError, launch, sources, worktree
from scripts.git import git, rev

CHILD = sources.KIT_ROOT / "scripts" / "bench" / "child.py"
MARKER = "BENCH-RESULT "  # child.MARKER
SIDES = ("base", "patched")


class BenchError(KitError):
    """A measurement could not be taken; the message names the process and its log."""


def check(run: launch.Launch, what: str, timeout: float) -> None:
    """Raise BenchError when ``run`` timed out or exited non-zero; the message holds the end of its log."""
    if run.timed_out:
        raise BenchError(f"{what} timed out after {timeout:.0f} s (killed; stacks in the log); log {run.log}:\n"
                         f"{run.tail(1500)}")
    if run.returncode != 0:
        raise BenchError(f"{what} exited with status {run.returncode}; log {run.log}:\n{run.tail(1500)}")


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


def source_changes(repo: Path, version: str, test_paths: tuple[str, ...]) -> list[str]:
    """Files outside ``test_paths`` that differ between ``base/<version>`` and HEAD of ``repo`` (the fix)."""
    changed = git(repo, "diff", "--name-only", f"base/{version}", "HEAD").stdout.split()
    return [name for name in changed if not name.startswith(test_paths)]


def make_sides(args: argparse.Namespace, upstream: str) -> dict[str, Side]:
    """The base and patched Side of ``upstream``; the base side's tree is ``<out>/worktrees/<upstream>``."""
    pin = sources.pin(upstream, args.versions.get(upstream))
    repo = args.checkouts / upstream
    if not (repo / ".git").exists():
        raise BenchError(f"{repo} does not exist: run `make apply` first")
    tree = worktree.add(repo, args.out / "worktrees" / upstream, f"base/{pin.version}")
    base = Side(upstream, "base", tree, str(worktree.package_dir(tree, upstream)), rev(tree),
                f"work tree at base/{pin.version}")
    if upstream in args.patched_from:
        other = args.patched_from[upstream].resolve()
        patched = Side(upstream, "patched", other, str(worktree.package_dir(other, upstream)), "", "--patched-from")
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
    """Run ``child.py KIND PARAMS`` for ``side``; return its result (module checked). Raises BenchError."""
    run = launch.run([str(args.python), str(CHILD), kind, json.dumps(params)], log, args.timeout,
                     cwd=sources.KIT_ROOT, env=child_env(side))
    what = f"{kind} ({side.upstream} {side.name}, {log.name})"
    check(run, what, args.timeout)
    lines = [line for line in run.log.read_text(errors="replace").splitlines() if line.startswith(MARKER)]
    if not lines:
        raise BenchError(f"{what} printed no result; log {run.log}")
    result = json.loads(lines[-1][len(MARKER):])
    check_module(side, result["module"], what)
    return result


def cut_short(args: argparse.Namespace, part: str, runs: dict[str, list], total: int) -> None:
    """Ctrl-C came during ``part`` (``runs``: {side: [results]}, ``total`` repetitions asked for): keep the complete
    repetitions (both sides; ``runs`` is trimmed in place) and record in ``args.interrupted`` where the part stopped,
    so that the report holds them; re-raise KeyboardInterrupt when not one repetition is complete."""
    done = min(len(values) for values in runs.values())
    if not done:
        raise KeyboardInterrupt
    for values in runs.values():
        del values[done:]
    args.interrupted = f"during {part}, after {done} of {total} repetitions"


def side_order(repetition: int) -> tuple[str, str]:
    """Base first in even repetitions, patched first in odd ones."""
    return SIDES if repetition % 2 == 0 else SIDES[::-1]


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


def fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    """``value * scale`` with ``digits`` decimals, or '-' for None."""
    return "-" if value is None else f"{value * scale:.{digits}f}"


def runs_cell(values, digits: int = 1) -> str:
    """The values of the repetitions, comma-separated, with ``digits`` decimals."""
    return ", ".join(f"{value:.{digits}f}" for value in values)


def ratio_cell(entry: dict) -> str:
    """``ratio [min-max]`` of a compare() entry."""
    if entry["ratio"] is None:
        return "-"
    return f"{entry['ratio']:.3f} [{entry['ratio_min']:.2f}-{entry['ratio_max']:.2f}]"
