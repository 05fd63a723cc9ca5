"""What the multi-process suites share: one launch per pytest session, and reading the ranks' results.

A suite's worker script (run under ``torch.distributed.run``) writes ``OUT_DIR/<scenario>.rank<N>.json`` per rank
and scenario, with ``world_size`` and, when the scenario raised, ``error`` (its traceback). The test modules read
those files; the launch itself goes through ``scripts/launch.py`` (timeout, whole tree killed).
"""

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest


def launch_once(tmp_path_factory: pytest.TempPathFactory, name: str, run: Callable[[Path], dict]) -> Path:
    """The directory ``<session temp>/<name>`` of a launch made at most once per pytest session.

    ``run(out_dir)`` launches and returns a JSON-able summary (exit status, timed out, seconds), written to
    ``out_dir/launch.json``; pytest-xdist workers of one session share the launch through a lock file beside it.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # common to the xdist workers of this session
    out_dir = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = out_dir / "launch.json"
        if not summary.exists():
            out_dir.mkdir(parents=True, exist_ok=True)
            summary.write_text(json.dumps(run(out_dir)))
    return out_dir


def rank_results(out_dir: Path, nproc: int, scenario: str) -> list[dict]:
    """Every rank's result of ``scenario``, rank 0 first.

    Fails the test (pytest.fail) with the launch's summary and the tail of ``launch.log`` when a rank wrote no
    result, and with the traceback when a rank's scenario raised; when the launch timed out, that message says so
    first: an error recorded while the launch was being stopped can be a consequence of the stop, not the cause
    (the SIGUSR1 stack dump of a process that hangs can itself crash it, see ``scripts/launch_site``).
    """
    results = []
    summary = json.loads((out_dir / "launch.json").read_text())
    for rank in range(nproc):
        path = out_dir / f"{scenario}.rank{rank}.json"
        if not path.exists():
            tail = (out_dir / "launch.log").read_text(errors="replace")[-3000:]
            pytest.fail(f"rank {rank} wrote no result for {scenario!r}; launch: {summary}\n--- launch.log ---\n{tail}")
        result = json.loads(path.read_text())
        if "error" in result:
            stopped = ""
            if summary.get("timed_out"):
                stopped = (
                    f" (the launch timed out after {summary.get('seconds')} s: this error may have been raised "
                    "while its processes were dumped and killed; the hang is in launch.log's stacks)"
                )
            pytest.fail(f"rank {rank} raised in {scenario!r}{stopped}:\n{result['error']}")
        assert result["world_size"] == nproc, result
        results.append(result)
    return results
