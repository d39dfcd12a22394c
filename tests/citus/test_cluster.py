"""memchat's schema on a real Citus cluster (a coordinator and two workers,
built from the vendored Citus 14.0.1 by infra/citus.sh): the migrations
apply on the coordinator as they do on plain PostgreSQL, and what they
create that Citus propagates (roles, schemas, extensions) reaches the
workers, which every distributed statement needs there."""

from __future__ import annotations

import psycopg

from memchat.store.migrations import discover, migrate
from tests.utils.citus_cluster import CitusCluster

# The login roles memchat's statements run as, and its schemas.
ROLES = ("memchat_user", "memchat_worker", "memchat_cleanup", "authenticated")
SCHEMAS = ("memchat", "auth", "extensions")
VECTOR = "select extversion from pg_extension where extname = 'vector'"


def one(url: str, query: str, *params: object) -> object:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


def test_the_cluster_is_citus_14_with_two_workers(cluster: CitusCluster) -> None:
    assert str(one(cluster.coordinator_url, "select citus_version()")).startswith("Citus 14.0.1 ")
    workers = one(cluster.coordinator_url, "select count(*) from citus_get_active_worker_nodes()")
    assert workers == 2 and len(cluster.worker_urls) == 2


def test_the_migrations_apply_on_the_coordinator_and_reach_the_workers(
    cluster: CitusCluster,
) -> None:
    applied = migrate(cluster.coordinator_url)
    assert applied == [m.version for m in discover()]
    assert migrate(cluster.coordinator_url) == []  # idempotent, as on PostgreSQL
    for url in cluster.worker_urls:
        for role in ROLES:
            assert one(url, "select count(*) from pg_roles where rolname = %s", role) == 1, role
        for schema in SCHEMAS:
            found = one(url, "select count(*) from pg_namespace where nspname = %s", schema)
            assert found == 1, schema
        assert one(url, VECTOR) == one(cluster.coordinator_url, VECTOR)
