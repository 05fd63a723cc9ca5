"""Fixtures for the tests of the kit's own tooling: a tiny upstream made inside the test.

``tiny_index`` builds the sdist ``tiny-1.0.tar.gz`` (one package, one test file, setuptools metadata) once
per session in a local directory that pip reads with ``--no-index --find-links``. ``kit`` lays out a
throw-away kit (sources.toml, checkouts, patches, sdist cache) in ``tmp_path`` and runs the real
command line, ``scripts.upstream.main``, against it.
"""

import hashlib
import io
import os
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts import upstream


def pytest_configure(config: pytest.Config) -> None:
    """The kit's tests run ``make`` as a person types it: not as a sub-make of the ``make test JOBS=3`` that runs them,
    whose command-line variables GNU make passes down in ``MAKEFLAGS`` and in the environment (the sub-make then warned
    that ``make gaet`` does not read ``JOBS``, and ``make help`` showed the outer ``PYTEST_ARGS``)."""
    overrides = os.environ.get("MAKEFLAGS", "").partition(" -- ")[2]
    for name in re.findall(r"(?:^|(?<=\s))([A-Za-z_]\w*)=", overrides):
        os.environ.pop(name, None)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        os.environ.pop(name, None)


TINY_FILES = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
                      '[project]\nname = "tiny"\nversion = "1.0"\n',
    "tiny/__init__.py": "VALUE = 1\n",
    "tests/test_tiny.py": "import tiny\n\n\ndef test_value():\n    assert tiny.VALUE == 1\n",
    "tiny.egg-info/PKG-INFO": "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
    "PKG-INFO": "Metadata-Version: 2.1\nName: tiny\nVersion: 1.0\n",
}


def make_tarball(path: Path, members: list[tarfile.TarInfo | tuple[str, str]]) -> str:
    """Write a .tar.gz at ``path`` from (name, text) pairs or raw TarInfo entries; return its sha256."""
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                name, text = member
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(text.encode()), 946684800, 0o644
                tar.addfile(info, io.BytesIO(text.encode()))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def tiny_index(tmp_path_factory) -> tuple[Path, str]:
    """(directory holding tiny-1.0.tar.gz, its sha256)."""
    index = tmp_path_factory.mktemp("index")
    sha = make_tarball(index / "tiny-1.0.tar.gz", [(f"tiny-1.0/{n}", t) for n, t in TINY_FILES.items()])
    return index, sha


@dataclass
class Kit:
    """A throw-away kit layout; ``run(*args)`` runs the command line on it and returns (exit code, stderr).

    The standard output of the last run is kept in ``out``.
    """

    root: Path
    index: Path
    sha256: str
    capsys: pytest.CaptureFixture
    out: str = ""

    @property
    def repo(self) -> Path:
        return self.root / "upstream" / "tiny"

    @property
    def patches(self) -> Path:
        return self.root / "patches" / "tiny"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def pin(self, sha256: str | None = None) -> None:
        """Write sources.toml pinning tiny 1.0 with ``sha256`` (default: the true one)."""
        (self.root / "sources.toml").write_text(
            '[tiny]\nversion = "1.0"\ngit = "file:///nowhere"\n'
            f'[tiny.releases."1.0"]\nsdist = "tiny-1.0.tar.gz"\nsha256 = "{sha256 or self.sha256}"\n')

    def run(self, *args: str, index: Path | None = None) -> tuple[int, str]:
        options = f"--no-index --find-links {index or self.index} --no-build-isolation"
        self.capsys.readouterr()
        defaults = [f"--sources={self.root / 'sources.toml'}", f"--checkouts={self.root / 'upstream'}",
                    f"--patches={self.root / 'patches'}", f"--cache={self.cache}", f"--pip-options={options}"]
        code = upstream.main([*defaults, *args])
        captured = self.capsys.readouterr()
        self.out = captured.out
        return code, captured.err


@pytest.fixture
def kit(tmp_path, tiny_index, capsys) -> Kit:
    """A throw-away kit pinning the tiny upstream with its true sha256, its sdist already in the cache.

    Tests of the download itself empty ``kit.cache`` first.
    """
    index, sha = tiny_index
    made = Kit(tmp_path, index, sha, capsys)
    made.pin()
    made.cache.mkdir()
    shutil.copy(index / "tiny-1.0.tar.gz", made.cache)
    return made
