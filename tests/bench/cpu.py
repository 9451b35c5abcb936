"""CPU: of each service process and of the dependencies (from /proc), and py-spy
profiles of the services during one level (`--profile DIR`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.harness import Deployment

CLK_TCK = os.sysconf("SC_CLK_TCK")
DEPENDENCIES = ("postgres", "beam.smp", "redis-server")
SHORT = {"approval-ledger": "ledger", "publisher": "publisher", "model-step": "model", "tool-executor": "executor",
         "gateway": "gateway"}
# Processes that answer SIGUSR1 with their SQL counts (shared/runtime.py); the gateway (uvicorn) does not.
COUNTS_SQL = ("approval-ledger", "publisher", "model-step", "tool-executor")


def process_cpu(pid: int, *, children: bool = False) -> float | None:
    """utime + stime of one process, in seconds; with `children`, instead cutime + cstime:
    what its children that ended and were reaped cost (the executor's python tool processes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / CLK_TCK


def dependency_cpu() -> dict[str, dict[int, float]]:
    """CPU of every postgres / beam.smp / redis-server process on the machine, by pid."""
    found: dict[str, dict[int, float]] = {name: {} for name in DEPENDENCIES}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in found:
            cpu = process_cpu(int(entry))
            if cpu is not None:
                found[comm][int(entry)] = cpu
    return found


def dependency_cpu_delta(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
    """Processes that ended in between are lost; new ones count from zero."""
    return {name: sum(cpu - before[name].get(pid, 0.0) for pid, cpu in after[name].items()) for name in after}


def service_cpu(deployment: Deployment) -> dict[str, float]:
    return {name: process_cpu(p.pid) or 0.0 for name, p in deployment.processes.items()}


def children_cpu(deployment: Deployment) -> float:
    """What the services' children cost, which their parents' own figures leave out: the
    executor's python tool processes (one per call) and its fork server. The ended ones as
    their parents' cutime + cstime; the live ones (a fork server lives as long as the
    executor) as their own CPU and their own reaped children's (the calls it forked):
    when one ends and is reaped, that whole sum moves into its parent's cutime, so the
    total only grows and a difference between two readings counts everything once."""
    services = {p.pid for p in deployment.processes.values()}
    total = sum(process_cpu(pid, children=True) or 0.0 for pid in services)
    for pid, parent in live_processes():
        if parent in services:
            total += (process_cpu(pid) or 0.0) + (process_cpu(pid, children=True) or 0.0)
    return total


def live_processes() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:
            continue
        found.append((int(entry), int(data[data.rindex(")") + 2:].split()[1])))
    return found


def find_py_spy() -> str | None:
    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


def start_profilers(deployment: Deployment, directory: Path, seconds: float) -> list[subprocess.Popen]:
    """py-spy on every service for one level (100 Hz; --nonblocking gave garbled stacks here)."""
    py_spy = find_py_spy()
    directory.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [py_spy, "record", "--pid", str(p.pid), "--rate", "100", "--format", "raw",
             "--duration", str(max(1, int(seconds))), "--output", str(directory / f"{name}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for name, p in deployment.processes.items()
    ]


# Leaf frames of a thread that waits: py-spy's idle detection misses some of them in this VM.
IDLE_LEAVES = ("EpollSelector.select ", "Condition.wait ", "_worker (futures/thread.py)", "Event.wait ",
               "Thread._wait_for_tstate_lock ", "Queue.get ")


def summarize_profile(path: Path, top: int = 25) -> str:
    """Self and inclusive sample shares per function from a py-spy raw (collapsed) file,
    samples whose leaf frame is a wait left out."""
    self_samples: Counter = Counter()
    inclusive: Counter = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        if frames[-1].startswith(IDLE_LEAVES):
            idle += n
            continue
        total += n
        self_samples[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    out = [f"{path.stem}: {total} busy samples ({idle} waiting samples left out)"]
    total = max(total, 1)
    out.append("  self %   function")
    for frame, n in self_samples.most_common(top):
        out.append(f"  {100 * n / total:5.1f}   {frame}")
    out.append("  incl %   function")
    for frame, n in inclusive.most_common(top * 2):
        out.append(f"  {100 * n / total:5.1f}   {frame}")
    return "\n".join(out)


def _frame(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)" keeps functions, not lines, apart
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    parts = where.split("/")
    if "site-packages" in parts:
        where = "/".join(parts[parts.index("site-packages") + 1:])
    elif len(parts) > 2:
        where = "/".join(parts[-2:])
    return f"{name} ({where})"


async def statement_counts(deployment: Deployment, timeout: float = 5.0) -> dict[str, dict[str, int]]:
    """SQL each service sent so far (shared/ledger/database.py STATEMENT_COUNTS): asked
    for with SIGUSR1, read from <data_dir>/stats/<service>-<pid>.json."""
    import asyncio
    import json
    import signal
    import time

    asked = time.time()
    paths = {}
    for name, process in deployment.processes.items():
        if process.poll() is None and name.split("#")[0] in COUNTS_SQL:
            process.send_signal(signal.SIGUSR1)
            paths[name] = deployment.data_dir / "stats" / f"{name.split('#')[0]}-{process.pid}.json"
    counts: dict[str, dict[str, int]] = {}
    while paths and time.time() < asked + timeout:
        for name, path in list(paths.items()):
            try:
                found = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if found.pop("written_at", 0) >= asked:
                counts[SHORT.get(name, name)] = found
                del paths[name]
        await asyncio.sleep(0.01)
    return counts
