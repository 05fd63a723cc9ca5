"""Read the upstream pins from ``upstream/sources.toml``.

See README, "How checkouts are made": an upstream is pinned by
version, sdist file name and sha256; the git source is a URL and a tag pattern.
"""

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from scripts import KitError

KIT_ROOT = Path(__file__).resolve().parent.parent
SOURCES_FILE = KIT_ROOT / "upstream" / "sources.toml"


@dataclass(frozen=True)
class Pin:
    """One pinned release of one upstream.

    ``name`` is the kit's name for the upstream (``deepspeed``), ``package`` its PyPI project name,
    ``sdist`` the archive's file name, ``sha256`` its lower-case hex digest, ``git``/``tag`` the git source.
    """

    name: str
    package: str
    version: str
    sdist: str
    sha256: str
    git: str
    tag: str
    test_paths: tuple[str, ...]


def load(path: Path = SOURCES_FILE) -> dict:
    """Return the parsed TOML of ``path`` as a dict; raise KitError if it is missing or not valid TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise KitError(f"{path} is missing: restore it from git (git checkout -- {path.name})") from None
    except tomllib.TOMLDecodeError as e:
        raise KitError(f"{path} is not valid TOML ({e}): fix the file") from None


def pin(name: str, version: str | None = None, path: Path = SOURCES_FILE) -> Pin:
    """Return the Pin of upstream ``name`` at ``version`` (None: the table's default ``version``).

    Raises KitError when the upstream or the version is not in ``path``, naming the versions that are.
    """
    table = load(path).get(name)
    if table is None:
        raise KitError(f"no upstream '{name}' in {path}")
    version = version or table["version"]
    release = table.get("releases", {}).get(version)
    if release is None:
        known = ", ".join(sorted(table.get("releases", {})))
        raise KitError(f"{name} {version} is not pinned in {path} (pinned: {known}): pin it with "
                       f"`make pin {name.upper()}_VERSION={version}`")
    return Pin(
        name=name,
        package=table.get("package", name),
        version=version,
        sdist=release["sdist"],
        sha256=release["sha256"].lower(),
        git=table.get("git", ""),
        tag=table.get("tag", "v{version}").format(version=version),
        test_paths=tuple(table.get("test_paths", ["tests/"])),
    )


def versions(pairs: list[str]) -> dict[str, str]:
    """Turn ``--version`` values ``["deepspeed=0.19.6", "accelerate="]`` into
    ``{"deepspeed": "0.19.6"}`` (empty values dropped); raise KitError for a value without ``=``."""
    chosen = {}
    for pair in pairs:
        name, sep, version = pair.partition("=")
        if not sep:
            raise KitError(f"--version takes NAME=VERSION, not '{pair}'")
        if version:
            chosen[name] = version
    return chosen


def names(path: Path = SOURCES_FILE) -> list[str]:
    """Return the upstream names declared in ``path``, in file order."""
    return list(load(path))


def launched_in(entry: dict, tree: Path) -> bool:
    """Whether the test of a ``[<name>.gate] launch`` entry is in ``tree`` (an upstream tree): its script exists, or
    its ``pytest`` file exists and defines the id's last part (a line ``def <name>(``): a stack's later commit can add
    a test to a file that the earlier commits' trees hold. Raises KitError as ``launched_file``."""
    path = tree / launched_file(entry)
    if "script" in entry or not path.is_file():
        return path.is_file()
    name = str(entry["pytest"]).rpartition("::")[2]
    return re.search(rf"^\s*def {re.escape(name)}\(", path.read_text(errors="replace"), re.M) is not None


def launched_file(entry: dict) -> str:
    """The file of a ``[<name>.gate] launch`` entry, a path in the upstream's tree: its ``script``, or the file of its
    ``pytest`` node id (scripts/pytest_launch.py). Raises KitError when the entry has neither or both, or a
    ``pytest`` id that is not ``<a file under a tests/ directory>::<test>``."""
    if not isinstance(entry, dict) or ("script" in entry) == ("pytest" in entry):
        raise KitError(f"launch entry {entry!r}: give either script (and nproc) or pytest")
    if "script" in entry:
        return str(entry["script"])
    file, sep, node = str(entry["pytest"]).partition("::")
    if not sep or not node or "tests" not in Path(file).parent.parts:
        raise KitError(f"launch entry {entry!r}: pytest takes `<a file under a tests/ directory>::<test>`")
    return file
