import pytest

from shared import redaction


@pytest.fixture(autouse=True)
def forget_remembered_secrets():
    """Each test starts with the secrets the process remembered before it: a value one
    test resolves from `${env:…}` is not hidden in another's texts."""
    before = set(redaction._known)
    yield
    redaction._known.clear()
    redaction._known.update(before)
