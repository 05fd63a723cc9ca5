"""Results reused by content: an entry is stored under the sha256 of what made it, and read back only for that key.

The gate keeps its stages' results this way (``scripts/gate/cache.py``), the flow table the release column of each
flow (``scripts/flows/cache.py``) and the stored histories their release side (``scripts/histories/cache.py``). A
caller lists the inputs of a result as a JSON-able dict (``key``); this module hashes files (``files_digest``), finds
the kit's modules a script imports (``kit_files``), names a release (``release``) and the environment every run
shares (``environment_inputs``), and stores entries: ``<cache>/<key>/entry.json`` and files beside it, written whole
(a reader sees a whole entry or none).
"""

import ast
import datetime
import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from scripts import sources
from scripts.git import git

CONSTRAINTS = sources.KIT_ROOT / "requirements" / "constraints.txt"
ENTRY = "entry.json"


def files_digest(paths: list[Path], root: Path) -> str:
    """sha256 of the files ``paths`` (names relative to ``root``, and contents), in sorted order; a missing file
    counts as missing. Bytecode caches are never listed by the callers."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
        digest.update(b"\0")
    return digest.hexdigest()


def source_files(folder: Path) -> list[Path]:
    """Every file under ``folder``, recursively, without ``__pycache__`` folders."""
    return [p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def environment_inputs() -> dict:
    """What this Python brings to the runs it starts: {"python": version and executable, "torch": its version,
    "constraints": sha256 of the lock, "distributions": sha256 of every installed distribution's name and version}.
    The runs use this interpreter (``sys.executable``), so its distributions are theirs."""
    names = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions())
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return {"python": f"{sys.version} {sys.executable}", "torch": torch,
            "constraints": hashlib.sha256(CONSTRAINTS.read_bytes()).hexdigest() if CONSTRAINTS.is_file() else "",
            "distributions": hashlib.sha256("\n".join(names).encode()).hexdigest()}


def _module_file(module: str, root: Path) -> Path | None:
    """The file under ``root`` of ``module`` (``scripts.x`` or ``tests.y``), a package's ``__init__.py``; None for
    others."""
    if module.split(".")[0] not in ("scripts", "tests"):
        return None
    path = root.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def kit_files(script: Path, root: Path = sources.KIT_ROOT) -> list[Path]:
    """``script`` and every file of the kit under ``root`` it imports, directly or through another (``scripts.*`` and
    ``tests.*`` modules and the packages holding them), read from their ``import`` statements (imports by a computed
    name are not seen)."""
    found, todo = set(), [script]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        names = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            todo += [f for f in (_module_file(".".join(parts[:i]), root) for i in range(1, len(parts) + 1)) if f]
    return sorted(found)


def release(repo: Path, version: str) -> dict:
    """A pinned release as an input of a key: ``version`` and the git tree id of ``base/<version>`` in the checkout
    ``repo`` (its code, whatever the version says). Raises KitError when there is no such tag (run make apply)."""
    tree = git(repo, "rev-parse", "--verify", f"base/{version}^{{tree}}").stdout.strip()
    return {"version": version, "tree": tree}


def run_inputs(repo: Path, version: str, script: Path, runners: tuple[Path, ...] | list[Path], timeout: float,
               root: Path = sources.KIT_ROOT) -> dict:
    """What every run of a pristine release by a job script shares in its key: the release (``release``), the job
    code (``script``, the modules of the kit under ``root`` it imports and ``runners``, which start and drive it), its
    ``timeout`` in seconds and the environment. Raises KitError when ``repo`` has no ``base/<version>``."""
    return {"release": release(repo, version), "timeout": timeout,
            "job": files_digest([*kit_files(script, root), *runners], root), "environment": environment_inputs()}


def now() -> str:
    """The time now (UTC, to the second), as entries say when their results were made."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def key(inputs: dict) -> str:
    """The key of a result: sha256 of its ``inputs`` (any JSON-able dict) in canonical JSON."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def read(cache: Path, entry_key: str) -> dict | None:
    """The document stored under ``entry_key`` in ``cache``; None when there is none, it cannot be read or it names
    another key (then the caller runs what it would have reused)."""
    try:
        doc = json.loads((cache / entry_key / ENTRY).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("key") == entry_key else None


def write(cache: Path, entry_key: str, doc: dict, files: dict[str, Path] | None = None) -> Path:
    """Store ``doc`` (JSON-able) and a copy of each of ``files`` ({name in the entry: path}) under
    ``cache/<entry_key>/``, replacing an older entry of the key whole (or leaving the one another writer of the same
    key stored meanwhile); return the entry's folder. Raises OSError when the disk refuses."""
    cache.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{entry_key[:12]}-", dir=cache))
    try:
        (partial / ENTRY).write_text(json.dumps({**doc, "key": entry_key}) + "\n")
        for name, path in (files or {}).items():
            shutil.copyfile(path, partial / name)
        folder = cache / entry_key
        shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(partial, folder)
        except OSError:
            if not (folder / ENTRY).is_file():  # else another writer of the same key stored its whole entry first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder
