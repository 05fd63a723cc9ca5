"""Issues 22 (items 2, 3) and 33 (item 5): the Makefile's variables mean what they say.

Boolean variables take 1/yes/true or 0/no/false (or empty), counts a whole number, choices one of theirs; anything
else stops make with one line before anything runs. A command-line variable the kit does not know, and a target it
does not have, get one line that names the closest known one and points at `make help`; a known variable that none
of the targets reads gets one warning. All with `make -n` (nothing runs) or `make help`.
"""

import re
import subprocess
import sys

import pytest

from scripts.sources import KIT_ROOT


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(KIT_ROOT), *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("target, variable, option", [("unapply", "DISCARD", "--discard"),
                                                      ("export", "RESIGN", "--resign"), ("pr", "DRAFT", "--draft")])
@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("true", True), ("0", False), ("no", False),
                                       ("false", False), ("", False)])
def test_boolean_variables_mean_what_they_say(target, variable, option, value, on):
    result = make("-n", target, f"{variable}={value}")
    assert result.returncode == 0, result.stderr
    assert (option in result.stdout) == on


@pytest.mark.parametrize("value, on", [("1", False), ("yes", False), ("0", True), ("no", True), ("false", True),
                                       ("", False)])
def test_deps_is_a_boolean_too(value, on):
    result = make("-n", "matrix", f"DEPS={value}")
    assert result.returncode == 0, result.stderr
    assert ("--no-deps" in result.stdout) == on


@pytest.mark.parametrize("variable", ["DISCARD", "RESIGN", "DEPS", "DRAFT"])
@pytest.mark.parametrize("value", ["maybe", "2", "on please"])
def test_a_boolean_that_is_neither_stops_before_anything_runs(variable, value):
    result = make("-n", "unapply", f"{variable}={value}")
    assert result.returncode != 0
    assert result.stdout == ""  # not one recipe line was even printed
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert f"{variable}={value} is not a boolean: use 1, yes or true, or 0, no or false" in lines[0]


@pytest.mark.parametrize("typed, meant", [("REPEATS", "REPEAT"), ("GATE_JOB", "GATE_JOBS"), ("JOSB", "JOBS"),
                                          ("discard", "DISCARD")])
def test_an_unknown_variable_gets_one_warning_naming_the_close_match(typed, meant):
    result = make("help", f"{typed}=3")
    assert result.returncode == 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert f"warning: {typed} is not a variable of the kit and is ignored (did you mean {meant}?)" in lines[0]


def test_known_variables_get_no_warning():
    result = make("help", "REPEAT=3", "JOBS=1", "GATE_JOBS=1", "DISCARD=1", "KIT_URL=https://example.com/kit")
    assert result.returncode == 0 and result.stderr == ""


@pytest.mark.parametrize("typed, meant", [("gaet", "gate"), ("tset", "test"), ("aplly", "apply"), ("PR", "pr")])
def test_a_mistyped_target_names_the_close_match_and_points_at_make_help(typed, meant):
    result = make(typed)
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and f"make has no target '{typed}' (did you mean {meant}?): make help lists the targets" \
        in lines[0], lines


def test_a_target_like_no_other_gets_no_guess():
    lines = make("zzzzzz").stderr.splitlines()
    assert len(lines) == 1 and "make has no target 'zzzzzz': make help lists the targets" in lines[0], lines


# Issue 33, item 5: `make gate GATE_JOBS=abc` printed argparse's five-line usage; every bad value is one line, before
# anything runs.
@pytest.mark.parametrize("target, setting, message", [
    ("gate", "GATE_JOBS=abc", "GATE_JOBS=abc is not a positive whole number: use a count, e.g. GATE_JOBS=2"),
    ("test", "JOBS=0", "JOBS=0 is not a positive whole number"),
    ("stress", "REPEAT=1.5", "REPEAT=1.5 is not a positive whole number"),
    ("matrix", "MATRIX_JOBS=-1", "MATRIX_JOBS=-1 is not a positive whole number"),
    ("stress", "LOAD=many", "LOAD=many is not a whole number: use a count of busy processes, e.g. LOAD=4"),
    ("stress", "ON=patched", "ON=patched is not one of checkouts, base, series: e.g. ON=checkouts"),
    ("upstream", "SOURCE=svn", "SOURCE=svn is not one of sdist, git: e.g. SOURCE=sdist"),
])
def test_a_bad_count_or_choice_stops_before_anything_runs_in_one_line(target, setting, message):
    result = make("-n", target, setting)
    assert result.returncode != 0 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_load_zero_and_counts_are_taken():
    assert make("-n", "stress", "LOAD=0", "REPEAT=3", "JOBS=2").returncode == 0


def test_a_variable_the_targets_do_not_read_gets_one_warning():
    """PYTEST_ARGS was silently ignored by make gate."""
    lines = make("-n", "gate", "PYTEST_ARGS=-k partition").stderr.splitlines()
    assert len(lines) == 1 and ("warning: PYTEST_ARGS is read by make test only, not by make gate, and is ignored "
                                "here; the gate judges every test of the suite, so it takes none") in lines[0], lines
    assert make("-n", "test", "PYTEST_ARGS=-k partition").stderr == ""
    assert make("-n", "lint", "gate", "GATE_JOBS=1").stderr == ""  # one of the targets reads it


def test_make_help_says_what_every_variable_means_and_which_targets_read_it():
    makefile = (KIT_ROOT / "Makefile").read_text()
    known = re.search(r"^KNOWN := (.*?)\n(?!  )", makefile, re.M | re.S).group(1).replace("\\\n", " ").split()
    out = make("help").stdout
    for variable in known:
        line = next((x for x in out.splitlines() if x.startswith(f"  {variable}=")), "")
        assert re.fullmatch(rf"  {variable}=\S*\s+\S.*", line), (variable, line)
    assert re.search(r"^  GATE_JOBS=\d+ +stages of the gate run at once .*\[gate\]$", out, re.M), out
    assert re.search(r"^  PYTEST_ARGS= +extra pytest arguments, e.g. -k partition \[test\]$", out, re.M), out


def test_a_bad_option_of_a_kit_script_is_one_line(tmp_path):
    """`make bench BENCH_ARGS='--repeat x'` printed argparse's usage."""
    result = subprocess.run([sys.executable, "-m", "scripts.bench", "--repeat", "x"], cwd=KIT_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == ("error: python -m scripts.bench: argument --repeat: invalid int value: 'x': "
                             "`python -m scripts.bench --help` lists the options\n")
