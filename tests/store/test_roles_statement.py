"""docs/deploy.md states exactly what each role may do; the catalog agrees.

Every role's rights (schemas, tables and columns, sequences, the RLS
policies that apply to it, the functions it may call, the roles it may
become) are read off the catalog of the migrated database and compared
with the statement in docs/deploy.md ("Roles: exactly what each may do"). A
migration that widens a role (or narrows it) fails here until the
statement says so: update the block from this test's failure message.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.utils.roles import BEGIN, DEPLOY_GUIDE, END, describe_roles, documented

# The roles as the migrations leave them (on Citus the statement roles may
# log in): not in the Citus lane.
pytestmark = pytest.mark.plain_only


def test_the_deploy_guide_states_each_roles_rights_exactly(admin: psycopg.Connection) -> None:
    actual = describe_roles(admin)
    stated = documented(DEPLOY_GUIDE)
    assert stated == actual, (
        "docs/deploy.md's roles statement differs from the database; if the change is"
        f" meant, put this between {BEGIN} and {END}:\n```text\n{actual}\n```"
    )
