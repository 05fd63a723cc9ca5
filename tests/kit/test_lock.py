"""The locked environment: the kit's venv holds exactly what requirements/constraints.txt pins, and pip agrees.

These tests run in the kit's venv (``make test``): they fail when it drifts from the lock (a package upgraded, added
or missing), which is what makes the gate's verdict depend on the kit alone.
"""

import subprocess
import sys

import pytest

from scripts import KitError, lock


def test_venv_matches_the_lock():
    problems = lock.drift(lock.read(), lock.installed(), lock.free_of_lock())
    assert not problems, ("the venv drifted from requirements/constraints.txt (remake it: `rm -rf .venv && make "
                          "apply`; or change the lock: `make lock`):\n" + "\n".join(problems))


def test_venv_passes_pip_check():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lock_pins_every_package_exactly_and_leaves_torch_to_torch():
    text = lock.CONSTRAINTS.read_text()
    pins = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert pins and all(line.count("==") == 1 for line in pins)
    assert {"torch", "pip", "deepspeed", "accelerate"}.isdisjoint(lock.read())
    assert {"torchdata", "numpy", "hjson", "huggingface-hub", "pyyaml"} <= set(lock.read())


def test_drift_names_every_difference():
    locked = {"numpy": "2.3.5", "torchdata": "0.11.0", "hjson": "3.1.0"}
    have = {"numpy": "1.26.4", "torchdata": "0.11.0", "torch": "2.13.0+cpu", "rich": "14.0.0"}
    assert lock.drift(locked, have, {"torch"}) == [
        "hjson: locked at 3.1.0, not installed",
        "numpy: locked at 2.3.5, installed 1.26.4",
        "rich: installed 14.0.0, not in the lock",
    ]
    assert lock.drift(locked, {**locked, "torch": "2.13.0+cpu"}, {"torch"}) == []


def test_bad_lock_line_says_what_to_do(tmp_path):
    (tmp_path / "constraints.txt").write_text("numpy==2.3.5\nnumpy>=2\n")
    with pytest.raises(KitError, match=r"constraints.txt:2: 'numpy>=2' is not name==version: run `make lock`"):
        lock.read(tmp_path / "constraints.txt")
