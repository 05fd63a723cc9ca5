"""pytest plugin: upstream tests that need a process of their own, run as test items (``[<name>.gate] launch``).

``-p scripts.pytest_launch --launch JSON`` (repeatable; a JSON object, as an entry of ``[<name>.gate] launch`` in
upstream/sources.toml with its path made absolute; ``env`` optional) adds one test item per entry, so its outcome lands
in the same JUnit XML as the other tests:

- ``{"script": PATH, "nproc": N, "env": {NAME: VALUE}}``: a script launched on N processes with ``python -m
  torch.distributed.run --standalone --nproc_per_node=N PATH``; its node id is the script's path relative to the
  rootdir; its output goes to ``<script file name>.log``.
- ``{"pytest": "PATH::NODE", "env": {...}}``: one test of the upstream's own suite, run alone in ``python -m pytest
  PATH::NODE`` from the directory above its ``tests/`` (as the upstream's CI runs it: Accelerate's
  ``tests/test_cpu.py`` forks processes with ``debug_launcher``, which other tests of a shared process can disturb);
  its node id is ``PATH::NODE`` with PATH relative to the rootdir; its output goes to ``<PATH::NODE, made a file
  name>.log``, its JUnit XML beside it. It passes only when every test it selected passed: a test skipped or
  xfailed there makes the item skipped (a violation for the gate), no test selected makes it an error.

Either runs with this interpreter and this process's environment (so the stage's ``PYTHONPATH``) plus ``env``,
through ``scripts/launch.py`` (``--launch-timeout`` seconds, or the entry's own ``timeout``; stack dumps of every
process before it is killed), in
``--launch-logs``.

Verdict (what upstream CI makes of such a script, e.g. Accelerate's ``tests/test_multidevice.py``): exit status 0
passed; a non-zero status with ``AssertionError`` in the log failed, the message being the log's last
``AssertionError`` line (a reproducing failure for FAIL_TO_PASS); anything else, a timeout included, is an error.
"""

import json
import os
import re
import sys
from pathlib import Path

import pytest

from scripts import KitError, launch, sources
from scripts.gate import grading


class LaunchError(Exception):
    """A launch that did not end with an assertion: it timed out, crashed or could not start."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kit launch")
    group.addoption("--launch", action="append", default=[], metavar="JSON",
                    help='one test item that runs in a process of its own: a script launched with '
                         'torch.distributed.run, {"script", "nproc", "env"}, or one upstream test run alone, '
                         '{"pytest": "PATH::NODE", "env"}')
    group.addoption("--launch-logs", type=Path, default=Path("launch-logs"),
                    help="working directory of the launches and of their logs")
    group.addoption("--launch-timeout", type=float, default=300.0, help="seconds per launch (default 300)")


def assertion_line(log: str) -> str:
    """The last line of ``log`` that reports an AssertionError ('' when there is none)."""
    found = re.findall(r"^.*\bAssertionError\b.*$", log, re.M)
    return found[-1].strip() if found else ""


class LaunchItem(pytest.Item):
    """One launched entry; ``setup`` runs ``command`` (from ``cwd``, output to ``log``), ``runtest`` turns its verdict
    into an assertion."""

    def __init__(self, *, path: Path, command: list[str], cwd: Path | None, log: str, env: dict[str, str],
                 timeout: float | None, **kwargs):
        super().__init__(**kwargs)
        self.path, self.cwd, self.env, self.assertion = path, cwd, env, ""
        self.timeout = timeout or self.config.getoption("launch_timeout")
        self.log = self.config.getoption("launch_logs") / log
        # a pytest run writes its JUnit XML beside the log, which setup reads (a skip is not a pass)
        self.junit = self.log.with_suffix(".xml") if command[1:3] == ["-m", "pytest"] else None
        self.command = [*command, f"--junitxml={self.junit}"] if self.junit else command

    def setup(self) -> None:
        log, timeout = self.log, self.timeout
        log.parent.mkdir(parents=True, exist_ok=True)
        result = launch.run(self.command, log, timeout, cwd=self.cwd or log.parent, env={**os.environ, **self.env})
        if result.timed_out:
            raise LaunchError(f"timed out after {timeout:.0f} s and was killed; the stacks of {result.stacks} "
                              f"processes are at the end of {log}")
        self.assertion = assertion_line(result.log.read_text(errors="replace")) if result.returncode else ""
        if result.returncode and not self.assertion:
            raise LaunchError(f"exit status {result.returncode} without an AssertionError; log {log}:\n"
                              f"{result.tail(2000)}")
        if self.junit and not result.returncode:
            outcomes = {key: r.outcome for key, r in grading.read_junit(self.junit).items()}
            if not outcomes:
                raise LaunchError(f"its pytest run selected no test; log {log}")
            not_passed = {key: outcome for key, outcome in outcomes.items() if outcome != "passed"}
            if not_passed:
                pytest.skip(f"skipped or xfailed in its own process: {not_passed} (log {log})")

    def runtest(self) -> None:
        if self.assertion:
            raise AssertionError(self.assertion.partition("AssertionError")[2].lstrip(": ") or self.assertion)

    def repr_failure(self, excinfo, style=None) -> str:
        if excinfo.errisinstance(AssertionError):
            return f"AssertionError: {excinfo.value}\n(launch log: {self.log})"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.name


def item_of(session: pytest.Session, entry: dict) -> LaunchItem:
    """The test item of one ``--launch`` entry (see the module docstring); raise pytest.UsageError when its file does
    not exist, KeyError, TypeError or ValueError when the entry is malformed."""
    rootpath, env = session.config.rootpath, {key: str(val) for key, val in dict(entry.get("env", {})).items()}
    timeout = float(entry["timeout"]) if "timeout" in entry else None
    path = Path(sources.launched_file(entry)).resolve()
    if not path.is_file():
        raise pytest.UsageError(f"--launch: {path} is not a file")
    sep, node = entry["pytest"].partition("::")[1:] if "pytest" in entry else ("", "")
    name = (path.relative_to(rootpath).as_posix() if path.is_relative_to(rootpath) else str(path)) + sep + node
    if "pytest" in entry:
        tree = next(parent.parent for parent in path.parents if parent.name == "tests")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tree}",
                   f"{path}{sep}{node}"]
        log = re.sub(r"[^\w.-]+", "-", name).strip("-") + ".log"
        return LaunchItem.from_parent(session, name=name, nodeid=name, path=path, command=command, cwd=tree, log=log,
                                      env=env, timeout=timeout)
    nproc = int(entry["nproc"])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(path)]
    return LaunchItem.from_parent(session, name=name, nodeid=name, path=path, command=command, cwd=None,
                                  log=f"{path.name}.log", env=env, timeout=timeout)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Append one LaunchItem per ``--launch`` option; raise pytest.UsageError for a malformed value."""
    for value in config.getoption("launch"):
        try:
            items.append(item_of(session, json.loads(value)))
        except (ValueError, TypeError, KeyError, AttributeError, KitError) as e:
            raise pytest.UsageError(f"--launch takes a JSON object with script and nproc, or pytest, not {value!r} "
                                    f"({e})") from e
