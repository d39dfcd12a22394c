"""The Citus lane's cluster: a coordinator and two workers of their own for
each test module (tests/utils/citus_cluster.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.utils.citus_cluster import CitusCluster, citus_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[CitusCluster]:
    # Outside pytest's temporary directories: see tests/utils/citus_cluster.py.
    home = Path(tempfile.mkdtemp(prefix="memchat-test-citus-"))
    try:
        with citus_cluster(home) as running:
            yield running
    finally:
        shutil.rmtree(home, ignore_errors=True)
