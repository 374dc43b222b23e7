"""Shared fixtures of the zinfinity package's tests (run by ctest as python_test)."""

import os
import shutil
import sys
import tempfile

import pytest


@pytest.fixture
def workdir():
    """A fresh directory under ZINF_TEST_TMPDIR (the build tree's disk, where O_DIRECT works),
    removed afterwards."""
    base = os.environ.get("ZINF_TEST_TMPDIR") or None
    if base:
        os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix="zinf-py-", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def example():
    """examples/pytorch_fashion_mnist.py as a module."""
    root = os.environ.get("ZINF_EXAMPLES") or os.path.join(
        os.path.dirname(__file__), "..", "..", "examples")
    sys.path.insert(0, os.path.abspath(root))
    import pytorch_fashion_mnist

    return pytorch_fashion_mnist
