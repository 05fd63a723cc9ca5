"""Issue 14 on the tiny upstream: no commit of the user's is dropped whatever ran before, every command on several
upstreams is all or nothing, and an interrupted command leaves no process, no half-done `git am`, no traceback.

Each test fails when the guarantee it names is removed from scripts/series.py, scripts/upstream.py or
scripts/runlock.py.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from scripts import sources
from scripts.git import git, rev
from tests.kit.conftest import TINY_FILES, make_tarball
from tests.kit.test_runlock import interrupt
from tests.kit.test_series import commit_fix

AUTHOR = ["-c", "user.name=A U Thor", "-c", "user.email=author@example.com"]


def kit_made_series(kit) -> None:
    """The state after `make apply` on a fresh clone: series/1.0 made by the kit's own `git am` from patches/."""
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    assert kit.run("unapply", "--discard")[0] == 0
    assert kit.run("apply")[0] == 0


def add_version_2(kit) -> None:
    """Pin tiny 2.0 too (same files, another version), its sdist in the cache: a second base, as `make matrix` uses."""
    files = {**TINY_FILES, "pyproject.toml": TINY_FILES["pyproject.toml"].replace('"1.0"', '"2.0"')}
    sha = make_tarball(kit.cache / "tiny-2.0.tar.gz", [(f"tiny-2.0/{n}", t) for n, t in files.items()])
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() +
                                           f'[tiny.releases."2.0"]\nsdist = "tiny-2.0.tar.gz"\nsha256 = "{sha}"\n')


def gate_like(kit) -> None:
    """What the gate did to the checkout: another branch for its first stage, then `apply` of the series."""
    git(kit.repo, "checkout", "--quiet", "-B", "gate/before/1.0", "base/1.0")
    git(kit.repo, "update-ref", "refs/kit/gate-before", "HEAD")
    assert kit.run("apply")[0] == 0


def matrix_like(kit) -> None:
    """What `make matrix` does: apply the series on another version, then on the default one again."""
    add_version_2(kit)
    assert kit.run("apply", "--version=tiny=2.0")[0] == 0
    assert kit.run("apply")[0] == 0


