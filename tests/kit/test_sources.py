"""The git source (``--source git``, for maintainers with network), re-signing on export, and a release not pinned.

The git source is tested against a local repository URL, never the network.
"""

import pytest

from scripts import KitError, sources
from scripts.git import git, rev
from tests.kit.conftest import TINY_FILES
from tests.kit.test_series import commit_fix


def make_git_upstream(tmp_path) -> str:
    """A local git repository holding the tiny upstream with the annotated tag v1.0; return its file:// URL."""
    origin = tmp_path / "origin"
    for name, text in TINY_FILES.items():
        (origin / name).parent.mkdir(parents=True, exist_ok=True)
        (origin / name).write_text(text)
    ident = ["-c", "user.name=Upstream", "-c", "user.email=up@example.com"]
    git(origin, "init", "--quiet")
    git(origin, "add", "--all")
    git(origin, *ident, "commit", "--quiet", "--message", "Release 1.0")
    git(origin, *ident, "tag", "--annotate", "v1.0", "--message", "v1.0")
    (origin / "later.txt").write_text("after the tag")
    git(origin, "add", "--all")
    git(origin, *ident, "commit", "--quiet", "--message", "After 1.0")
    return origin.as_uri()


def test_git_source_takes_the_pinned_tag(kit, tmp_path):
    url = make_git_upstream(tmp_path)
    kit.pin()
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text().replace("file:///nowhere", url))
    code, err = kit.run("apply", "--source=git")
    assert code == 0, err
    assert rev(kit.repo, "base/1.0") == rev(tmp_path / "origin", "v1.0")
    assert (kit.repo / "tiny.egg-info" / "PKG-INFO").exists(), "the tag's tree, not the sdist's"
    assert not (kit.repo / "later.txt").exists()


def test_git_source_without_network_is_one_line(kit):
    code, err = kit.run("checkout", "--source=git")
    assert code == 1 and err.count("\n") == 1
    assert "cannot fetch tag v1.0 of tiny from file:///nowhere" in err


def test_export_resign_makes_the_user_author_and_sole_signer(kit):
    assert kit.run("apply")[0] == 0
    commit_fix(kit)
    git(kit.repo, "config", "user.name", "Re Viewer")
    git(kit.repo, "config", "user.email", "re@example.com")
    before_tree = git(kit.repo, "rev-parse", "HEAD^{tree}").stdout
    code, err = kit.run("export", "--resign")
    assert code == 0, err
    patch = next(kit.patches.glob("*.patch")).read_text()
    assert "From: Re Viewer <re@example.com>" in patch
    assert "Signed-off-by: Re Viewer <re@example.com>" in patch and "A U Thor" not in patch
    assert "Fixes #1" in patch
    assert git(kit.repo, "rev-parse", "HEAD^{tree}").stdout == before_tree
    assert kit.run("apply")[0] == 0 and "already applied" in kit.out


def test_a_release_not_pinned_is_told_how_to_pin_it():
    """`make apply DEEPSPEED_VERSION=0.19.99` told a newcomer to edit sources.toml by hand; `make pin` does it."""
    with pytest.raises(KitError, match=r"deepspeed 0\.19\.99 is not pinned .*`make pin DEEPSPEED_VERSION=0\.19\.99`"):
        sources.pin("deepspeed", "0.19.99")


@pytest.mark.parametrize(("entry", "in_tree"), [
    ({"script": "scripts/check.py", "nproc": 2}, True),
    ({"script": "scripts/later.py", "nproc": 2}, False),
    ({"pytest": "tests/test_cpu.py::MultiCPUTester::test_first"}, True),
    ({"pytest": "tests/test_cpu.py::MultiCPUTester::test_second"}, False),  # a later commit adds it to the file
    ({"pytest": "tests/test_later.py::test_first"}, False),
])
def test_a_launch_entry_is_in_a_tree_when_its_test_is_defined_there(tmp_path, entry, in_tree):
    """The gate runs a launch entry in a stage only when the stage's tree defines its test, so that the test a stack's
    later commit adds to an existing file is not an error in the stages before it."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "check.py").write_text("print('ok')\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_cpu.py").write_text(
        "class MultiCPUTester:\n    def test_first(self):\n        pass\n\n    # test_second( is not defined\n")
    assert sources.launched_in(entry, tmp_path) is in_tree
