"""turn outcomes, escalation targets and the parking an operator acted on: why each
turn ended (its reason code and text, and who cancelled it), to whom a request was
escalated, and which parked copy of a message a dead-letter action was about (so a
rerun after a crash finishes the action on record instead of acting twice)

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: turns, requests and actions made before have none (shown as not recorded).
    with op.batch_alter_table("turns") as batch:
        batch.add_column(sa.Column("reason_code", sa.String(64), nullable=True))
        batch.add_column(sa.Column("reason_text", sa.Text(), nullable=True))
        batch.add_column(sa.Column("ended_by", sa.String(256), nullable=True))
    with op.batch_alter_table("approval_requests") as batch:
        batch.add_column(sa.Column("escalated_to", sa.JSON(), nullable=True))
    with op.batch_alter_table("dead_letter_actions") as batch:
        batch.add_column(sa.Column("parked_at", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dead_letter_actions") as batch:
        batch.drop_column("parked_at")
    with op.batch_alter_table("approval_requests") as batch:
        batch.drop_column("escalated_to")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("ended_by")
        batch.drop_column("reason_text")
        batch.drop_column("reason_code")
