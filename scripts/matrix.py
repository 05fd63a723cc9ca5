"""The version matrix: every pinned release of every upstream, gated as it declares, across one dependency's versions.

Rows: for each upstream, each release in its ``releases`` table (upstream/sources.toml), and each version of its
dependency axis ``[<name>.matrix]`` (``package``, ``versions``; no axis, or ``--no-deps``: the running venv only),
one gate run ``python -m scripts.gate --only NAME --version NAME=RELEASE --out build/matrix/<row>/`` with the Python
of that dependency version's venv. The gate works in git worktrees of its own, so the user's checkouts
(``upstream/<name>/``) are never switched; the matrix only adds missing ``base/<version>`` tags (scripts.upstream
checkout).

Venvs: the version the lock (requirements/constraints.txt) holds runs in the kit's venv (the running Python).
Every other version gets ``build/matrix/venv-<package>-<version>/``: a real venv (no system site-packages) with
``TORCH`` and every locked package, that one changed (and the axis' ``unpin`` packages left to pip, when their
locked version cannot go with it); reused while its requirements are the same. A venv that pip cannot make, or
in which ``import <axis import>`` fails, is measured, not gated: its rows say why (pip's first error line, or the
import's last line).

Declarations: ``[<name>.releases."<version>"]`` may set ``check = "fix"`` (with a one-line ``reason``): only the
fix is checked there; the default is ``"series"``: the whole series applies and passes the gate. The gate runs the
declared check and reports it (report.json ``check``); a row meets its declaration when the gate exits 0 and
reports the declared check.

Upstreams run in parallel (``--jobs``, one gate at a time per upstream, so two runs never share a checkout's
worktrees): each upstream's rows in the kit's venv first, then those of its other venvs, which one more thread
makes meanwhile. Writes ``build/matrix/report.{json,md}``, with its date and the id of each series it judged
(scripts/stack.series_id), which ``make pr`` compares with the series of its bodies. A series of several commits is
gated as the gate judges it, commit by commit (its rows count every commit's FAIL_TO_PASS).
Exit status 0 exactly when every row meets its declaration; 1 otherwise, naming each row that does not.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from scripts import KitError, last_line, launch, lock, runlock, sources, upstream

OUT = sources.KIT_ROOT / "build" / "matrix"
# No single pip install or gate run of the matrix takes this long (seconds); past it the run is killed.
TIMEOUT_S = 3600


@dataclass
class Row:
    """One gate run: upstream and release, the dependency version (``numpy 2.3.5``; '' without an axis), the venv
    (``kit`` or its path), the declared check and the check the gate reports, the gate's verdict (``pass``,
    ``fail``, ``not run``), FAIL_TO_PASS / PASS_TO_PASS counts, wall time in seconds, and notes (violations,
    why it was not run), and the id of the series the gate judged (scripts/stack.series_id)."""

    upstream: str
    release: str
    dependency: str
    venv: str
    declared: str
    check: str = "-"
    gate: str = "not run"
    FAIL_TO_PASS: int | None = None
    PASS_TO_PASS: int | None = None
    wall_s: float = 0.0
    meets: bool = False
    notes: tuple[str, ...] = ()
    series_id: str = ""

    @property
    def name(self) -> str:
        """The row's short name: ``accelerate 1.13.0 with torchdata 0.8.0``."""
        return f"{self.upstream} {self.release}" + (f" with {self.dependency}" if self.dependency else "")


class Runner:
    """Runs commands from several threads, each in a session of its own with its output in a log, and kills every
    running one at once (``stop``) when the matrix is interrupted."""

    def __init__(self) -> None:
        self.running: set[subprocess.Popen] = set()
        self.stopped = threading.Event()
        self.lock = threading.Lock()

    def run(self, command: list[str], log: Path, env: dict | None = None) -> int | None:
        """Run ``command`` in the kit's root, stdout and stderr appended to ``log``; return its exit status (None
        when it timed out after TIMEOUT_S, or when the matrix was stopped). The whole process tree is killed
        before returning."""
        if self.stopped.is_set():
            return None
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as out:
            out.write(f"$ {shlex.join(command)}\n")
            out.flush()
            with self.lock:  # started and registered at once: a stop() sees the command, or it never starts
                if self.stopped.is_set():
                    return None
                proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=sources.KIT_ROOT, env=env, start_new_session=True)
                self.running.add(proc)
            try:
                returncode = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                launch.kill_tree(proc)
                with self.lock:
                    self.running.discard(proc)
        return None if self.stopped.is_set() else returncode

    def stop(self) -> None:
        """Refuse new commands and kill every running one with every process below it (launch.kill_tree: the
        processes are listed before any is killed, so none is orphaned and missed). A gate killed so leaves work
        trees in its ``--out``, which its next run removes."""
        self.stopped.set()
        with self.lock:
            running = list(self.running)
        for proc in running:
            launch.kill_tree(proc)


