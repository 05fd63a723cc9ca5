"""pytest plugin: the ``regression(upstream, issue)`` marker, and its record in the JUnit XML.

A test marked ``@pytest.mark.regression("deepspeed", 8787)`` reproduces upstream issue 8787 of DeepSpeed:
the gate expects it to FAIL on the base and PASS with the series (FAIL_TO_PASS, README "The gate
and its report"). The marker is written as the JUnit property ``regression = "deepspeed#8787"`` so the
gate reads the contract from the same XML as the outcome. Loaded by ``tests/conftest.py`` and by the
gate's ``-p scripts.pytest_regression``.
"""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker (the kit runs with ``--strict-markers``)."""
    config.addinivalue_line("markers", "regression(upstream, issue): reproduces an upstream bug (FAIL_TO_PASS)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Add ``("regression", "<upstream>#<issue>")`` to the user properties of every marked test.

    Raises pytest.UsageError when a marker lacks its two arguments.
    """
    for item in items:
        marker = item.get_closest_marker("regression")
        if marker is None:
            continue
        if len(marker.args) != 2:
            raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.regression(upstream, issue_number)")
        upstream, issue = marker.args
        item.user_properties.append(("regression", f"{upstream}#{issue}"))
