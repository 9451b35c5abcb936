"""The proxy's configuration file (`proxy.yaml`): the upstream servers, each tool's
policy, the limits, and the Signoff gateway that `ask` calls are filed with. It names
credentials only by reference (`${env:NAME}`, `${key:NAME}`): it holds no secret."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal

import rfc8785
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from shared.catalogue import McpServer

Policy = Literal["allow", "ask", "deny"]
# Between an upstream's name and its tool's, when the proxy fronts several servers.
SEPARATOR = "__"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,31}$")


class UpstreamConfig(McpServer):
    """One server the proxy fronts: how to reach it, and the operator's word per tool.
    A tool the file does not name asks (`unnamed: ask`), or is refused (`unnamed: deny`);
    never allowed: a tool that appears on the server later has nobody's word for it."""

    tools: dict[str, Policy] = Field(default_factory=dict)
    unnamed: Literal["ask", "deny"] = "ask"
    # What its tools are called downstream: `<prefix><tool>`. Default: none when the proxy
    # fronts one server, `<name>__` when several (two servers may both have `read_file`).
    prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{0,32}$")

    def policy(self, tool: str) -> Policy:
        return self.tools.get(tool, self.unnamed)


class SignoffConfig(BaseModel):
    """Where `ask` calls are filed: the gateway, the program's API token (a reference),
    and the origin the operator declared for this proxy in the catalogue."""

    model_config = ConfigDict(extra="forbid")
    gateway: str = Field(pattern=r"^https?://")
    token: str
    origin: str = Field(pattern=r"^mcp:[A-Za-z0-9._-]{1,64}$")
    # How long one `tools/call` is held open while a person decides, before the client is
    # told to call again (a desktop host gives up on a call after a minute or so).
    wait_seconds: float = Field(default=50, gt=0, le=3600)
    # The inbox's address, where the user is told the card opens (default: the gateway's `/inbox`).
    inbox: str | None = None

    @field_validator("token")
    @classmethod
    def _a_reference(cls, token: str) -> str:
        if not re.fullmatch(r"\$\{(env|key):[A-Za-z_][A-Za-z0-9_.-]*\}", token.strip()):
            raise ValueError("write the token as a reference (`${env:NAME}` or `${key:NAME}`), never its value")
        return token


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # A call whose arguments (as JSON) are larger is refused before anything is filed or sent.
    max_argument_bytes: int = Field(default=256_000, gt=0)
    # A result larger than this is refused (a typed tool error), never relayed.
    max_result_bytes: int = Field(default=1_000_000, gt=0)


class ProxyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    upstreams: dict[str, UpstreamConfig] = Field(min_length=1)
    signoff: SignoffConfig | None = None
    limits: Limits = Limits()
    # Where the keys folder is, for `${key:NAME}` (its `mcp/` files); default: SIGNOFF_KEYS_DIR.
    keys_dir: Path | None = None

    @model_validator(mode="after")
    def _names_and_prefixes(self) -> ProxyConfig:
        for name in self.upstreams:
            if not _NAME.fullmatch(name):
                raise ValueError(f"upstream {name!r}: a name is letters, digits and '-', up to 32")
        for name, upstream in self.upstreams.items():
            if upstream.prefix is None:
                upstream.prefix = "" if len(self.upstreams) == 1 else f"{name}{SEPARATOR}"
        prefixes = [u.prefix for u in self.upstreams.values()]
        if len(self.upstreams) > 1 and ("" in prefixes or len(set(prefixes)) != len(prefixes)):
            raise ValueError("several upstreams need distinct, non-empty prefixes")
        return self


# Where a client may name its own call (`_meta`), to make a new call of identical arguments.
CLIENT_CALL_ID = "signoff/call_id"


def call_id_for(origin: str, tool: str, arguments: dict[str, Any], client_call_id: str | None) -> str:
    """The caller's call id the proxy files an `ask` call under. MCP gives a call no
    identity (the JSON-RPC id changes on every retry), so it is derived from what the call
    is: the origin, the tool as offered, the arguments in canonical JSON (RFC 8785), and
    the client's own `_meta["signoff/call_id"]` when it sends one. A retry of the same call
    finds the same request; a client that means a new call of the same arguments sends
    its own id."""
    material = rfc8785.dumps([origin, tool, arguments, client_call_id or ""])
    return "mcp-" + hashlib.sha256(material).hexdigest()[:40]


def load_config(path: Path) -> ProxyConfig:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"mcp-proxy: no configuration file {path}") from None
    except yaml.YAMLError as error:
        raise SystemExit(f"mcp-proxy: {path} is not YAML: {error}") from None
    try:
        return ProxyConfig.model_validate(data or {})
    except ValidationError as error:
        # Without the input values: a credential written in the file by mistake is not repeated.
        said = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(file)'}: {e['msg']}" for e in error.errors(include_input=False)
        )
        raise SystemExit(f"mcp-proxy: {path}: {said}") from None
