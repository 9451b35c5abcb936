"""Channel adapters that run as products: Slack (`slack.py`, extra `slack`) and email
(`email.py`, extra `email`), each a `ChannelAdapter` process started by `signoff channel
run NAME`. What they share: the cards they showed, kept in a file of their own
(`book.py`), and the pending cards they catch up on when they start (`backlog.py`)."""
