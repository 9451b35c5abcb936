"""The docs site's generated pages (docs/reference/) are the ones the code and the
committed contracts generate: the configuration reference from the settings classes,
the HTTP API from docs/openapi.json, the message contracts from docs/asyncapi.yaml."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["configuration.md", "http-api.md", "message-contracts.md"])
def test_each_committed_reference_page_is_the_one_the_code_generates(page):
    path = ROOT / "docs" / "reference" / page
    generated = generator().pages()[path]
    assert path.read_text() == generated, f"docs/reference/{page} is stale: run `make contract` and commit it"


def test_every_setting_says_what_it_does():
    page = generator().configuration()
    undescribed = [
        line.split("|")[1].strip()
        for line in page.splitlines()
        if line.startswith("| `SIGNOFF_") and line.rstrip().endswith("|  |")
    ]
    assert undescribed == [], f"give these settings a comment above them in their class: {undescribed}"


def test_every_variable_the_code_reads_from_the_environment_is_in_the_configuration_reference():
    page = generator().configuration()
    read = {
        name
        for folder in ("services", "shared", "signoff")
        for path in (ROOT / folder).rglob("*.py")
        for name in re.findall(r'environ(?:\.get\(|\[)"(SIGNOFF_[A-Z_]+)"', path.read_text())
    }
    assert read, "no environment read found: the pattern is stale"
    assert sorted(name for name in read if f"| `{name}` |" not in page) == []
