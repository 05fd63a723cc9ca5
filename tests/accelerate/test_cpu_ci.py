"""Accelerate #4204: the series' 2-process checks run in Accelerate's CPU CI.

The series adds ``MultiCPUTester::test_distributed_data_loop`` to Accelerate's ``tests/test_cpu.py``: it runs
``test_utils/scripts/test_distributed_data_loop.py`` (where the series puts its 2-process checks) on two forked CPU
processes with ``debug_launcher``. This runs that upstream test from the tree ``accelerate`` is imported from, in a
pytest process of its own (through ``scripts/launch.py``: timeout, whole tree killed): in 1.13.0 and 1.14.0,
``AccelerateTestCase`` resets only ``AcceleratorState``, so other tests of the same process can leave dataloader weak
references in ``GradientState``, and the fork's ``pickle.dumps(accelerator)`` check then fails for that reason.
A regression test: before the series the checks fail (or the test does not exist).
"""

import sys
from pathlib import Path

import accelerate
import pytest

from scripts import launch

NODE = "tests/test_cpu.py::MultiCPUTester::test_distributed_data_loop"
TIMEOUT = 300  # s; it takes about 10 s


@pytest.mark.regression("accelerate", 4204)
def test_cpu_ci_runs_the_distributed_data_loop_checks(tmp_path):
    tree = Path(accelerate.__file__).resolve().parents[2]  # <tree>/src/accelerate/__init__.py
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tree}", NODE]
    result = launch.run(command, tmp_path / "pytest.log", TIMEOUT, cwd=tree)
    log = (tmp_path / "pytest.log").read_text(errors="replace")
    assert not result.timed_out, f"{NODE} did not end within {TIMEOUT} s:\n{log[-3000:]}"
    assert result.returncode == 0, f"{NODE} in {tree}:\n{log[-3000:]}"
    assert "1 passed" in log, log[-3000:]
