"""`signoff setup --hand-out`: a built-in channel adapter's folder holds its channel's key, its
broker password and the console's read-only database password, nothing else."""

from shared import keyring


def test_a_channel_adapters_hand_out_is_its_key_its_broker_password_and_the_consoles_read_role(tmp_path):
    keys = tmp_path / "keys"
    keyring.create(keys, {"slack": ["alice"], "cli": ["ann"]})
    for name in (
        "rabbitmq/channel.slack.password",
        "rabbitmq/channel.cli.password",
        "postgres/console.password",
        "postgres/approval-ledger.password",
    ):
        keyring.replace_private(keys / name, b"secret")
    written = keyring.hand_out(keys, "channel-slack", tmp_path / "out")
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in written) == [
        "channels/slack.key",
        "postgres/console.password",
        "rabbitmq/channel.slack.password",
    ]
    assert (tmp_path / "out" / "channels" / "slack.key").stat().st_mode & 0o077 == 0
