"""a turn's idempotency key: the caller names its turn, and a repeated start is answered
with the turn it already started (unique per session: the ledger enforces it), with the
digest of the text it started with, which a repeat must match

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: turns started before, and starts that name no key, have none.
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(200), nullable=True))
        batch.add_column(sa.Column("text_digest", sa.String(100), nullable=True))
        batch.create_unique_constraint("ux_turns_idempotency_key", ["session_id", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("turns") as batch:
        batch.drop_constraint("ux_turns_idempotency_key", type_="unique")
        batch.drop_column("text_digest")
        batch.drop_column("idempotency_key")