def amend(kit) -> None:
    (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 2  # amended\n")
    git(kit.repo, *AUTHOR, "commit", "--quiet", "--all", "--amend", "--no-edit")


def second_commit(kit) -> None:
    (kit.repo / "tiny" / "extra.py").write_text("EXTRA = 1\n")
    git(kit.repo, "add", "tiny/extra.py")
    git(kit.repo, *AUTHOR, "commit", "--quiet", "--signoff", "--message", "Add EXTRA\n\nFixes #2")


def restore_patches(saved: dict[str, bytes]):
    """`git checkout patches/` plus `git clean` in the kit: patches/ holds exactly ``saved`` again."""
    def undo(kit):
        for patch in kit.patches.glob("*.patch"):
            patch.unlink()
        for name, data in saved.items():
            (kit.patches / name).write_bytes(data)
    return undo


def delete_last_patch(kit) -> None:
    sorted(kit.patches.glob("*.patch"))[-1].unlink()


@pytest.mark.parametrize("between", [gate_like, matrix_like, lambda kit: None, lambda kit: kit.run("apply")],
                         ids=["gate", "matrix", "nothing", "apply"])
@pytest.mark.parametrize("change, undo", [
    (amend, "checkout"), (second_commit, "checkout"), (second_commit, "clean"), (amend, "delete"),
], ids=["amend-checkout-patches", "second-commit-checkout-patches", "second-commit-git-clean", "amend-patch-deleted"])
def test_exported_commits_are_never_dropped_after_patches_go_back(kit, between, change, undo):
    """Issue 14, item 1: commit in the checkout, `make export`, run something, undo patches/, `make apply`."""
    kit_made_series(kit)
    saved = {p.name: p.read_bytes() for p in kit.patches.glob("*.patch")}
    change(kit)
    mine = rev(kit.repo)
    assert kit.run("export")[0] == 0
    between(kit)
    assert rev(kit.repo, "series/1.0") == mine, "the exported commits stay the user's own commits"
    {"checkout": restore_patches(saved), "clean": restore_patches(saved), "delete": delete_last_patch}[undo](kit)
    for command in ("apply", "unapply"):
        code, err = kit.run(command)
        assert code == 1 and "holds commits that" in err and "DISCARD=1" in err, err
        assert rev(kit.repo, "series/1.0") == mine
    assert kit.run("export")[0] == 0, "export brings the commits back into patches/"
    assert kit.run("apply")[0] == 0 and rev(kit.repo) == mine


def test_new_patches_from_the_kit_replace_the_kits_own_series(kit):
    """The protection does not get in the way: a series the kit applied is replaced when patches/ changes."""
    kit_made_series(kit)
    applied = rev(kit.repo)
    for patch in kit.patches.glob("*.patch"):
        patch.write_text(patch.read_text().replace("+VALUE = 2", "+VALUE = 3"))
    code, err = kit.run("apply")
    assert code == 0, err
    assert rev(kit.repo) != applied and (kit.repo / "tiny" / "__init__.py").read_text() == "VALUE = 3\n"


def two_upstreams(kit) -> None:
    """Pin a second upstream `other` (the same sdist) after `tiny` in sources.toml."""
    text = (kit.root / "sources.toml").read_text()
    (kit.root / "sources.toml").write_text(text + text.replace("[tiny", "[other") .replace(
        'version = "1.0"', 'version = "1.0"\npackage = "tiny"', 1))


@pytest.mark.parametrize("command", ["unapply", "apply", "export"])
def test_several_upstreams_all_or_nothing(kit, command):
    """Issue 14, item 3: the second upstream refuses, so the first one is not changed either."""
    two_upstreams(kit)
    kit_made_series(kit)
    other = kit.root / "upstream" / "other"
    if command == "apply":
        assert kit.run("unapply")[0] == 0
    before = {repo: (rev(repo), git(repo, "symbolic-ref", "-q", "HEAD", check=False).stdout) for repo in (kit.repo,
                                                                                                        other)}
    exported = {p: p.read_bytes() for p in kit.patches.glob("*.patch")}
    if command == "export":
        commit_fix(kit, "5")
    (other / "tiny" / "__init__.py").write_text("VALUE = 'mine'\n")
    code, err = kit.run(command)
    assert code == 1 and err.count("\n") == 1
    assert "other has uncommitted changes (1 path," in err and "nothing was changed" in err
    assert rev(other) == before[other][0]
    if command == "export":
        assert {p: p.read_bytes() for p in kit.patches.glob("*.patch")} == exported
    else:
        assert (rev(kit.repo), git(kit.repo, "symbolic-ref", "-q", "HEAD", check=False).stdout) == before[kit.repo]
    assert all(line.endswith(f"base/1.0 is {rev(kit.repo, 'base/1.0')[:12]}") for line in kit.out.splitlines())


def slow_am(kit) -> None:
    """Make `git am` in the tiny checkout wait in its pre-applypatch hook (in a child of the hook's shell)."""
    hook = kit.repo / ".git" / "hooks" / "pre-applypatch"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text("#!/bin/sh\nsleep 60\n")
    hook.chmod(0o755)


@pytest.mark.parametrize("sig, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, False)],
                         ids=["ctrl-c-to-the-group", "sigterm-as-make-sends-it", "sighup"])
def test_interrupted_apply_leaves_no_process_no_half_am_no_traceback(kit, sig, to_group):
    """Issue 14, item 2 for `make apply`: the signal during `git am`; nothing of it runs 5 s later."""
    kit_made_series(kit)
    assert kit.run("unapply")[0] == 0
    for patch in kit.patches.glob("*.patch"):  # new patches, so that apply runs `git am` again
        patch.write_text(patch.read_text().replace("+VALUE = 2", "+VALUE = 3"))
    slow_am(kit)
    env = {k: v for k, v in os.environ.items() if k != "KIT_RUN"}
    args = [f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
            f"--patches={kit.root / 'patches'}", f"--cache={kit.cache}", "apply"]
    proc = subprocess.Popen([sys.executable, "-m", "scripts.upstream", *args], cwd=sources.KIT_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (kit.repo / ".git" / "rebase-apply").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    left, err = interrupt(proc, sig, to_group)
    assert left == []
    assert proc.returncode == 130
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith("interrupted; checkouts: tiny 1.0 detached at base/1.0: series not applied"), err
    assert not (kit.repo / ".git" / "rebase-apply").exists()
    assert git(kit.repo, "status", "--porcelain").stdout == ""


def test_describe_names_version_branch_and_series(kit):
    from scripts import series

    kit_made_series(kit)
    assert series.describe(kit.repo, kit.patches) == "tiny 1.0 on series/1.0: series applied (1 patch)"
    (kit.repo / "notes.txt").write_text("x")
    assert series.describe(kit.repo, kit.patches).endswith("series applied (1 patch), 1 uncommitted change")
    (kit.repo / "notes.txt").unlink()
    commit_fix(kit, "4")
    assert series.describe(kit.repo, kit.patches) == ("tiny 1.0 on series/1.0: 2 commits above the base that tiny "
                                                      "patches do not hold (`make export`)")
    shutil.rmtree(kit.repo)
    assert series.describe(kit.repo, kit.patches) == "tiny: no checkout (run `make apply`)"


def test_installed_metadata_follows_a_version_switch(kit, tmp_path):
    """Issue 14, item 6: after `make unapply` (or apply) puts another version on disk, its install step makes the
    venv's metadata say that version (`make unapply` runs `install` after it: tests/kit/test_runlock.py)."""
    add_version_2(kit)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # pip and a setuptools that builds editable installs without `wheel`: the kit's own venv's, after the venv's own.
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "kit-tools.pth").write_text(next(p for p in sys.path if p.endswith("site-packages")) + "\n")
    python = str(venv / "bin" / "python")
    options = f"--pip-options=--no-index --find-links {kit.index} --no-build-isolation"
    args = [f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
            f"--patches={kit.root / 'patches'}", f"--cache={kit.cache}", options]

    def installed() -> str:
        code = "from importlib import metadata; print(metadata.version('tiny'))"
        return subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=tmp_path).stdout.strip()

    def install(*more: str) -> None:
        result = subprocess.run([python, "-m", "scripts.upstream", "install", *args, *more], cwd=sources.KIT_ROOT,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr

    assert kit.run("apply")[0] == 0 and kit.run("apply", "--version=tiny=2.0")[0] == 0
    install("--version=tiny=2.0")
    assert installed() == "2.0"
    assert kit.run("unapply")[0] == 0, "back on base/1.0, as a plain `make unapply` after an apply of 2.0 does"
    install()
    assert installed() == "1.0"


def test_apply_checks_only_change_nothing(kit):
    """`make apply` runs `apply --check-only` before it builds the venv: a refusal costs nothing, a pass changes
    nothing (a checkout still to make is skipped)."""
    assert kit.run("apply", "--check-only")[0] == 0
    assert not kit.repo.exists() and not kit.out
    kit_made_series(kit)
    commit_fix(kit, "6")
    mine = rev(kit.repo)
    code, err = kit.run("apply", "--check-only")
    assert code == 1 and "holds commits that" in err and rev(kit.repo) == mine
