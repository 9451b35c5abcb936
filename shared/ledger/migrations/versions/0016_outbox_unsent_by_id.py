"""the relay's poll starts at the first unsent row: a partial index of the
unsent outbox rows by id, which the poll's `id >= min(id)` bound reads (an index-only
scan, which marks the entries of rows already sent dead as it passes them)

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UNSENT = "sent_at IS NULL"


def upgrade() -> None:
    op.create_index(
        "ix_outbox_unsent_id", "outbox", ["id"], postgresql_where=sa.text(UNSENT), sqlite_where=sa.text(UNSENT)
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_unsent_id", table_name="outbox")
