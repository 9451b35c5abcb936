"""transcript digest and dead-letter actions: the session's running digest of its
transcript, which a model-step request names instead of carrying the transcript
(claim-check); what operators did with parked messages (replayed, dropped and why)

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
    op.create_table(
        "dead_letter_actions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("message_id", sa.String(256), nullable=False, index=True),
        sa.Column("message_type", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(256), nullable=False),
        sa.Column("parked_reason", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("operator", sa.String(256), nullable=False),
        sa.Column("acted_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("dead_letter_actions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("transcript_digest")
