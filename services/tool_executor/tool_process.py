"""A python tool's own process: `python -I -S -c "…tool_process import main; main()"`.

The executor starts one per call (`tools.run_tool`) with a clean environment and
writes the call to its stdin as one JSON object; this process answers on its
stdout with one JSON object, `{"output": …}` or `{"error": "…"}`. It holds nothing
of the executor's: no broker, database or Redis URL, password or key, no SIGNOFF_*
setting, no open descriptor, no memory; only the variables the tool declares
(`env:` in the catalogue), which come on stdin, not in the process's environment.

Run by root (as the executor is in CI and under `signoff up` as root), it becomes
the tool's user before it imports the tool: the tool then cannot read the keys,
passwords or ledger file that belong to root. Standard library only at module
level: the start-up of this process is part of every call's latency.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

# What a tool writes to its stdout goes to stderr: stdout carries the result alone.
# Past this many bytes the result is refused rather than held in the executor's memory.
RESULT_BYTES = 64 << 20


class ToolContext(NamedTuple):
    """What a python tool gets besides its arguments."""

    call_id: str
    session_id: str
    # The same on every retry of this call: pass it to any API that deduplicates.
    idempotency_key: str
    attempt: int
    # The tool's own folder, which is also its working directory.
    data_dir: Path


class Call(NamedTuple):
    """Everything the tool's process is told, on its stdin."""

    function: str
    arguments: dict[str, Any]
    context: ToolContext
    # The variables the tool declares, with the executor's values.
    env: dict[str, str]
    # Where the executor imports from, so the tool imports what it would have.
    import_path: list[str]
    # (uid, gid) to become before the tool is imported; None: stay who we are.
    run_as: tuple[int, int] | None

    def encode(self) -> bytes:
        context = self.context
        return json.dumps(
            {
                "function": self.function,
                "arguments": self.arguments,
                "context": {
                    "call_id": context.call_id,
                    "session_id": context.session_id,
                    "idempotency_key": context.idempotency_key,
                    "attempt": context.attempt,
                    "data_dir": str(context.data_dir),
                },
                "env": self.env,
                "import_path": self.import_path,
                "run_as": self.run_as,
            }
        ).encode()


class NoResult(Exception):
    """The tool's process answered with something that is not a result."""


def result_of(stdout: bytes) -> tuple[Any, str | None]:
    """(output, error) from what the tool's process wrote; NoResult for anything else."""
    try:
        answer = json.loads(stdout)
    except (ValueError, RecursionError):
        raise NoResult(f"answered something that is not JSON ({len(stdout)} bytes)") from None
    if isinstance(answer, dict) and set(answer) == {"output"}:
        return answer["output"], None
    if isinstance(answer, dict) and set(answer) == {"error"} and isinstance(answer["error"], str):
        return None, answer["error"]
    raise NoResult("answered neither an output nor an error")


def as_json(value: Any) -> Any:
    """The output as JSON values: it is recorded in the claim row and reported, and a
    value neither can hold (a datetime, a set) would fail the call after it ran."""
    try:
        # NaN and infinities are not JSON (PostgreSQL refuses them): null, as pydantic writes them.
        return json.loads(json.dumps(value, default=repr), parse_constant=lambda _: None)
    except (TypeError, ValueError, RecursionError):  # keys that are not strings, cycles, depth
        return repr(value)[:10_000]


def _private() -> None:
    """No other process of the same user may read this one's memory or environment
    (/proc/<pid>/environ, /proc/<pid>/mem, ptrace): another tool's call runs as the
    same user. Linux only; elsewhere the tool's user is the boundary."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def _become(uid: int, gid: int, import_path: list[str]) -> list[str]:
    """Become the tool's user, keeping the import path reachable: the interpreter and
    its libraries may live where only root may enter (pyenv under /root), so a folder
    the new user cannot reach is kept open first and imported from through
    /proc/self/fd (which a process may always use for itself). Returns the import path."""
    folders = [p for p in dict.fromkeys([*import_path, *sys.path]) if os.path.isdir(p)]
    opened = {p: os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in folders}
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("the tool's process could not become its user")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise SystemExit("the tool's process could become root again")
    moved: dict[str, str] = {}
    for folder, descriptor in opened.items():
        if os.access(folder, os.R_OK | os.X_OK):
            os.close(descriptor)
        else:
            moved[folder] = f"/proc/self/fd/{descriptor}"

    def reachable(path: str) -> str:
        for old, new in moved.items():
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old) :]
        return path

    # Packages already imported find their submodules by their own __path__.
    for module in list(sys.modules.values()):
        package_path = getattr(module, "__path__", None)
        if isinstance(package_path, list):
            package_path[:] = [reachable(p) for p in package_path]
    sys.path[:] = [reachable(p) for p in sys.path]
    sys.path_importer_cache.clear()
    return [reachable(p) for p in import_path]


def _load(path: str) -> Any:
    import importlib

    module, _, name = path.partition(":")
    try:
        found = importlib.import_module(module)
    except ImportError:
        if sys.flags.no_site and "site" not in sys.modules:
            # Started without `site` (-S, `tools._interpreter`): a module that only a `.pth`
            # file makes importable (an editable install's finder) is found once it has run.
            import site

            site.main()
            importlib.invalidate_caches()
            found = importlib.import_module(module)
        else:
            raise
    return getattr(found, name)


def _run(call: dict[str, Any]) -> dict[str, Any]:
    given = call["context"]
    data_dir = Path(given["data_dir"])
    # Out of this user's reach by its name (a parent only root may enter): the tool
    # reaches it as its working directory, which it is.
    if not os.access(data_dir, os.R_OK | os.W_OK | os.X_OK):
        data_dir = Path(os.curdir)
    context = ToolContext(given["call_id"], given["session_id"], given["idempotency_key"], given["attempt"], data_dir)
    try:
        value = _load(call["function"])(call["arguments"], context)
        if hasattr(value, "__await__"):  # an `async def` tool, or one that returns an awaitable
            import asyncio

            async def awaited() -> Any:
                return await value

            value = asyncio.run(awaited())
    except BaseException as error:  # SystemExit too: whatever the tool raises is its result
        return {"error": f"{type(error).__name__}: {error}"}
    return {"output": as_json(value)}


def main() -> None:
    _private()
    call = json.loads(sys.stdin.buffer.read())
    # The result goes out on a copy of stdout; the tool's own prints go to stderr.
    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    import_path = call["import_path"]
    if call["run_as"] is not None:
        uid, gid = call["run_as"]
        import_path = _become(uid, gid, import_path)
    if sys.flags.no_site:
        # Started without `site`: the executor's path in the executor's order (its
        # site-packages after the standard library, as `site` would have put them).
        sys.path[:] = [*import_path, *(p for p in sys.path if p not in import_path)]
    else:
        sys.path[:0] = [p for p in import_path if p not in sys.path]
    os.environ.update(call["env"])
    result = _run(call)
    try:
        data = json.dumps(result).encode()
    except (TypeError, ValueError):
        data = json.dumps({"error": "the tool's output could not be written as JSON"}).encode()
    answer.write(data)
    answer.flush()
