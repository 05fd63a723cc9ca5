"""A module of the pristine Accelerate release that the kit's checkout is based on, beside the installed one.

Read from ``base/<version>`` of the kit's checkout (``upstream/accelerate``, ``make upstream``) with git and imported
as ``accelerate.pristine_<name>``: a sibling of the installed modules, so its relative imports resolve in the
installed package. Used by the tests that compare the series with the release in one process
(``test_state_compatibility.py``) and by the 2-process worker (``accelerate_worker.py``).
"""

import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

import accelerate

UPSTREAM = Path(__file__).resolve().parents[2] / "upstream" / "accelerate"  # the kit's checkout


def release_module(name: str, directory: Path) -> ModuleType:
    """The release's ``src/accelerate/<name>.py`` as a module, its source written to ``directory``. Raises
    AssertionError, naming the checkout, when it holds no ``base/<version>`` of the installed version."""
    version = accelerate.__version__.split("+")[0]
    shown = subprocess.run(["git", "-C", str(UPSTREAM), "show", f"base/{version}:src/accelerate/{name}.py"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, f"no pristine tree of accelerate {version} in {UPSTREAM} (run make upstream): " + (
        shown.stderr)
    file = Path(directory) / f"pristine_{name}.py"
    file.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(f"accelerate.pristine_{name}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
