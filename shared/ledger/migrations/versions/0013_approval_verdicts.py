"""approval that depends on the arguments: each request records what its tool's rule
decided when it was made, how many people must approve it and why

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: requests made before have none; their tool's `approvals_required` counts.
    with op.batch_alter_table("approval_requests") as batch:
        batch.add_column(sa.Column("approvals_required", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("approval_requests") as batch:
        batch.drop_column("reason")
        batch.drop_column("approvals_required")
