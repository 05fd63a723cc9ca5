"""The series workflow on the tiny upstream: apply, idempotence, unapply, export round trip, refusals.

Each refusal test fails when the protection it names is removed from scripts/series.py.
"""

from scripts.git import git, rev


def tree(repo, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", f"{ref}^{{tree}}").stdout.strip()


def commit_fix(kit, value: str = "2") -> None:
    """Commit a change to tiny/__init__.py in the checkout, signed off, as a contributor would."""
    (kit.repo / "tiny" / "__init__.py").write_text(f"VALUE = {value}\n")
    git(kit.repo, "-c", "user.name=A U Thor", "-c", "user.email=author@example.com", "commit", "--quiet",
        "--all", "--signoff", "--message", f"Set VALUE to {value}\n\nFixes #1")


def exported(kit) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(kit.patches.glob("*.patch"))}


def test_empty_series_applies_to_the_base(kit):
    code, err = kit.run("apply")
    assert code == 0, err
    assert rev(kit.repo) == rev(kit.repo, "base/1.0")


def test_export_then_apply_on_a_fresh_kit_gives_the_same_commits(kit, tmp_path):
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    assert list(exported(kit)) == ["0001-Set-VALUE-to-2.patch"]
    patch = exported(kit)["0001-Set-VALUE-to-2.patch"].decode()
    assert patch.startswith("From 0000000000000000000000000000000000000000 ") and "[PATCH 1/1]" in patch
    assert "Signed-off-by: A U Thor <author@example.com>" in patch and not patch.rstrip().endswith("-- ")
    other = tmp_path / "fresh"
    assert kit.run("apply", f"--checkouts={other}")[0] == 0
    fresh = other / "tiny"
    assert (fresh / "tiny" / "__init__.py").read_text() == "VALUE = 2\n"
    assert tree(fresh) == tree(kit.repo)
    assert kit.run("apply", f"--checkouts={tmp_path / 'fresh2'}")[0] == 0
    assert rev(tmp_path / "fresh2" / "tiny") == rev(fresh), "the same series gives the same commit ids"


def test_apply_twice_is_a_no_op(kit):
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    assert kit.run("unapply")[0] == 0
    assert kit.run("apply")[0] == 0
    head = rev(kit.repo)
    assert kit.run("apply")[0] == 0
    assert "series already applied" in kit.out and rev(kit.repo) == head
    assert git(kit.repo, "log", "--format=%s", "base/1.0..HEAD").stdout == "Set VALUE to 2\n"


def test_unapply_returns_to_the_base_and_apply_restores_the_series(kit):
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    applied = rev(kit.repo)
    assert kit.run("unapply")[0] == 0
    assert rev(kit.repo) == rev(kit.repo, "base/1.0")
    assert kit.run("apply")[0] == 0
    assert tree(kit.repo) == tree(kit.repo, applied)


def test_uncommitted_edits_are_refused_and_kept(kit):
    assert kit.run("apply")[0] == 0
    (kit.repo / "tiny" / "__init__.py").write_text("VALUE = 'mine'\n")
    (kit.repo / "notes.txt").write_text("mine")
    for command in ("apply", "unapply", "export"):
        code, err = kit.run(command)
        assert code == 1 and "uncommitted changes" in err and err.count("\n") == 1
    assert (kit.repo / "tiny" / "__init__.py").read_text() == "VALUE = 'mine'\n"
    assert (kit.repo / "notes.txt").read_text() == "mine"


def test_unexported_commits_are_refused_unless_discarded(kit):
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    mine = rev(kit.repo)
    for command in ("apply", "unapply"):
        code, err = kit.run(command)
        assert code == 1 and "holds commits that" in err and "make export" in err
        assert rev(kit.repo) == mine
    assert kit.run("unapply", "--discard")[0] == 0
    assert rev(kit.repo) == rev(kit.repo, "base/1.0")


def test_patch_that_does_not_apply_is_aborted_on_the_base(kit):
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    assert kit.run("unapply")[0] == 0
    assert kit.run("unapply", "--discard")[0] == 0
    assert kit.run("apply")[0] == 0, "the kit's own git am now makes series/1.0"
    assert kit.run("unapply")[0] == 0
    patch = next(kit.patches.glob("*.patch"))
    patch.write_text(patch.read_text().replace("-VALUE = 1", "-VALUE = 7").replace("index ", "index-x "))
    code, err = kit.run("apply")
    assert code == 1 and err.count("\n") == 1
    assert "0001-Set-VALUE-to-2.patch" in err and "tiny/__init__.py" in err and "nothing was changed" in err
    assert not (kit.repo / ".git" / "rebase-apply").exists(), "git am never started"
    assert rev(kit.repo) == rev(kit.repo, "base/1.0")
    assert git(kit.repo, "status", "--porcelain").stdout == ""


def test_exported_commits_are_kept_when_patches_go_back(kit):
    """`make export`, then `git checkout patches/` in the kit: the checkout's commits are no longer in patches/."""
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    mine = rev(kit.repo)
    for patch in kit.patches.glob("*.patch"):
        patch.unlink()
    for command in ("apply", "unapply"):
        code, err = kit.run(command)
        assert code == 1 and "holds commits that" in err and "DISCARD=1" in err
        assert rev(kit.repo) == mine


def test_unexported_commits_on_the_series_branch_are_refused_while_detached(kit):
    """HEAD on the base, but series/1.0 holds a commit of the user's: apply must not reset that branch."""
    assert kit.run("apply")[0] == 0
    git(kit.repo, "checkout", "--quiet", "-B", "series/1.0")
    commit_fix(kit)
    mine = rev(kit.repo)
    git(kit.repo, "checkout", "--quiet", "--detach", "base/1.0")
    code, err = kit.run("apply")
    assert code == 1 and "series/1.0" in err and "DISCARD=1" in err
    assert rev(kit.repo, "series/1.0") == mine
    assert kit.run("unapply", "--discard")[0] == 0
    assert kit.run("apply")[0] == 0 and rev(kit.repo) == rev(kit.repo, "base/1.0")


def test_export_off_the_series_branch_is_refused_and_keeps_the_patches(kit):
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    assert kit.run("export")[0] == 0
    before = exported(kit)
    assert kit.run("unapply")[0] == 0
    code, err = kit.run("export")
    assert code == 1 and "not series/1.0" in err
    assert exported(kit) == before


def test_unfinished_git_am_is_refused_and_left_alone(kit):
    assert kit.run("apply")[0] == 0
    (kit.repo / ".git" / "rebase-apply").mkdir()
    for command in ("apply", "unapply", "export"):
        code, err = kit.run(command)
        assert code == 1 and "git am or rebase in progress" in err
    assert (kit.repo / ".git" / "rebase-apply").is_dir()


def test_commands_on_a_version_without_base_say_what_to_do(kit):
    assert kit.run("apply")[0] == 0
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() +
                                           '[tiny.releases."2.0"]\nsdist = "tiny-2.0.tar.gz"\nsha256 = "00"\n')
    for command in ("unapply", "export"):
        code, err = kit.run(command, "--version=tiny=2.0")
        assert code == 1 and "holds no base/2.0 yet: run `make apply TINY_VERSION=2.0` first" in err
