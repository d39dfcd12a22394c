"""The benchmarks' embedded server (tests/bench/_common.py: `database`)."""

from __future__ import annotations

import psycopg
import pytest

from tests.bench import _common as common


def test_the_embedded_server_restarts_with_the_shared_buffers_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bench_recall.py --shared-buffers: recall over a long history depends on
    # how much of it stays in shared_buffers (docs/benchmarks.md).
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with common.database(apply_migrations=False, settings={"shared_buffers": "192MB"}) as target:
        assert target.embedded
        with psycopg.connect(target.url) as conn:
            assert conn.execute("show shared_buffers").fetchone() == ("192MB",)


def test_a_database_url_is_never_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@/nowhere")
    with (
        pytest.raises(SystemExit, match="embedded server only"),
        common.database(apply_migrations=False, settings={"shared_buffers": "192MB"}),
    ):
        pass
