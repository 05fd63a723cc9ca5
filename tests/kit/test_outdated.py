"""Issue 30 on a throw-away package index (no network): `make outdated` finds a newer release and refuses offline in
one line; `make pin` takes the index's sha256, checks it against the download and keeps the rest of sources.toml;
`make apply` of a release the series conflicts with leaves the checkout clean, or left in `git am` when asked.

The index is a directory served by ``http.server`` on a free local port, laid out as PyPI's JSON API
(``<project>/json``); pip downloads from a ``--find-links`` directory, as the other kit tests do.
"""

import contextlib
import functools
import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from scripts import outdated, pin, series, sources
from scripts.git import git, rev
from scripts.sources import KIT_ROOT
from tests.kit.conftest import TINY_FILES, make_tarball
from tests.kit.test_runlock import outside_run
from tests.kit.test_series import commit_fix

# A pins file as the kit writes them: comments, a default, releases newest first, a dependency axis.
SOURCES = '''# The pins (a comment that must stay).

[tiny]
version = "1.0"  # the default pin
git = "file:///nowhere"

# The dependency axis (its comment stays too).
[tiny.matrix]
package = "dep"
versions = ["1.0"]

[tiny.releases."1.0"]  # the version of the bug report
sdist = "tiny-1.0.tar.gz"
sha256 = "{sha}"
'''


class Index:
    """A package index's JSON API in ``root`` served at ``url``; ``publish`` writes a project's JSON."""

    def __init__(self, root: Path, url: str):
        self.root, self.url = root, url

    def publish(self, project: str, releases: dict[str, list[dict]]) -> None:
        (self.root / project).mkdir(parents=True, exist_ok=True)
        (self.root / project / "json").write_text(json.dumps({"info": {"name": project}, "releases": releases}))


