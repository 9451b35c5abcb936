"""The committed contract (docs/asyncapi.yaml) is the one the code generates."""

from shared.contract import document
from shared.settings import PROJECT_ROOT


def test_the_committed_asyncapi_document_is_what_the_code_generates():
    committed = (PROJECT_ROOT / "docs" / "asyncapi.yaml").read_text()
    assert document() == committed, "the contract changed: run `make contract` and commit docs/asyncapi.yaml"
