"""Shared by the tessera Python tests: where the CLI and the source tree are (set by ctest)."""

import os
import unittest


def cli():
    """The tessera binary of the same build (TESSERA_CLI), or None."""
    path = os.environ.get("TESSERA_CLI", "")
    return path if path and os.path.exists(path) else None


def require_cli(test):
    path = cli()
    if path is None:
        raise unittest.SkipTest("TESSERA_CLI is not set (run through ctest)")
    return path
