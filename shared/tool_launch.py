"""Who python tools run as, and how the executor asks a tool launcher to start one.

A python tool is untrusted (docs/design.md, "Trust boundaries"): it must never run
as the executor's user, which can read the executor's broker, database and Redis
passwords. When the executor is root it starts the tool's process itself and the
process becomes TOOLS_USER. When it is not (under `signoff up` as root it is
`signoff-tool-executor`; in the image it is `signoff`), a tool launcher
(services/operations/tool_launcher.py), a small root process holding no credential of
Signoff's, starts the process as TOOLS_USER for it.

The protocol, on a SOCK_SEQPACKET Unix socket (one message a record):

1. The executor connects; the launcher takes only its user (SO_PEERCRED), and the
   executor takes only a launcher that is root.
2. The executor sends one `LaunchRequest` with exactly three descriptors: the read
   end of the tool's stdin pipe and the write ends of its stdout and stderr pipes
   (SCM_RIGHTS). It keeps the other ends and writes the call on stdin itself: the
   call's arguments and the tool's declared secrets never pass through the launcher.
3. The launcher answers `Started` (the process runs, as TOOLS_USER, in a process
   group of its own) or `Refused` (nothing ran, and why); later `Exited` when the
   process ended, after killing whatever it left in its group.
4. The executor closing its end (or shutting down its writing) at any time kills
   the tool's whole process group: a timeout, an answer too large, the executor's
   own death. The executor cannot signal another user's processes itself.
"""

from __future__ import annotations

import pwd
import re
import subprocess
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, StringConstraints, TypeAdapter, field_validator

# Who python tools run as: a user that owns nothing of Signoff's.
TOOLS_USER = "signoff-tools"
# The largest request or answer: a request is a few variables' names and values.
MESSAGE_BYTES = 16 * 1024
# What the tool's process is started with besides HOME (the launcher's tools folder):
# what any program expects to find, never a secret (those come on its stdin).
PASSED_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


def tool_data_dir(data_dir: Path) -> Path:
    """The python tools' folder in a deployment's data folder (their `context.data_dir`):
    theirs alone, apart from the keys, the ledger file and the logs; the launcher hands it
    to TOOLS_USER."""
    return data_dir / "tools"


class ToolUserMissing(Exception):
    pass


def tools_account() -> tuple[int, int]:
    """(uid, gid) of TOOLS_USER, made if missing (a system user with no home and no
    shell): only root can make it. Never root."""
    try:
        entry = pwd.getpwnam(TOOLS_USER)
    except KeyError:
        made = subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                TOOLS_USER,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        try:  # made now, or by another process meanwhile
            entry = pwd.getpwnam(TOOLS_USER)
        except KeyError:
            raise ToolUserMissing(
                f"python tools never run as root, and the user {TOOLS_USER!r} could not be made: "
                f"{made.stderr.strip()[:200]}"
            ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ToolUserMissing(f"the user {TOOLS_USER!r} is root's; python tools never run as root")
    return entry.pw_uid, entry.pw_gid


# A value any program may be started with: no NUL (it would end the value), bounded.
EnvironmentValue = Annotated[str, StringConstraints(max_length=4096, pattern=r"^[^\x00]*$")]


class LaunchRequest(BaseModel):
    """Start one python tool's process. Nothing else can be asked: not the user (always
    TOOLS_USER), not the program (always tool_process), not the folder (the launcher's
    tools folder), not a variable beyond PASSED_ENVIRONMENT."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launch: Literal["python-tool"]
    environment: dict[str, EnvironmentValue]

    @field_validator("environment")
    @classmethod
    def _only_plain_variables(cls, environment: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(environment) - set(PASSED_ENVIRONMENT))
        if unknown:
            # Names only, and only if they look like names: a refusal never echoes a value.
            shown = [name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name) else "(not a name)" for name in unknown]
            raise ValueError(f"a tool's process is started with only {', '.join(PASSED_ENVIRONMENT)}; not {shown}")
        return environment


class Started(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    started: Literal[True] = True


class Refused(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    refused: Annotated[str, StringConstraints(max_length=1000)]


class Exited(BaseModel):
    """How the process ended, as `subprocess` says it: negative for a signal."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    exited: int


Answer = TypeAdapter(Started | Refused | Exited)
