"""Making a checkout from a pinned sdist: download, sha256, cache, safe extraction, base commit.

Each error test fails when the protection it names is removed from scripts/sdist.py or scripts/checkout.py.
"""

import shutil
import tarfile
from pathlib import Path

import pytest

from scripts import KitError, sdist
from scripts.git import git, rev
from tests.kit.conftest import make_tarball


def test_checkout_downloads_verifies_caches_and_tags_base(kit):
    shutil.rmtree(kit.cache)
    code, err = kit.run("checkout")
    assert code == 0, err
    assert (kit.cache / "tiny-1.0.tar.gz").exists()
    assert rev(kit.repo) == rev(kit.repo, "base/1.0")
    assert (kit.repo / "tiny" / "__init__.py").read_text() == "VALUE = 1\n"
    assert not (kit.repo / "tiny.egg-info").exists(), "setuptools metadata is not part of the base"
    assert git(kit.repo, "status", "--porcelain").stdout == ""


def test_second_run_needs_no_network(kit, tmp_path):
    shutil.rmtree(kit.cache)
    assert kit.run("checkout")[0] == 0
    git(kit.repo, "tag", "-d", "base/1.0")
    empty = tmp_path / "empty-index"
    empty.mkdir()
    code, err = kit.run("checkout", index=empty)
    assert code == 0, err


def test_same_base_commit_id_on_two_builds(kit, tmp_path):
    assert kit.run("checkout")[0] == 0
    first = rev(kit.repo, "base/1.0")
    other = tmp_path / "other"
    (other / "upstream").mkdir(parents=True)
    assert kit.run("checkout", f"--checkouts={other / 'upstream'}")[0] == 0
    assert rev(other / "upstream" / "tiny", "base/1.0") == first


def test_wrong_sha256_deletes_archive_and_extracts_nothing(kit):
    kit.pin(sha256="0" * 64)
    code, err = kit.run("checkout")
    assert code == 1
    assert err.count("\n") == 1 and "sha256" in err and "tiny-1.0.tar.gz" in err
    assert not (kit.cache / "tiny-1.0.tar.gz").exists()
    assert git(kit.repo, "tag", "--list").stdout == ""
    assert not (kit.repo / "tiny").exists()


def test_no_network_and_no_cache_names_the_file_and_the_pin(kit, tmp_path):
    shutil.rmtree(kit.cache)
    empty = tmp_path / "empty-index"
    empty.mkdir()
    code, err = kit.run("checkout", index=empty)
    assert code == 1 and err.count("\n") == 1
    assert "tiny-1.0.tar.gz" in err and "tiny==1.0" in err and kit.sha256 in err


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize("member", [
    ("/tmp/kit-absolute.txt", "x"),
    ("tiny-1.0/../../kit-escape.txt", "x"),
    _link("tiny-1.0/link-out", "/etc/passwd"),
    _link("tiny-1.0/hard-out", "../../etc/passwd", tarfile.LNKTYPE),
], ids=["absolute", "dotdot", "symlink-out", "hardlink-out"])
def test_unsafe_tarball_is_refused_and_nothing_is_left(tmp_path, member):
    archive = tmp_path / "tiny-1.0.tar.gz"
    make_tarball(archive, [("tiny-1.0/ok.txt", "ok"), member])
    dest = tmp_path / "out"
    with pytest.raises(KitError, match="unsafe member"):
        sdist.extract(archive, dest)
    assert not dest.exists()
    assert not Path("/tmp/kit-absolute.txt").exists() and not (tmp_path.parent / "kit-escape.txt").exists()


def test_unsafe_sdist_through_the_command_line(kit):
    archive = kit.cache / "tiny-1.0.tar.gz"
    kit.pin(sha256=make_tarball(archive, [("tiny-1.0/ok.txt", "ok"), _link("tiny-1.0/x", "/etc/passwd")]))
    code, err = kit.run("checkout")
    assert code == 1 and "unsafe member" in err
    assert git(kit.repo, "tag", "--list").stdout == ""


def test_existing_directory_that_is_not_a_checkout_is_not_touched(kit):
    kit.repo.mkdir(parents=True)
    (kit.repo / "mine.txt").write_text("mine")
    code, err = kit.run("checkout")
    assert code == 1 and "not a git checkout" in err
    assert [p.name for p in kit.repo.iterdir()] == ["mine.txt"]


def test_missing_git_is_one_line(kit, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    code, err = kit.run("checkout")
    assert code == 1 and err.count("\n") == 1 and "git is not installed" in err
