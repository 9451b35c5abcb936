"""`signoff token create --expires`: lifetimes and times accepted, anything else refused."""

from datetime import UTC, datetime

import pytest

from services.gateway import programs


def test_an_expiry_is_a_lifetime_or_a_future_time_with_its_zone():
    now = 1_800_000_000.0
    assert programs.parse_expiry(None, now) is None and programs.parse_expiry("", now) is None
    assert programs.parse_expiry("90m", now) == now + 5400
    assert programs.parse_expiry("12h", now) == now + 43200
    assert programs.parse_expiry("30d", now) == now + 30 * 86400
    later = datetime.fromtimestamp(now + 3600, UTC).isoformat()
    assert programs.parse_expiry(later, now) == now + 3600
    for wrong in ("0d", "10y", "-5m", "soon", "2027-01-31T18:00:00", datetime.fromtimestamp(now - 1, UTC).isoformat()):
        with pytest.raises(SystemExit):
            programs.parse_expiry(wrong, now)
