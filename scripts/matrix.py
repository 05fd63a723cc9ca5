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

from scripts import ArgumentParser, KitError, last_line, launch, lock, runlock, sources, upstream

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

    @property
    def id(self) -> str:
        """The row's id (``make matrix ROW=<id>``, its folder in build/matrix/): ``accelerate-1.13.0-torchdata-0.8.0``.
        """
        return self.name.replace(" with ", "-").replace(" ", "-")


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
    ``axis["unpin"]`` unversioned; ``torch`` is ``args.torch``, or ``torch==<version>`` on the torch axis. The venv
    is reused while a stamp file in it holds the same requirements, pip options and torch. Notes name the version
    pip chose for each unpinned package, and what ``pip check`` finds in the venv, if anything.
    """
    package, probe = axis["package"], axis.get("import", axis["package"])
    venv = args.out / f"venv-{package}-{version}"
    log = args.out / f"venv-{package}-{version}.log"
    locked = lock.read(args.constraints)
    unpin = {lock.canonical(name) for name in axis.get("unpin", [])}
    torch = f"torch=={version}" if package == "torch" else args.torch  # the torch axis: that torch instead of TORCH
    lines = [f"{package}=={version}"] + [name if name in unpin else f"{name}=={v}" for name, v in locked.items()
                                         if name != lock.canonical(package)]
    spec = "\n".join([f"# torch: {torch}", f"# pip options: {args.pip_options}", *lines]) + "\n"
    python, stamp = venv / "bin" / "python", venv / "kit-matrix-requirements.txt"
    if not (stamp.exists() and stamp.read_text() == spec and python.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        log.unlink(missing_ok=True)
        if runner.run([args.python, "-m", "venv", str(venv)], log) != 0:
            return "", [f"python -m venv failed: {error_of(log)}"]
        requirements = venv / "requirements.txt"
        requirements.write_text(spec)
        pip = [str(python), "-m", "pip", "install", "--quiet", *shlex.split(args.pip_options), torch, "-r",
               str(requirements)]
        if runner.run(pip, log) != 0:
            return "", [f"pip cannot install {package} {version} with {torch} and the lock: {error_of(log)}"]
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
    out = args.out / row.id
    (out / "report.json").unlink(missing_ok=True)
    command = [python, "-m", "scripts.gate", "--only", row.upstream, "--version", f"{row.upstream}={row.release}",
               f"--out={out}", f"--sources={args.sources}", f"--checkouts={args.checkouts}",
               f"--patches={args.patches}", f"--suites={args.suites}", "--jobs=1",
               *(["--no-cache"] if args.no_cache else [])]
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


def locked(axis: dict, version: str, args: argparse.Namespace) -> bool:
    """Whether ``version`` of the axis' package is the lock's (its rows run in the kit's venv)."""
    return lock.read(args.constraints).get(lock.canonical(axis["package"])) == version


def venv_for(runner: Runner, axis: dict, version: str | None, args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """(Python, venv label, notes) for one dependency version: the kit's venv (``version`` None, or the locked
    version) or its own venv (variant_venv, timed); Python '' when it cannot be gated (the notes say why)."""
    if version is None:
        return sys.executable, "kit", []
    if locked(axis, version, args):
        python, notes = kit_venv(axis, version)
        return python, "kit", notes
    started = time.monotonic()
    python, notes = variant_venv(runner, axis, version, args)
    label = os.path.relpath(args.out / f"venv-{axis['package']}-{version}", sources.KIT_ROOT)
    return python, label, [*notes, f"venv made or checked in {round(time.monotonic() - started, 1)} s"]


def plan(table: dict, args: argparse.Namespace) -> list[tuple[Row, dict, str | None]]:
    """Every row of the matrix, in the report's order: per upstream, each version of its dependency axis
    (``[<name>.matrix]``) with every release, then its torch axis (``[<name>.torch_axis]``: the default release with
    each torch version); (the row, its axis ({} for none), its version, None for the kit's venv). ``--no-deps``: no
    axis, one row per release."""
    planned = []
    for name, entry in table.items():
        axis = {} if args.no_deps else entry.get("matrix", {})
        releases = sorted(entry["releases"], key=version_key)
        for version in axis.get("versions", [None]):
            dependency = f"{axis['package']} {version}" if version else ""
            planned += [(Row(name, release, dependency, "", entry["releases"][release].get("check", "series")), axis,
                         version) for release in releases]
        torch = {} if args.no_deps else {"package": "torch", **entry.get("torch_axis", {})}
        default = entry["version"]
        planned += [(Row(name, default, f"torch {version}", "", entry["releases"][default].get("check", "series")),
                     torch, version) for version in torch.get("versions", [])]
    return planned


def upstream_rows(runner: Runner, planned: list[tuple[Row, dict, str | None]], built: dict[tuple, Future],
                  args: argparse.Namespace) -> list[Row]:
    """Gate the ``planned`` rows of one upstream one after another, those in the kit's venv first, then those of
    each venv of its own as ``built`` ((package, version) -> Future of venv_for) delivers it; write each row's
    record (``write_record``). Rows come back in the planned order."""
    pythons: dict[tuple, tuple[str, str, list[str]]] = {}
    seen_releases = set()
    for row, axis, version in sorted(planned, key=lambda p: (p[1].get("package"), p[2]) in built):
        venv_key = (axis.get("package"), version)
        first = venv_key not in pythons
        if first:
            pythons[venv_key] = (built[venv_key].result() if venv_key in built
                                 else venv_for(runner, axis, version, args))
        python, row.venv, notes = pythons[venv_key]
        started = time.monotonic()
        if python and not runner.stopped.is_set():
            gate_row(runner, row, python, args)
        row.wall_s = round(time.monotonic() - started, 1)
        release = args.table[row.upstream]["releases"][row.release]
        reason = [f"declares check '{row.declared}': {release.get('reason', 'no reason given')}"]
        row.notes = (*(reason if row.declared != "series" and row.release not in seen_releases else []),
                     *(notes if first or not python else []), *row.notes)
        seen_releases.add(row.release)
        write_record(row, args.out)
        print(f"matrix {row.name}: check {row.check} (declared {row.declared}), gate {row.gate}, "
              f"{'meets' if row.meets else 'DOES NOT MEET'} its declaration ({row.wall_s} s)", flush=True)
    order = [row.id for row, _, _ in planned]
    return sorted((row for row, _, _ in planned), key=lambda row: order.index(row.id))


def write_record(row: Row, out: Path) -> Path:
    """Write the record of one gated row, ``out/<row id>/row.json`` (what ``--collect`` reads); return its path."""
    path = out / row.id / "row.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(row), indent=2) + "\n")
    return path


def collect(planned: list[tuple[Row, dict, str | None]], out: Path) -> list[Row]:
    """The planned rows from their records (``write_record``, ``out/<row id>/row.json``: the jobs of the workflow
    each gate one row), in the planned order; a row without a record is "no record" and does not meet its
    declaration. Raises KitError when a record cannot be read."""
    rows = []
    for row, _, _ in planned:
        path = out / row.id / "row.json"
        if not path.exists():
            row.gate, row.notes = "no record", (f"no {path.relative_to(out)}: its job did not gate it",)
            rows.append(row)
            continue
        try:
            fields = json.loads(path.read_text())
            rows.append(Row(**{**fields, "notes": tuple(fields.get("notes", ()))}))
        except (OSError, ValueError, TypeError) as e:
            raise KitError(f"{path} is not a row record ({e}): make matrix ROW={row.id} gates it again") from None
    return rows


def make_bases(releases: set[tuple[str, str]], args: argparse.Namespace) -> None:
    """Add the missing ``base/<version>`` of every (upstream, release) of ``releases`` (scripts.upstream checkout;
    the work tree is not touched). Raises KitError with the checkout's error."""
    for name, release in sorted(releases):
        code = upstream.main(["checkout", "--only", name, "--version", f"{name}={release}",
                              f"--sources={args.sources}", f"--checkouts={args.checkouts}",
                              f"--cache={args.cache}", f"--pip-options={args.pip_options}"])
        if code != 0:
            raise KitError(f"cannot make base/{release} of {name}: see the error above")


def write_report(rows: list[Row], out: Path, how: str) -> str:
    """Write ``report.json`` and ``report.md`` into ``out`` (``how``: how the rows ran, e.g. ``wall time 2130 s
    with 2 upstream(s) at once``); return the markdown."""
    failing = [row.name for row in rows if not row.meets]
    doc = {"verdict": "fail" if failing else "pass", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "series": {row.upstream: row.series_id for row in rows if row.series_id}, "how": how,
           "failing": failing, "rows": [asdict(row) for row in rows]}
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    series = ", ".join(f"{name} `{sid}`" for name, sid in doc["series"].items())
    md = [f"Matrix: **{doc['verdict'].upper()}**, {len(rows) - len(failing)} of {len(rows)} rows meet their "
          f"declaration; {how}; {doc['date']}; series judged: "
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
    parser = ArgumentParser(prog="python -m scripts.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch requirement of the matrix venvs")
    parser.add_argument("--pip-options", default="", help="extra pip options, one shell-quoted string")
    parser.add_argument("--python", default=sys.executable, help="the Python 3.11 that makes the matrix venvs")
    parser.add_argument("--jobs", type=int, default=2, help="upstreams gated at once")
    parser.add_argument("--no-deps", action="store_true", help="no dependency axis: the kit's venv only")
    parser.add_argument("--no-cache", action="store_true", help="the gates reuse no stored stage result")
    parser.add_argument("--only", help="this upstream only")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--row", help="gate this row only and write its record, <out>/<row>/row.json (make matrix ROW=)")
    what.add_argument("--list-rows", action="store_true", help="print the rows' ids as a JSON list, run nothing")
    what.add_argument("--collect", action="store_true", help="the report from the rows' records, run nothing")
    parser.add_argument("--sources", type=Path, default=sources.SOURCES_FILE)
    parser.add_argument("--constraints", type=Path, default=lock.CONSTRAINTS)
    parser.add_argument("--checkouts", type=Path, default=sources.KIT_ROOT / "upstream")
    parser.add_argument("--patches", type=Path, default=sources.KIT_ROOT / "patches")
    parser.add_argument("--suites", type=Path, default=sources.KIT_ROOT / "tests")
    parser.add_argument("--cache", type=Path, default=sources.KIT_ROOT / "upstream" / ".sdist")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the matrix (``--row``: one row, its record only; ``--list-rows``: print the rows; ``--collect``: the
    report from the records); print and write the table; return 0 when every row meets its declaration, else 1."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out = args.out.resolve()
    started = time.monotonic()
    runner = Runner()
    try:
        args.table = sources.load(args.sources)
        table = {args.only: args.table[args.only]} if args.only else args.table
        planned = plan(table, args)
        if args.list_rows:
            print(json.dumps([row.id for row, _, _ in planned]))
            return 0
        if args.collect:
            rows = collect(planned, args.out)
            recorded = sum(row.gate != "no record" for row in rows)
            return finish(rows, write_report(rows, args.out, f"collected from the records of {recorded} of "
                                             f"{len(rows)} rows ({round(sum(r.wall_s for r in rows), 1)} s of gate "
                                             "wall time in all)"))
        if args.row:
            planned = [p for p in planned if p[0].id == args.row]
            if not planned:
                raise KitError(f"ROW={args.row} is not a row of the matrix: `python -m scripts.matrix --list-rows` "
                               "lists them")
        make_bases({(row.upstream, row.release) for row, _, _ in planned}, args)
        # One thread makes the venvs of the dependency axes, in the order the upstreams need them, while the
        # upstreams' rows in the kit's venv are gated.
        with (launch.sigterm_as_interrupt(), ThreadPoolExecutor(max_workers=1) as builder,
              ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool):
            built: dict[tuple, Future] = {}
            for _, axis, version in planned:
                venv_key = (axis.get("package"), version)
                if version is not None and venv_key not in built and not locked(axis, version, args):
                    built[venv_key] = builder.submit(venv_for, runner, axis, version, args)
            futures = [pool.submit(upstream_rows, runner, [p for p in planned if p[0].upstream == name], built, args)
                       for name in dict.fromkeys(row.upstream for row, _, _ in planned)]
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
    if args.row:
        print(f"matrix: the record of {args.row} is in {os.path.relpath(args.out / args.row / 'row.json')}; "
              "python -m scripts.matrix --collect makes the report from the records")
        return finish(rows, "")
    wall_s = round(time.monotonic() - started, 1)
    return finish(rows, write_report(rows, args.out, f"wall time {wall_s} s with {args.jobs} upstream(s) at once"))


def finish(rows: list[Row], md: str) -> int:
    """Print the table ``md`` and one line per row that does not meet its declaration; return the exit status."""
    if md:
        print("\n" + md)
    failing = [row.name for row in rows if not row.meets]
    for name in failing:
        print(f"matrix: {name} does not meet its declaration", file=sys.stderr)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(runlock.interruptible(main))  # Ctrl-C: exit 130, no traceback, one line on the checkouts
