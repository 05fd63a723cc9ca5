"""pytest plugin: what a long run is doing, and no JUnit XML of an interrupted run over the last complete one.

Loaded with ``-p scripts.pytest_progress`` (``make test``, the gate's stages). Options:

- ``--progress-every=S``: every S seconds (a thread), one line ``progress: D/T tests done, F failed, E s`` on the
  terminal, T being the tests collected (under pytest-xdist: by the first worker that finished collecting); silent
  until S seconds have passed, so a short run prints none and a CI log gets one line per S seconds. A test that has
  run for S seconds or more is named there (``; running for R s: <node id>``: the longest-running one).
- ``--progress-file=PATH``: at the start and end of every test, a JSON object written to PATH whole, for a process
  that reports on this one (scripts/gate/): ``done``, ``total`` (collected), ``failed``, ``expected`` (of the
  failed, those ``--progress-expect`` expects), ``running`` ([node id, time.time() it started] of the longest-running
  test, or null).
- ``--progress-expect=PATH``: a JSON object {"ids": [node ids], "markers": ["<upstream>#<key>" or "<upstream>#*"]}:
  the tests whose failures are expected (the FAIL_TO_PASS tests of a gate's stage before their fix; a marker
  matches the ``regression`` property of scripts/pytest_regression.py).

A test is done when its teardown report comes (every test has one, whether it passed, failed or was skipped).
When the session ends interrupted (Ctrl-C: exit status 2), the ``--junitxml`` file is written beside the asked one
as ``<name>.interrupted.xml``, so that the XML of the last complete run stays (issue 22).
"""

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest


class Progress:
    """Counts of the session (done, collected, failed) and where they are reported."""

    def __init__(self, config: pytest.Config):
        self.config, self.started = config, time.monotonic()
        self.done = self.total = self.failed = self.expected = 0
        self.running: dict[str, float] = {}  # node id: time.time() it started
        self.file = config.getoption("progress_file")
        self.every = config.getoption("progress_every")
        expect = config.getoption("progress_expect")
        expected = json.loads(Path(expect).read_text()) if expect else {}
        self.expected_ids, self.markers = set(expected.get("ids", ())), set(expected.get("markers", ()))
        self.stop = threading.Event()

    def is_expected(self, report: pytest.TestReport) -> bool:
        """True when ``--progress-expect`` expects the failure of ``report``'s test."""
        marks = [value for name, value in report.user_properties if name == "regression"]
        return report.nodeid in self.expected_ids or any(
            mark in self.markers or f"{mark.partition('#')[0]}#*" in self.markers for mark in marks)

    def longest_running(self) -> tuple[str, float] | None:
        """(node id, time.time() it started) of the test running longest, or None."""
        return min(self.running.items(), key=lambda item: item[1], default=None)

    def line(self) -> str:
        """``progress: D/T tests done, F failed, E s``, and the test running for ``every`` s or more, if any;
        ``progress: collecting the tests, E s`` before any is collected or done."""
        total = f"/{self.total}" if self.total else ""
        elapsed = time.monotonic() - self.started
        if not self.total and not self.done:
            return f"progress: collecting the tests, {elapsed:.0f} s"
        line = f"progress: {self.done}{total} tests done, {self.failed} failed, {elapsed:.0f} s"
        running = self.longest_running()
        if running and time.time() - running[1] >= self.every:
            line += f"; running for {time.time() - running[1]:.0f} s: {running[0]}"
        return line

    def write_file(self) -> None:
        """Write the counts to ``--progress-file`` whole (a reader never sees half of it)."""
        if self.file:
            partial = Path(f"{self.file}.partial")
            partial.write_text(json.dumps({"done": self.done, "total": self.total, "failed": self.failed,
                                           "expected": self.expected, "running": self.longest_running()}) + "\n")
            partial.replace(self.file)

    def tick(self) -> None:
        """The thread of ``--progress-every``: one line every ``every`` seconds until the session ends."""
        plugins = self.config.pluginmanager
        while not self.stop.wait(self.every):
            reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
            if reporter is None:
                continue
            # Past pytest's capture of the terminal (under pytest-xdist only the workers run tests, so nothing of a
            # test's output passes while it is open).
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                if reporter._tw.width_of_current_line:  # after the dots of -q: a line of its own
                    reporter.write("\n")
                reporter.write_line(self.line())


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kit progress")
    group.addoption("--progress-every", type=float, default=0, metavar="S",
                    help="print the tests done / collected every S seconds (0: never)")
    group.addoption("--progress-file", default="", metavar="PATH", help="write the counts to PATH (JSON)")
    group.addoption("--progress-expect", default="", metavar="PATH",
                    help="JSON {ids, markers} of the tests whose failures are expected")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller counts
        return
    progress = Progress(config)
    config.stash[KEY] = progress
    if progress.every > 0:
        threading.Thread(target=progress.tick, name="kit-progress", daemon=True).start()


KEY = pytest.StashKey[Progress]()


def pytest_collection_finish(session: pytest.Session) -> None:
    progress = session.config.stash.get(KEY, None)
    if progress is not None and session.items:
        progress.total = len(session.items)
        progress.write_file()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    progress = node.config.stash.get(KEY, None)
    if progress is not None and not progress.total:
        progress.total = len(ids)


_current: list[Progress] = []  # the session's counts (this hook gets no config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _current:
        return
    progress = _current[0]
    progress.failed += report.failed
    progress.expected += report.failed and progress.is_expected(report)
    if report.when == "teardown":
        progress.done += 1


def pytest_runtest_logstart(nodeid: str, location) -> None:
    if _current:
        _current[0].running[nodeid] = time.time()
        _current[0].write_file()


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    if _current:
        _current[0].running.pop(nodeid, None)
        _current[0].write_file()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    progress = session.config.stash.get(KEY, None)
    if progress is not None:
        _current[:] = [progress]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the thread; when interrupted, send the JUnit XML (written after this hook) to ``*.interrupted.xml``."""
    progress = session.config.stash.get(KEY, None)
    if progress is None:
        return
    progress.stop.set()
    _current.clear()
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        from _pytest.junitxml import xml_key

        xml = session.config.stash.get(xml_key, None)
        if xml is not None:
            xml.logfile = str(Path(xml.logfile).with_suffix(".interrupted.xml"))
