"""Stage results reused by content (issue 42): a stage of an upstream is run again only when what it runs changed.

A stage's results (its JUnit results, the import records of its processes, its wall and CPU time and its log) are a
function of what it ran; ``inputs`` lists that, and the stage's key is the sha256 of it:

- the stage's tree: its git tree id (code and tests: the base, the commits applied, the test hunks), and its path
  (the import records name files in it);
- the kit's suite of the upstream (``<suites>/<name>/`` and the files beside it, e.g. tests/conftest.py, and the kit's
  pyproject.toml, which configures pytest), and whether the stage runs it or reads it from an earlier stage of the
  same code;
- the upstream tests and ``launch`` entries the stage runs;
- the environment: the locked requirements (requirements/constraints.txt), every distribution the running Python has
  with its version, the Python (version and executable) and torch's version;
- the gate's own code: what makes the trees and runs in the stages (STAGE_CODE: the gate's package, the modules it
  and the stages' pytest plugins import, sitecustomize); a kit test checks that it covers their imports, so that the
  kit's other tools (the bench, the matrix, make pr, make lint) change no key.

Entries live in ``<cache>/<key>/`` (``entry.json`` and the stage's ``pytest.log``), written whole (a reader sees a
whole entry or none). The gate stores the stages it ran, except those that timed out or whose failures were not all
the expected ones (a flaky test is run again, not reused); ``--no-cache`` (``GATE_CACHE=0``) runs every stage and
stores them anew. Judging never depends on whether a result was reused: grading.py reads the same results.
"""

from dataclasses import asdict
from pathlib import Path

from scripts import sources
from scripts.cache import files_digest, read, source_files, write
from scripts.gate.grading import Result

GATE_CODE = sources.KIT_ROOT / "scripts"
# The gate's own code, relative to GATE_CODE: folders whole, and modules (tests/kit/test_gate_cache.py checks that
# these hold every scripts module that scripts.gate and the stages' pytest plugins import).
STAGE_CODE = ("gate", "launch_site", "__init__.py", "cache.py", "checkout.py", "git.py", "launch.py", "outdated.py",
              "index.py", "pytest_launch.py", "pytest_progress.py", "pytest_regression.py", "runlock.py", "series.py",
              "sdist.py", "sources.py", "stack.py", "worktree.py")


def gate_code_files() -> list[Path]:
    """The ``.py`` files of the gate's own code: STAGE_CODE under GATE_CODE (scripts/)."""
    found = []
    for name in STAGE_CODE:
        path = GATE_CODE / name
        found += [p for p in source_files(path) if p.suffix == ".py"] if path.is_dir() else [path]
    return found


def gate_code_digest() -> str:
    """sha256 of the gate's own code (``gate_code_files``)."""
    return files_digest(gate_code_files(), GATE_CODE)


def suite_digest(suites: Path, name: str) -> str:
    """sha256 of the kit's suite of upstream ``name``: every file under ``suites/<name>/``, the files directly in
    ``suites`` (conftest.py, the launch helpers), and ``pyproject.toml`` beside ``suites`` (pytest's configuration)."""
    root = suites.parent
    files = [*source_files(suites / name), *(p for p in suites.iterdir() if p.is_file()), root / "pyproject.toml"]
    return files_digest(files, root)


def load(cache: Path, stage_key: str) -> dict | None:
    """The entry stored under ``stage_key`` in ``cache`` with its results as Result objects and ``log``, the path of
    its stored log; None when there is none or it cannot be read (then the stage runs)."""
    entry = read(cache, stage_key)
    if entry is None:
        return None
    try:
        entry["results"] = {test: Result(**fields) for test, fields in entry["results"].items()}
    except (TypeError, KeyError, AttributeError):
        return None
    return {**entry, "log": cache / stage_key / "pytest.log"}


def store(cache: Path, stage_key: str, entry: dict, log: Path) -> Path:
    """Write ``entry`` ({"run", "inputs", "launch", "results": {test: Result}, "records"}) and a copy of ``log``
    under ``cache/<stage_key>/``, replacing an older entry of the key whole; return the entry's folder. Raises
    OSError when the disk refuses."""
    doc = {**entry, "results": {test: asdict(r) for test, r in entry["results"].items()}}
    return write(cache, stage_key, doc, {"pytest.log": log})
