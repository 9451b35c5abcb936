"""The committed contract (docs/asyncapi.yaml) is the one the code generates."""

from shared.contract import document
from shared.settings import PROJECT_ROOT


def test_the_committed_asyncapi_document_is_what_the_code_generates():
    committed = (PROJECT_ROOT / "docs" / "asyncapi.yaml").read_text()
    assert document() == committed, "the contract changed: run `make contract` and commit docs/asyncapi.yaml"


def test_the_committed_openapi_document_is_what_the_gateway_generates():
    from services.gateway.app import dumps, openapi_document

    document = openapi_document()
    assert document["openapi"].startswith("3.1")
    committed = (PROJECT_ROOT / "docs" / "openapi.json").read_text()
    assert dumps(document) == committed, "the gateway's API changed: run `make contract` and commit docs/openapi.json"


def test_every_error_the_api_documents_is_a_problem_document():
    from services.gateway.app import openapi_document

    for path, operations in openapi_document()["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert "application/problem+json" in answer.get("content", {}), (path, method, status)


def test_the_sdks_models_name_the_fields_the_openapi_document_gives():
    import json

    import signoff

    schemas = json.loads((PROJECT_ROOT / "docs" / "openapi.json").read_text())["components"]["schemas"]
    pairs = {signoff.Card: "Card", signoff.Started: "Started", signoff.Verdict: "Verdict",
             signoff.Pending: "Pending", signoff.SessionView: "SessionShown"}
    for model, name in pairs.items():
        schema = schemas[name]
        assert set(model.model_fields) == set(schema["properties"]), name
        required = {f for f, info in model.model_fields.items() if info.is_required()}
        assert required == set(schema.get("required", [])), name
