"""transcript digest: the session's running digest of its transcript, which a model-step
request names instead of carrying the transcript (claim-check)

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        # None for sessions made before: the ledger computes it from their rows once.
        batch.add_column(sa.Column("transcript_digest", sa.String(80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("transcript_digest")
