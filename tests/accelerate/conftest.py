"""The Accelerate suite's one 2-process launch of ``accelerate_worker.py``, shared by its test modules.

Every scenario runs in one real launch (Gloo on CPU, ``torch.distributed.run --standalone``, so a free port) per
pytest session; the launch has a timeout and is killed with all its processes, and pytest-xdist workers share it
(``tests/launched.py``). The modules that read it are in the xdist group ``accelerate-launch``: ``make test``
(``--dist loadgroup``) runs them on one worker, while the other workers go on with other tests.
"""

import os
import sys
from pathlib import Path

import pytest

from scripts import launch
from tests.launched import launch_once

WORKER = Path(__file__).with_name("accelerate_worker.py")
LAUNCH_TIMEOUT = 600  # seconds for the whole launch; a healthy one takes about 1 to 2 min on 2 busy cores


def _launch(out_dir):
    """Run all scenarios in one launch; return what the tests need to explain a missing result."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER)]
    result = launch.run([*cmd, str(out_dir)], out_dir / "launch.log", LAUNCH_TIMEOUT, cwd=out_dir, env=env)
    return {"returncode": result.returncode, "timed_out": result.timed_out, "seconds": result.seconds}


@pytest.fixture(scope="session")
def launch_dir(tmp_path_factory):
    """The directory of the session's single launch; under pytest-xdist all workers share it."""
    return launch_once(tmp_path_factory, "accelerate-4204", _launch)
