"""The slim SDK installs alone: into an empty virtual environment, from sdk/, with only
httpx and pydantic (and what they need) beside it, and none of the server's packages."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

from shared.settings import PROJECT_ROOT

# What httpx and pydantic bring (their own dependencies), and what a fresh environment holds.
ALLOWED = {
    "signoff-sdk", "httpx", "httpcore", "h11", "anyio", "sniffio", "certifi", "idna", "pydantic", "pydantic-core",
    "typing-extensions", "annotated-types", "typing-inspection", "pip", "setuptools",
}


def run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, cwd=cwd, timeout=600)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def test_the_sdk_installs_into_an_empty_venv_with_only_httpx_and_pydantic_and_imports(tmp_path):
    wheels = tmp_path / "wheels"
    # Its dependencies fetched the way this machine's pip is set up (a local index here), then
    # installed with no index at all: nothing else can come along.
    run(sys.executable, "-m", "pip", "download", "--quiet", "--dest", wheels, "httpx", "pydantic", "setuptools>=61")
    venv.create(tmp_path / "agent", with_pip=True)
    python = tmp_path / "agent" / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", wheels, PROJECT_ROOT / "sdk")
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(run(python, "-m", "pip", "list",
                                                                           "--format", "json"))}
    assert installed <= ALLOWED, installed - ALLOWED
    shown = run(python, "-c", "import importlib.util as u, signoff_sdk; "
                "print([m for m in ('services', 'shared', 'signoff', 'cryptography') if u.find_spec(m)]); "
                "print(signoff_sdk.Client.__name__, signoff_sdk.Denied.__name__)", cwd=tmp_path)
    assert shown.splitlines() == ["[]", "Client Denied"]
