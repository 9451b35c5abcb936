"""The framework adapters are extras of the slim SDK: neither the server nor the SDK's
base install depends on a framework, and each extra pins the version it is tested with."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = {"langchain", "langchain-core", "langgraph", "openai-agents", "openai"}


def names(requirements: list[str]) -> set[str]:
    return {Requirement(r).name.lower() for r in requirements}


def test_neither_the_server_nor_the_sdks_base_install_depends_on_a_framework():
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    sdk = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())["project"]
    assert not names(server["dependencies"]) & FRAMEWORKS
    for extra, requirements in server.get("optional-dependencies", {}).items():
        assert not names(requirements) & FRAMEWORKS, extra
    assert names(sdk["dependencies"]) == {"httpx", "pydantic"}


def test_each_framework_extra_of_the_sdk_pins_the_version_it_is_tested_with():
    extras = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("langchain", "openai-agents"):
        for requirement in map(Requirement, extras[extra]):
            assert str(requirement.specifier).startswith("=="), requirement


def test_importing_the_sdk_imports_no_framework():
    import subprocess
    import sys

    probe = "import sys, signoff_sdk; print(sorted(m for m in sys.modules if m.split('.')[0] in {'langchain', 'langgraph', 'agents', 'openai'}))"
    shown = subprocess.run([sys.executable, "-c", probe], cwd=ROOT / "sdk", capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "[]"


def test_the_checkpointers_the_adapter_tests_use_are_in_the_servers_test_extra_only():
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    checkpointers = {"langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres"}
    assert not names(server["dependencies"]) & checkpointers
    for extra, requirements in server.get("optional-dependencies", {}).items():
        assert (names(requirements) & checkpointers) == (checkpointers if extra == "test" else set()), extra
