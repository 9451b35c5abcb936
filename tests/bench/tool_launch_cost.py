"""What a python tool call costs started by the tool launcher, against the executor's
own direct spawn (notes/spawner.md): `read_clock` through `run_tool`, 30 sequential
calls a run, the median and the CPU the calls cost (this process's children plus
the launcher's), several runs alternating the two ways. Root only (both ways switch
to signoff-tools).

    python -m tests.bench.tool_launch_cost [RUNS]
"""

from __future__ import annotations

import asyncio
import os
import resource
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


def cpu_of(pid: int) -> float:
    """User plus system CPU seconds of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # utime, stime, cutime, cstime: fields 14-17 (1-based), here 11-14 after the name.
    return sum(int(v) for v in fields[11:15]) / ticks


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
    socket = base / "run" / "launcher.sock"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "services.tool_launcher", "--socket", str(socket), "--client", "0",
         "--tools-dir", str(base / "tools")], cwd=PROJECT_ROOT, stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None and launcher.stdout.readline().startswith("tool-launcher ready")
    folder = base / "direct"
    try:
        asyncio.run(run(None, folder))  # warm the page cache for both
        asyncio.run(run(socket, folder))
        for index in range(runs):
            for way, path in (("direct", None), ("launcher", socket)):
                load = os.getloadavg()[0]
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                launcher_before = cpu_of(launcher.pid)
                median, mean = asyncio.run(run(path, folder))
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
                cpu += cpu_of(launcher.pid) - launcher_before
                print(f"run {index + 1} {way:8s} median {median * 1000:6.1f} ms  mean {mean * 1000:6.1f} ms  "
                      f"CPU {cpu / CALLS * 1000:5.1f} ms/call  (load {load:.1f})", flush=True)
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(10)
        subprocess.run(["rm", "-rf", str(base)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
