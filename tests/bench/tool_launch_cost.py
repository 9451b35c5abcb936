"""What a python tool call costs started by the tool launcher, against the executor's
own direct spawn (notes/spawner.md), each with its fork server and with a fresh
interpreter per call (SIGNOFF_TOOL_FORK_SERVER, notes/forksrv.md): `read_clock`
through `run_tool`, 30 sequential calls a run, the median and the CPU the calls cost
(this process's children plus the launcher's, each with its live children: a fork
server and what it reaped), several runs alternating the four ways. Root only (every
way switches to signoff-tools).

    python -m tests.bench.tool_launch_cost [RUNS]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from services.tool_executor.tools import ToolContext, run_tool
from shared.catalogue import PythonImplementation, ToolSpec
from shared.settings import PROJECT_ROOT

CALLS = 30
SPEC = ToolSpec(name="read_clock", label="clock", effect="read",
                implementation=PythonImplementation(function="services.tool_executor.builtin:read_clock"))


def cpu_of(pid: int, *, own: bool = True) -> float:
    """User plus system CPU seconds of a live process and of its reaped children, from
    /proc, and of its live children likewise (a fork server); without `own`, only its
    children's (this process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # utime, stime, cutime, cstime: fields 14-17 (1-based), here 11-14 after the name.
    total = sum(int(v) for v in fields[11 if own else 13:15]) / ticks
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                child = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(child[1]) == pid:
                total += cpu_of(int(entry))
    return total


async def run(launcher: Path | None, folder: Path) -> tuple[float, float]:
    context = ToolContext("c", "s", "i", 1, folder)
    times = []
    for _ in range(CALLS):
        started = time.perf_counter()
        result = await run_tool(SPEC, {}, context, None, launcher)  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
        assert result.outcome == "output", result.error
    return statistics.median(times), statistics.mean(times)


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 3
    base = Path(tempfile.mkdtemp(prefix="launch-cost-"))
    launchers = {}
    for forked in (True, False):
        socket = base / f"run-{forked}" / "launcher.sock"
        launchers[forked] = socket, subprocess.Popen(
            [sys.executable, "-m", "services.operations.tool_launcher", "--socket", str(socket), "--client", "0",
             "--tools-dir", str(base / "tools")], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "SIGNOFF_TOOL_FORK_SERVER": str(forked).lower()})
        stdout = launchers[forked][1].stdout
        assert stdout is not None and json.loads(stdout.readline())["message"].startswith("tool-launcher ready")
    folder = base / "direct"
    ways = [(f"{where} {'forked' if forked else 'fresh'}", forked, launchers[forked][0] if where == "launcher" else None)
            for where in ("direct", "launcher") for forked in (True, False)]
    try:
        for _, forked, path in ways:  # warm the page cache (and start the fork servers)
            os.environ["SIGNOFF_TOOL_FORK_SERVER"] = str(forked).lower()
            asyncio.run(run(path, folder))
        for index in range(runs):
            for way, forked, path in ways:
                os.environ["SIGNOFF_TOOL_FORK_SERVER"] = str(forked).lower()
                load = os.getloadavg()[0]
                before = cpu_of(os.getpid(), own=False) + sum(cpu_of(p.pid) for _, p in launchers.values())
                median, mean = asyncio.run(run(path, folder))
                after = cpu_of(os.getpid(), own=False) + sum(cpu_of(p.pid) for _, p in launchers.values())
                cpu = after - before
                print(f"run {index + 1} {way:15s} median {median * 1000:6.1f} ms  mean {mean * 1000:6.1f} ms  "
                      f"CPU {cpu / CALLS * 1000:5.1f} ms/call  (load {load:.1f})", flush=True)
    finally:
        for _, launcher in launchers.values():
            launcher.send_signal(signal.SIGTERM)
            launcher.wait(10)
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
