"""sealed requests and claims: the ledger's seal over each request's call (tool and
argument fingerprint), which the executor checks against the call's row before it
runs; and the authorization each execution claim was taken under, which the ledger
checks before it believes the claim's result

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("approval_requests") as batch:
        # None for requests made before: such a request, once approved, is refused by the executor.
        batch.add_column(sa.Column("call_seal", sa.Text(), nullable=True))
    with op.batch_alter_table("execution_claims") as batch:
        batch.add_column(sa.Column("authorization", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("execution_claims") as batch:
        batch.drop_column("authorization")
    with op.batch_alter_table("approval_requests") as batch:
        batch.drop_column("call_seal")