def version_key(version: str) -> tuple:
    """Sort key of a release number (``0.19.10`` after ``0.19.8``)."""
    return tuple(int(part) if part.isdigit() else part for part in version.split("."))


def error_of(log: Path) -> str:
    """What went wrong in a pip or Python run, from its log: pip's first ``ERROR:`` line, else the last line."""
    text = log.read_text(errors="replace") if log.exists() else ""
    errors = [line.strip() for line in text.splitlines() if line.startswith("ERROR")]
    return errors[0] if errors else last_line(text) or "no output"


def variant_venv(runner: Runner, axis: dict, version: str, args: argparse.Namespace) -> tuple[str, list[str]]:
    """Make (or reuse) the venv with ``axis["package"]`` at ``version``; return (its Python, notes) or ('', why not).

    The requirements are every line of the lock with the package at ``version`` and the packages of
    ``axis["unpin"]`` unversioned; ``torch`` is ``args.torch``. The venv is reused while a stamp file in it holds
    the same requirements, pip options and torch. Notes name the version pip chose for each unpinned package, and
    what ``pip check`` finds in the venv, if anything.
    """
    package, probe = axis["package"], axis.get("import", axis["package"])
    venv = args.out / f"venv-{package}-{version}"
    log = args.out / f"venv-{package}-{version}.log"
    locked = lock.read(args.constraints)
    unpin = {lock.canonical(name) for name in axis.get("unpin", [])}
    lines = [f"{package}=={version}"] + [name if name in unpin else f"{name}=={v}" for name, v in locked.items()
                                         if name != lock.canonical(package)]
    spec = "\n".join([f"# torch: {args.torch}", f"# pip options: {args.pip_options}", *lines]) + "\n"
    python, stamp = venv / "bin" / "python", venv / "kit-matrix-requirements.txt"
    if not (stamp.exists() and stamp.read_text() == spec and python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        log.unlink(missing_ok=True)
        if runner.run([args.python, "-m", "venv", str(venv)], log) != 0:
            return "", [f"python -m venv failed: {error_of(log)}"]
        requirements = venv / "requirements.txt"
        requirements.write_text(spec)
        pip = [str(python), "-m", "pip", "install", "--quiet", *shlex.split(args.pip_options), args.torch, "-r",
               str(requirements)]
        if runner.run(pip, log) != 0:
            return "", [f"pip cannot install {package} {version} with {args.torch} and the lock: {error_of(log)}"]
        stamp.write_text(spec)
    show = "; ".join(f"print({name!r}, metadata.version({name!r}))" for name in sorted(unpin))
    code = f"import {probe}; from importlib import metadata; {show}"
    if runner.run([str(python), "-c", code], log) != 0:
        return "", [f"`import {probe}` fails with {package} {version}: {error_of(log)}"]
    chosen = log.read_text().splitlines()[-len(unpin):] if unpin else []
    notes = [f"{line.replace(' ', ' unpinned, pip chose ', 1)}" for line in chosen]
    if runner.run([str(python), "-m", "pip", "check"], log) != 0:
        notes.append(f"`pip check` is not clean: {last_line(log.read_text())}")
    return str(python), notes


def kit_venv(axis: dict, version: str) -> tuple[str, list[str]]:
    """The running Python (the kit's venv) for the locked version; ('', why not) when the venv holds another."""
    try:
        have = metadata.version(axis["package"])
    except metadata.PackageNotFoundError:
        have = "none"
    if have.split("+")[0] != version:
        return "", [f"the kit's venv has {axis['package']} {have}, the lock {version}: run make apply"]
    return sys.executable, []


def gate_row(runner: Runner, row: Row, python: str, args: argparse.Namespace) -> Row:
    """Run the gate for ``row`` with ``python`` (its stages one at a time: the matrix runs upstreams side by side);
    fill in its verdict, check, counts and notes from its report.json. The row meets its declaration when the gate
    exits 0, ran the declared check, and records the row's dependency version in its environment (``versions``)."""
    out = args.out / row.name.replace(" with ", "-").replace(" ", "-")
    (out / "report.json").unlink(missing_ok=True)
    command = [python, "-m", "scripts.gate", "--only", row.upstream, "--version", f"{row.upstream}={row.release}",
               f"--out={out}", f"--sources={args.sources}", f"--checkouts={args.checkouts}",
               f"--patches={args.patches}", f"--suites={args.suites}", "--jobs=1"]
    code = runner.run(command, out / "gate.log")
    try:
        doc = json.loads((out / "report.json").read_text())
        result = doc["upstreams"][row.upstream]
    except (OSError, ValueError, KeyError):
        row.gate = "timed out" if code is None else "no report"
        row.notes = (f"the gate wrote no report: {error_of(out / 'gate.log')} (log: {out / 'gate.log'})",)
        return row
    row.gate = "pass" if code == 0 else "fail"
    row.check, row.series_id = result.get("check", "-"), result.get("series_id", "")
    row.FAIL_TO_PASS, row.PASS_TO_PASS = len(result["FAIL_TO_PASS"]), len(result["PASS_TO_PASS"])
    violations = result["violations"]
    notes = violations[:3] + ([f"... {len(violations) - 3} more (report: {out / 'report.md'})"]
                              if len(violations) > 3 else [])
    if result.get("skipped_upstream_tests"):
        notes.append(f"upstream test files skipped (their hunks do not apply): "
                     f"{', '.join(result['skipped_upstream_tests'])}")
    if row.check != row.declared:
        notes.append(f"declares check '{row.declared}', the gate ran '{row.check}'")
    package, _, version = row.dependency.partition(" ")
    ran_with = doc.get("versions", {}).get(package, "") if package else version
    if ran_with.split("+")[0] != version:
        notes.append(f"the gate ran with {package} {ran_with or 'unknown'}, not {version}")
    row.meets = code == 0 and row.check == row.declared and ran_with.split("+")[0] == version
    row.notes = tuple(notes)
    return row


def venv_for(runner: Runner, axis: dict, version: str | None, args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """(Python, venv label, notes) for one dependency version: the kit's venv (``version`` None, or the locked
    version) or its own venv (variant_venv, timed); Python '' when it cannot be gated (the notes say why)."""
    if version is None:
        return sys.executable, "kit", []
    if lock.read(args.constraints).get(lock.canonical(axis["package"])) == version:
        python, notes = kit_venv(axis, version)
        return python, "kit", notes
    started = time.monotonic()
    python, notes = variant_venv(runner, axis, version, args)
    label = os.path.relpath(args.out / f"venv-{axis['package']}-{version}", sources.KIT_ROOT)
    return python, label, [*notes, f"venv made or checked in {round(time.monotonic() - started, 1)} s"]


def upstream_rows(runner: Runner, name: str, entry: dict, built: dict[str, Future], args: argparse.Namespace
                  ) -> list[Row]:
    """Every row of one upstream, gated one after another: first in the kit's venv, then in each venv of its own as
    ``built`` (dependency version -> Future of venv_for) delivers it. Rows come back in the axis' order."""
    axis = {} if args.no_deps else entry.get("matrix", {})
    releases, versions = sorted(entry["releases"], key=version_key), axis.get("versions", [None])
    rows = []
    for version in sorted(versions, key=lambda v: v in built):  # the kit's venv first: no wait
        python, venv, notes = built[version].result() if version in built else venv_for(runner, axis, version, args)
        dependency = f"{axis['package']} {version}" if version else ""
        for release in releases:
            declared = entry["releases"][release].get("check", "series")
            row = Row(name, release, dependency, venv, declared)
            started = time.monotonic()
            if python and not runner.stopped.is_set():
                gate_row(runner, row, python, args)
            row.wall_s = round(time.monotonic() - started, 1)
            reason = [f"declares check '{declared}': {entry['releases'][release].get('reason', 'no reason given')}"]
            row.notes = (*(reason if declared != "series" and version == versions[0] else []),
                         *(notes if release == releases[0] or not python else []), *row.notes)
            print(f"matrix {row.name}: check {row.check} (declared {row.declared}), gate {row.gate}, "
                  f"{'meets' if row.meets else 'DOES NOT MEET'} its declaration ({row.wall_s} s)", flush=True)
            rows.append(row)
    return sorted(rows, key=lambda r: (versions.index(r.dependency.split()[-1] if r.dependency else None),
                                       version_key(r.release)))


def make_bases(table: dict, args: argparse.Namespace) -> None:
    """Add the missing ``base/<version>`` of every release (scripts.upstream checkout; the work tree is not
    touched). Raises KitError with the checkout's error."""
    for name, entry in table.items():
        for release in entry["releases"]:
            code = upstream.main(["checkout", "--only", name, "--version", f"{name}={release}",
                                  f"--sources={args.sources}", f"--checkouts={args.checkouts}",
                                  f"--cache={args.cache}", f"--pip-options={args.pip_options}"])
            if code != 0:
                raise KitError(f"cannot make base/{release} of {name}: see the error above")


def write_report(rows: list[Row], out: Path, wall_s: float, jobs: int) -> str:
    """Write ``report.json`` and ``report.md`` into ``out``; return the markdown."""
    failing = [row.name for row in rows if not row.meets]
    doc = {"verdict": "fail" if failing else "pass", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "series": {row.upstream: row.series_id for row in rows if row.series_id}, "wall_s": wall_s,
           "jobs": jobs, "failing": failing, "rows": [asdict(row) for row in rows]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    series = ", ".join(f"{name} `{sid}`" for name, sid in doc["series"].items())
    md = [f"Matrix: **{doc['verdict'].upper()}**, {len(rows) - len(failing)} of {len(rows)} rows meet their "
          f"declaration; wall time {wall_s} s with {jobs} upstream(s) at once; {doc['date']}; series judged: "
          f"{series or 'none'}.", "",
          "| upstream | release | dependency | venv | declared | check run | gate | FAIL_TO_PASS | PASS_TO_PASS "
          "| wall (s) | meets |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        counts = ["-" if n is None else n for n in (r.FAIL_TO_PASS, r.PASS_TO_PASS)]
        md.append(f"| {r.upstream} | {r.release} | {r.dependency or '-'} | {r.venv} | {r.declared} | {r.check} "
                  f"| {r.gate} | {counts[0]} | {counts[1]} | {r.wall_s} | {'yes' if r.meets else '**no**'} |")
    notes = [f"- {r.name}: {note}" for r in rows for note in r.notes]
    md += ([""] + notes) if notes else []
    (out / "report.md").write_text("\n".join(md) + "\n")
    return "\n".join(md)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the matrix's options (paths default to the kit's own layout)."""
    parser = argparse.ArgumentParser(prog="python -m scripts.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement of the matrix venvs")
    parser.add_argument("--pip-options", default="", help="extra pip options, one shell-quoted string")
    parser.add_argument("--python", default=sys.executable, help="the Python 3.11 that makes the matrix venvs")
    parser.add_argument("--jobs", type=int, default=2, help="upstreams gated at once")
    parser.add_argument("--no-deps", action="store_true", help="no dependency axis: the kit's venv only")
    parser.add_argument("--only", help="this upstream only")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--constraints", type=Path, default=lock.CONSTRAINTS)
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches")
    parser.add_argument("--suites", type=Path, default=sources.KIT_ROOT / "tests")
    parser.add_argument("--cache", type=Path, default=sources.KIT_ROOT / "upstream" / ".sdist")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the matrix; print and write the table; return 0 when every row meets its declaration, else 1."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out = args.out.resolve()
    started = time.monotonic()
    runner = Runner()
    try:
        table = sources.load(args.sources)
        table = {args.only: table[args.only]} if args.only else table
        make_bases(table, args)
        # One thread makes the venvs of the dependency axis, in the order the upstreams need them, while the
        # upstreams' rows in the kit's venv are gated.
        with (launch.sigterm_as_interrupt(), ThreadPoolExecutor(max_workers=1) as builder,
              ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool):
            built = {name: {} for name in table}
            for name, entry in table.items():
                axis = {} if args.no_deps else entry.get("matrix", {})
                locked = lock.read(args.constraints) if axis else {}
                for version in axis.get("versions", []):
                    if locked.get(lock.canonical(axis["package"])) != version:
                        built[name][version] = builder.submit(venv_for, runner, axis, version, args)
            futures = [pool.submit(upstream_rows, runner, name, entry, built[name], args)
                       for name, entry in table.items()]
            try:
                rows = [row for future in futures for row in future.result()]
            except BaseException:
                runner.stop()
                raise
    except KitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("matrix: interrupted; every gate and pip run it started was killed", file=sys.stderr)
        return 130
    md = write_report(rows, args.out, round(time.monotonic() - started, 1), args.jobs)
    print("\n" + md)
    failing = [row.name for row in rows if not row.meets]
    for name in failing:
        print(f"matrix: {name} does not meet its declaration", file=sys.stderr)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(runlock.interruptible(main))  # Ctrl-C: exit 130, no traceback, one line on the checkouts
