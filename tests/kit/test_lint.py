"""`make lint` on a tiny upstream: a clean patch passes; a mis-formatted, unsigned one fails on every count.

Uses the real tool environment (.tools, made by `make tools`, which `make test` depends on).
"""

import pytest

from scripts import lint
from scripts.git import git
from scripts.sources import KIT_ROOT

LINT = ("[tiny.lint]\nheader = '\\A# tiny\\n'\ncommands = [[\"ruff\", \"format\", \"--check\"]]\n"
        "forbidden = [{ pattern = 'os\\.system', reason = 'no os.system' }]\n")


def lint_series(kit, capsys, content: str, message: str) -> tuple[int, str]:
    """Commit ``content`` as tiny/__init__.py with ``message``, export, and lint; return (exit code, stdout)."""
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() + LINT)
    assert kit.run("apply")[0] == 0
    (kit.repo / "tiny" / "__init__.py").write_text(content)
    git(kit.repo, "-c", "user.name=A U Thor", "-c", "user.email=author@example.com", "commit", "--quiet", "--all",
        "--message", message)
    assert kit.run("export")[0] == 0
    capsys.readouterr()
    code = lint.main(["--only=tiny", f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
                      f"--patches={kit.root / 'patches'}", f"--tools={KIT_ROOT / '.tools'}"])
    return code, capsys.readouterr().out


def test_clean_patch_passes(kit, capsys):
    code, out = lint_series(kit, capsys, "# tiny\nVALUE = 2\n", "Set VALUE to 2\n\nThe value was wrong.\n\n"
                            "Fixes #1\n\nSigned-off-by: A U Thor <author@example.com>")
    assert code == 0, out
    assert "lint tiny 1.0: 0 problems" in out


@pytest.mark.parametrize("problem", [
    "subject is 80 characters (at most 72)",
    "commit message has no body",
    "no `Fixes #N` line",
    "no `Signed-off-by: Name <email>` trailer (DCO)",
    "trailing whitespace",
    "tiny/tiny/__init__.py: no license header",
    "`ruff format --check` failed",
    "tiny/tiny/__init__.py:3: no os.system",
])
def test_misformatted_unsigned_patch_fails(kit, capsys, problem):
    code, out = lint_series(kit, capsys, "VALUE=[1,\n  2]  \n# not os.system either\n", "x" * 80)
    assert code == 1
    assert problem in out, out


def run_lint(kit, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = lint.main(["--only=tiny", "--ready", f"--sources={kit.root / 'sources.toml'}",
                      f"--checkouts={kit.root / 'upstream'}", f"--patches={kit.root / 'patches'}"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_hint_names_a_command_that_works_in_that_state(kit, capsys):
    """Issue 14, item 5: the hint was `make apply (or make export)`, and export failed off the series branch."""
    assert kit.run("apply")[0] == 0
    git(kit.repo, "-c", "user.name=A", "-c", "user.email=a@example.com", "commit", "--quiet", "--allow-empty",
        "--message", "mine")
    code, _, err = run_lint(kit, capsys)
    assert code == 1 and "run `make export`" in err
    assert kit.run("export")[0] == 0, "the hint works"
    assert kit.run("unapply")[0] == 0
    code, _, err = run_lint(kit, capsys)
    assert code == 1 and "run `make apply` first" in err and "make export" not in err
    assert kit.run("apply")[0] == 0, "the hint works"
    assert run_lint(kit, capsys)[0] == 0


def test_problem_lines_follow_their_summary_in_the_singular(kit, capsys):
    code, out = lint_series(kit, capsys, "# tiny\nVALUE = 2\n", "Set VALUE to 2\n\nThe value was wrong.\n\n"
                            "Signed-off-by: A U Thor <author@example.com>")
    assert code == 1
    assert out.splitlines()[:2] == ["lint tiny 1.0: 1 problem",
                                    "  patches/tiny/0001-Set-VALUE-to-2.patch: no `Fixes #N` line"]


def lint_stack(kit, capsys, keys: str, commits) -> tuple[int, str]:
    """Declare a stack (``keys``: its [[tiny.gate.commits]] tables), commit each (content of tiny/__init__.py,
    message) signed off, export, and lint; return (exit code, stdout)."""
    (kit.root / "sources.toml").write_text((kit.root / "sources.toml").read_text() + LINT + "[tiny.gate]\n" + keys)
    assert kit.run("apply")[0] == 0
    for content, message in commits:
        (kit.repo / "tiny" / "__init__.py").write_text(content)
        git(kit.repo, "-c", "user.name=A U Thor", "-c", "user.email=author@example.com", "commit", "--quiet", "--all",
            "--signoff", "--message", message)
    assert kit.run("export")[0] == 0
    capsys.readouterr()
    argv = ["--only=tiny", f"--sources={kit.root / 'sources.toml'}", f"--checkouts={kit.root / 'upstream'}",
            f"--patches={kit.root / 'patches'}", f"--tools={KIT_ROOT / '.tools'}"]
    return lint.main(argv), capsys.readouterr().out


def test_each_commit_of_a_stack_is_checked_against_its_key(kit, capsys):
    """A stack of two: commit 1's key 1 needs `Fixes #1`, which it lacks; commit 2's slug key needs no `Fixes #N`."""
    code, out = lint_stack(kit, capsys, '[[tiny.gate.commits]]\nkey = 1\n[[tiny.gate.commits]]\nkey = "more"\n',
                           [("# tiny\nVALUE = 2\n", "Set VALUE to 2\n\nIt was wrong.\n\nFixes #1"),
                            ("# tiny\nVALUE = 2\nMORE = 3\n", "Add MORE\n\nA follow-up without an issue yet.")])
    assert code == 0, out
    assert lint.message_problems(sorted(kit.patches.glob("*.patch"))[1], "2") == [
        "no `Fixes #2` line (its key in [[<name>.gate.commits]])"]


def test_each_commit_of_a_stack_passes_the_style_checks_alone(kit, capsys):
    """The pull requests of a stack merge one at a time: a first commit mis-formatted and formatted by the second
    fails, though the stack's top passes (a maintainer's review of the DeepSpeed stack found such a line)."""
    code, out = lint_stack(kit, capsys, '[[tiny.gate.commits]]\nkey = "one"\n[[tiny.gate.commits]]\nkey = "two"\n',
                           [("# tiny\nVALUE=[1,\n  2]\n", "Set VALUE\n\nIt was missing."),
                            ("# tiny\nVALUE = [1, 2]\n", "Format VALUE\n\nIt was not formatted.")])
    assert code == 1
    assert [line for line in out.splitlines() if "failed" in line] == [
        "  0001-Set-VALUE.patch: tiny: `ruff format --check` failed:"], out


def test_series_signed_off_by_two_identities_is_a_problem(tmp_path):
    """Both series go out under one name: a second identity in another series is reported, one is not."""
    signed = {"one": "A U Thor <author@example.com>", "two": "A U Thor <author@example.com>"}
    for name, who in signed.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "0001-x.patch").write_text(f"Subject: [PATCH] x\n\nBody.\n\nSigned-off-by: {who}\n---\n")
    dirs = {name: tmp_path / name for name in signed}
    assert lint.signoff_problems(dirs) == []
    (tmp_path / "two" / "0001-x.patch").write_text("Subject: x\n\nBody.\n\nSigned-off-by: Other <o@example.com>\n")
    problems = lint.signoff_problems(dirs)
    assert len(problems) == 1 and "2 identities" in problems[0] and "Other <o@example.com> (two)" in problems[0]