def upload(filename: str, sha256: str = "0" * 64, day: str = "2026-01-01", yanked: bool = False,
           packagetype: str = "sdist") -> dict:
    """One file of a release as PyPI's JSON lists it."""
    return {"filename": filename, "packagetype": packagetype, "digests": {"sha256": sha256},
            "upload_time_iso_8601": f"{day}T10:00:00.000000Z", "yanked": yanked}


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def index(tmp_path):
    """A local index on a free port, stopped after the test."""
    root = tmp_path / "index"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Index(root, f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def closed_port() -> int:
    """A local port that nothing listens on (bound, then closed)."""
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_sdist(folder: Path, version: str, value: str) -> str:
    """Write tiny-<version>.tar.gz (``VALUE = <value>``) into ``folder``; return its sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {name: text.replace('ersion = "1.0"', f'ersion = "{version}"').replace("Version: 1.0",
                                                                                  f"Version: {version}")
             for name, text in TINY_FILES.items()} | {"tiny/__init__.py": f"VALUE = {value}\n"}
    return make_tarball(folder / f"tiny-{version}.tar.gz", [(f"tiny-{version}/{n}", t) for n, t in files.items()])


@pytest.fixture
def pins(kit):
    """The throw-away kit's sources.toml written as SOURCES, and its lock (dep 1.0)."""
    (kit.root / "sources.toml").write_text(SOURCES.format(sha=kit.sha256))
    (kit.root / "constraints.txt").write_text("dep==1.0\nother==3.0\n")
    return kit


def run_outdated(kit, index_url: str, capsys, torch: str = "torch==2.0") -> tuple[int, str, str]:
    capsys.readouterr()
    code = outdated.main([f"--index={index_url}", f"--torch={torch}", f"--sources={kit.root / 'sources.toml'}",
                          f"--constraints={kit.root / 'constraints.txt'}", f"--out={kit.root / 'outdated.json'}"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_pin(kit, index_url: str, capsys, *args: str, find_links: Path | None = None) -> tuple[int, str, str]:
    capsys.readouterr()
    options = f"--no-index --find-links {find_links or kit.root / 'files'} --no-build-isolation"
    code = pin.main([*args, f"--index={index_url}", f"--pip-options={options}",
                     f"--sources={kit.root / 'sources.toml'}", f"--cache={kit.cache}"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def publish_all(index: Index, kit, tiny_sha: str = "") -> None:
    """tiny 1.0 and 1.1 (and a pre-release and a yanked 1.3, never proposed), dep 1.0, torch 2.0 and 2.1."""
    index.publish("tiny", {
        "1.0": [upload("tiny-1.0.tar.gz", kit.sha256, "2026-01-01")],
        "1.1": [upload("tiny-1.1.tar.gz", tiny_sha or "1" * 64, "2026-03-01"),
                upload("tiny-1.1-py3-none-any.whl", "2" * 64, "2026-03-01", packagetype="bdist_wheel")],
        "1.2rc1": [upload("tiny-1.2rc1.tar.gz", "3" * 64, "2026-04-01")],
        "1.3": [upload("tiny-1.3.tar.gz", "4" * 64, "2026-05-01", yanked=True)]})
    index.publish("dep", {"0.9": [upload("dep-0.9.tar.gz")], "1.0": [upload("dep-1.0.tar.gz", day="2025-06-01")]})
    index.publish("torch", {"2.0": [upload("torch-2.0-x.whl", packagetype="bdist_wheel", day="2026-01-05")],
                            "2.1": [upload("torch-2.1-x.whl", packagetype="bdist_wheel", day="2026-02-05")]})


def test_a_newer_release_is_found_named_and_recorded(pins, index, capsys):
    publish_all(index, pins)
    code, out, err = run_outdated(pins, index.url, capsys)
    assert code == outdated.NEWER, err
    lines = out.splitlines()
    assert len(lines) == 4, out
    assert lines[0].startswith("tiny ") and "1.1 (2026-03-01) is NEWER than the default pin 1.0" in lines[0]
    assert "`make pin TINY_VERSION=1.1`" in lines[0]
    assert "1.2rc1" not in out and "1.3" not in out, "pre-releases and yanked releases are never proposed"
    assert lines[1].startswith("dep ") and "is the lock's and in tiny's matrix (1.0)" in lines[1]
    assert lines[2].startswith("torch ") and "2.1 (2026-02-05) is NEWER than TORCH=torch==2.0: 2.1" in lines[2]
    assert lines[3].startswith("outdated: 2 of 3 behind the index: tiny 1.1, torch 2.1")
    doc = json.loads((pins.root / "outdated.json").read_text())
    assert doc["packages"]["tiny"] == {"newest": "1.1", "released": {"1.0": "2026-01-01", "1.1": "2026-03-01"}}
    assert outdated.release_status(doc, "tiny", "1.0")["newer"] is True


def test_torch_newer_than_the_matrix_torch_rows_is_named(pins, index, capsys):
    """A torch axis (``[<name>.torch_axis]``, issue 42) gates 2.1 beside TORCH=torch==2.0: 2.2 is newer than both."""
    publish_all(index, pins)
    index.publish("torch", {v: [upload(f"torch-{v}-x.whl", packagetype="bdist_wheel", day=f"2026-0{n}-05")]
                            for n, v in enumerate(("2.0", "2.1", "2.2"), start=1)})
    (pins.root / "sources.toml").write_text((pins.root / "sources.toml").read_text()
                                            + '[tiny.torch_axis]\nversions = ["2.1"]\n')
    code, out, _ = run_outdated(pins, index.url, capsys)
    assert code == outdated.NEWER
    assert "2.2 (2026-03-05) is NEWER than TORCH=torch==2.0 and the matrix's torch rows (2.1): 2.2" in out, out
    (pins.root / "sources.toml").write_text((pins.root / "sources.toml").read_text().replace('["2.1"]', '["2.2"]'))
    code, out, _ = run_outdated(pins, index.url, capsys)
    assert "is NEWER than TORCH=torch==2.0, in the matrix's torch rows (2.2)" in out, out


def test_after_the_pin_and_the_default_every_pin_is_current(pins, index, capsys):
    tiny_sha = tiny_sdist(pins.root / "files", "1.1", "10")
    publish_all(index, pins, tiny_sha)
    assert run_pin(pins, index.url, capsys, "--version=tiny=1.1")[0] == 0
    code, out, _ = run_outdated(pins, index.url, capsys, torch="torch==2.1")
    assert code == outdated.NEWER and "it is pinned, not the default: `make pin TINY_VERSION=1.1 DEFAULT=1`" in out
    assert run_pin(pins, index.url, capsys, "--version=tiny=1.1", "--default")[0] == 0
    code, out, _ = run_outdated(pins, index.url, capsys, torch="torch==2.1")
    assert code == 0, out
    assert "tiny   1.1 (2026-03-01) is the default pin; pinned: 1.0, 1.1" in out
    assert out.splitlines()[-1].startswith("outdated: every pin is current (3 checked on ")


@pytest.mark.parametrize("where", ["closed-port", "no-such-project"])
def test_offline_or_unknown_is_one_line_and_changes_nothing(pins, index, capsys, where):
    publish_all(index, pins)
    record = pins.root / "outdated.json"
    record.write_text('{"packages": {}, "asked": "earlier"}\n')
    url = f"http://127.0.0.1:{closed_port()}" if where == "closed-port" else index.url
    if where == "no-such-project":
        shutil.rmtree(index.root / "dep")
    code, out, err = run_outdated(pins, url, capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    expected = "cannot reach the package index" if where == "closed-port" else "has no project dep"
    assert err.startswith("error: ") and expected in err, err
    assert record.read_text() == '{"packages": {}, "asked": "earlier"}\n', "the last record stays"


def test_make_outdated_offline_is_one_line_of_the_kit(tmp_path):
    """Through the Makefile (the recipe's wiring): the kit's one line, then only make's own status line."""
    result = subprocess.run(["make", "--no-print-directory", "-C", str(KIT_ROOT), "outdated",
                             f"INDEX_JSON=http://127.0.0.1:{closed_port()}"], capture_output=True, text=True,
                            timeout=120, env=outside_run(tmp_path))
    assert result.returncode != 0 and result.stdout == ""
    ours = [line for line in result.stderr.splitlines() if not re.match(r"make(\[\d+\])?: \*\*\* ", line)]
    assert len(ours) == 1 and ours[0].startswith("error: cannot reach the package index http://127.0.0.1:"), \
        result.stderr


def test_pin_adds_the_release_with_the_index_hash_and_keeps_every_other_line(pins, index, capsys):
    tiny_sha = tiny_sdist(pins.root / "files", "1.1", "10")
    publish_all(index, pins, tiny_sha)
    before = (pins.root / "sources.toml").read_text()
    code, out, err = run_pin(pins, index.url, capsys, "--version=tiny=1.1")
    assert code == 0, err
    after = (pins.root / "sources.toml").read_text()
    head, tail = before.split('[tiny.releases."1.0"]')
    assert after.startswith(head + '[tiny.releases."1.1"]  # released 2026-03-01; sha256 of the package index')
    assert after.endswith(f'sdist = "tiny-1.1.tar.gz"\nsha256 = "{tiny_sha}"\n\n[tiny.releases."1.0"]' + tail)
    new = sources.pin("tiny", "1.1", pins.root / "sources.toml")
    assert (new.sdist, new.sha256) == ("tiny-1.1.tar.gz", tiny_sha)
    assert sources.load(pins.root / "sources.toml")["tiny"]["version"] == "1.0", "the default stays"
    assert (pins.cache / "tiny-1.1.tar.gz").exists() and "the default stays 1.0" in out
    assert run_pin(pins, index.url, capsys, "--version=tiny=1.1")[1].startswith("pin: tiny 1.1 is already pinned")
    assert (pins.root / "sources.toml").read_text() == after
    assert run_pin(pins, index.url, capsys, "--version=tiny=1.1", "--default")[0] == 0
    assert (pins.root / "sources.toml").read_text() == after.replace(
        'version = "1.0"  # the default pin', 'version = "1.1"  # the default pin')


def test_pin_refuses_a_download_whose_hash_is_not_the_index_one(pins, index, capsys):
    published = tiny_sdist(pins.root / "published", "1.1", "10")
    tiny_sdist(pins.root / "files", "1.1", "666")  # what the download gives: another archive of the same name
    publish_all(index, pins, published)
    before = (pins.root / "sources.toml").read_text()
    code, out, err = run_pin(pins, index.url, capsys, "--version=tiny=1.1")
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert f"but the package index publishes {published}" in err and "nothing was pinned" in err
    assert (pins.root / "sources.toml").read_text() == before
    assert not (pins.cache / "tiny-1.1.tar.gz").exists(), "the wrong archive is deleted"


@pytest.mark.parametrize("version, expected", [
    ("9.9", "lists no release tiny 9.9 (its newest: 1.0, 1.1)"),
    ("1.3", "tiny 1.3 is yanked on the package index"),
])
def test_pin_refuses_a_release_the_index_does_not_offer(pins, index, capsys, version, expected):
    publish_all(index, pins)
    before = (pins.root / "sources.toml").read_text()
    code, _, err = run_pin(pins, index.url, capsys, f"--version=tiny={version}")
    assert code == 1 and err.count("\n") == 1 and expected in err, err
    assert (pins.root / "sources.toml").read_text() == before


def test_pin_takes_one_upstream(pins, index, capsys):
    code, _, err = run_pin(pins, index.url, capsys, "--version=tiny=", "--version=other=")
    assert code == 1 and err.count("\n") == 1 and "make pin ACCELERATE_VERSION=1.16.0" in err


@pytest.fixture
def conflicting(kit):
    """tiny 1.0 with the series 'Set VALUE to 2' applied, and tiny 1.1 (``VALUE = 10``) pinned: the series conflicts
    there in tiny/__init__.py."""
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    sha = tiny_sdist(kit.cache, "1.1", "10")
    with open(kit.root / "sources.toml", "a") as f:
        f.write(f'[tiny.releases."1.1"]\nsdist = "tiny-1.1.tar.gz"\nsha256 = "{sha}"\n')
    return kit


def test_a_conflicting_release_leaves_the_checkout_clean_and_says_what_to_do(conflicting):
    kit = conflicting
    head, branch = rev(kit.repo), git(kit.repo, "symbolic-ref", "HEAD").stdout
    code, err = kit.run("apply", "--version=tiny=1.1")
    assert code == 1 and err.count("\n") == 1, err
    for words in ("patches/tiny/0001-Set-VALUE-to-2.patch does not apply to tiny 1.1",
                  "(conflicts in tiny/__init__.py)", "`make apply TINY_VERSION=1.1 KEEP_CONFLICT=1`",
                  "`git am --continue`", "`make export TINY_VERSION=1.1`", "nothing was changed"):
        assert words in err, words
    assert (rev(kit.repo), git(kit.repo, "symbolic-ref", "HEAD").stdout) == (head, branch)
    assert git(kit.repo, "status", "--porcelain").stdout == ""
    assert not (kit.repo / ".git" / "rebase-apply").exists(), "git am never started"


def test_keep_conflict_leaves_git_am_stopped_and_the_next_commands_finish_the_rebase(conflicting):
    kit = conflicting
    code, err = kit.run("apply", "--version=tiny=1.1", "--keep-conflict")
    assert code == 1 and err.count("\n") == 1, err
    assert "(conflicts in tiny/__init__.py): git am stopped there" in err and "on series/1.1" in err
    assert (kit.repo / ".git" / "rebase-apply").is_dir()
    assert git(kit.repo, "diff", "--name-only", "--diff-filter=U").stdout.split() == ["tiny/__init__.py"]
    assert "<<<<<<<" in (kit.repo / "tiny" / "__init__.py").read_text()
    code, err = kit.run("unapply", "--version=tiny=1.1")
    assert code == 1 and "git am or rebase in progress" in err, "the conflict is the user's now: nothing drops it"
    (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 2\n")
    git(kit.repo, "add", "tiny/__init__.py")
    git(kit.repo, "am", "--continue", env=series.COMMITTER_ENV)
    assert kit.run("export", "--version=tiny=1.1")[0] == 0
    patch = next(kit.patches.glob("*.patch")).read_text()
    assert "-VALUE = 10\n+VALUE = 2\n" in patch, "the series is rebased on 1.1"
    code, err = kit.run("apply", "--version=tiny=1.1")
    assert code == 0 and "series already applied on base/1.1" in kit.out, err
