"""pytest plugin: upstream scripts launched on N processes, run as test items (the gate's ``[<name>.gate] launch``).

``-p scripts.pytest_launch --launch '{"script": PATH, "nproc": N, "env": {NAME: VALUE}}'`` (repeatable; a JSON object,
as an entry of ``[<name>.gate] launch`` in upstream/sources.toml with the script's path made absolute; ``env``
optional) adds one test item per script, whose node id is the script's path relative to the rootdir, so its outcome
lands in the same JUnit XML as the other tests. The item runs ``python -m torch.distributed.run --standalone
--nproc_per_node=N PATH`` with this interpreter and this process's environment (so the stage's ``PYTHONPATH``) plus
``env``, through ``scripts/launch.py`` (``--launch-timeout``
seconds, stack dumps of every process before it is killed), in ``--launch-logs``, where its output goes to
``<script file name>.log``.

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

from scripts import launch


class LaunchError(Exception):
    """A launch that did not end with an assertion: it timed out, crashed or could not start."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kit launch")
    group.addoption("--launch", action="append", default=[], metavar="JSON",
                    help='a script launched with torch.distributed.run as one test item: {"script", "nproc", "env"}')
    group.addoption("--launch-logs", type=Path, default=Path("launch-logs"),
                    help="working directory of the launches and of their logs")
    group.addoption("--launch-timeout", type=float, default=300.0, help="seconds per launch (default 300)")


def assertion_line(log: str) -> str:
    """The last line of ``log`` that reports an AssertionError ('' when there is none)."""
    found = re.findall(r"^.*\bAssertionError\b.*$", log, re.M)
    return found[-1].strip() if found else ""


class LaunchItem(pytest.Item):
    """One launched script; ``setup`` launches it, ``runtest`` turns its verdict into an assertion."""

    def __init__(self, *, script: Path, nproc: int, env: dict[str, str], **kwargs):
        super().__init__(**kwargs)
        self.script, self.nproc, self.env, self.assertion, self.log = script, nproc, env, "", None

    def setup(self) -> None:
        config = self.config
        log = config.getoption("launch_logs") / f"{self.script.name}.log"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={self.nproc}",
                   str(self.script)]
        timeout = config.getoption("launch_timeout")
        self.log = log
        result = launch.run(command, log, timeout, cwd=log.parent, env={**os.environ, **self.env})
        if result.timed_out:
            raise LaunchError(f"timed out after {timeout:.0f} s and was killed; the stacks of {result.stacks} "
                              f"processes are at the end of {log}")
        self.assertion = assertion_line(result.log.read_text(errors="replace")) if result.returncode else ""
        if result.returncode and not self.assertion:
            raise LaunchError(f"exit status {result.returncode} without an AssertionError; log {log}:\n"
                              f"{result.tail(2000)}")

    def runtest(self) -> None:
        if self.assertion:
            raise AssertionError(self.assertion.partition("AssertionError")[2].lstrip(": ") or self.assertion)

    def repr_failure(self, excinfo, style=None) -> str:
        if excinfo.errisinstance(AssertionError):
            return f"AssertionError: {excinfo.value}\n(launch log: {self.log})"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.script, None, self.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Append one LaunchItem per ``--launch`` option; raise pytest.UsageError for a malformed value."""
    for value in config.getoption("launch"):
        try:
            entry = json.loads(value)
            path, nproc, env = Path(entry["script"]).resolve(), int(entry["nproc"]), dict(entry.get("env", {}))
        except (ValueError, TypeError, KeyError) as e:
            raise pytest.UsageError(f"--launch takes a JSON object with script and nproc, not {value!r} ({e})") from e
        if not path.is_file():
            raise pytest.UsageError(f"--launch: {path} is not a file")
        name = path.relative_to(config.rootpath).as_posix() if path.is_relative_to(config.rootpath) else str(path)
        items.append(LaunchItem.from_parent(session, name=name, nodeid=name, script=path, nproc=nproc,
                                            env={key: str(val) for key, val in env.items()}))
