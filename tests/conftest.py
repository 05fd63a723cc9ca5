"""The kit's suite: the ``regression`` marker comes from the kit's pytest plugin."""

pytest_plugins = ["scripts.pytest_regression"]
