"""Issue 22, items 2 and 3: the Makefile's variables mean what they say.

Boolean variables take 1/yes/true or 0/no/false (or empty); anything else stops make with one line before
anything runs. A command-line variable the kit does not know, and a target it does not have, get one line that
names the closest known variable or points at `make help`. All with `make -n` (nothing runs) or `make help`.
"""

import subprocess

import pytest

from scripts.sources import KIT_ROOT


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(KIT_ROOT), *args], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("target, variable, option", [("unapply", "DISCARD", "--discard"),
                                                      ("export", "RESIGN", "--resign")])
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


@pytest.mark.parametrize("variable", ["DISCARD", "RESIGN", "DEPS"])
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


def test_a_mistyped_target_points_at_make_help():
    result = make("gaet")
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "make has no target 'gaet': make help lists the targets" in lines[0]
