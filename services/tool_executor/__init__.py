"""tool-executor: runs committed, approved calls once."""
