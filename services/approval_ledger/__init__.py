"""approval-ledger: the single owner of Signoff's state."""
