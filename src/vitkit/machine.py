"""What this machine offers a run: memory left, usable cores, what the CPU says of itself, native bf16 on
the CPU, and which of a torchrun job's processes on it is the first."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Dict, Optional


def available_memory() -> Optional[int]:
    """Bytes of memory this process can still use: the smaller of the system's available memory
    and the cgroup's limit left (None where neither can be read)."""
    found = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            found.append(max(int(limit) - used, 0))
    if not found:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(found) if found else None


def launcher_number(name: str, default: int, least: int = 0) -> int:
    """The whole number a launcher's variable ``name`` holds (WORLD_SIZE, LOCAL_RANK), ``default`` where it is unset;
    another value is one line naming the variable (int() said only "invalid literal for int() with base 10")."""
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise ValueError(f"the environment variable {name} must be a whole number of at least {least} (torchrun "
                         f"sets it), not {value!r}")
    return number


def under_torchrun() -> bool:
    """A process of a torchrun job (its WORLD_SIZE and LOCAL_RANK; another launcher's WORLD_SIZE alone is not)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("LOCAL_RANK", "").isdigit()
    except ValueError:
        return False


def first_process_on_machine() -> bool:
    """Not a torchrun process, or its machine's first (LOCAL_RANK 0): the one that says, and checks, what every
    process of the machine would."""
    return not under_torchrun() or os.environ.get("LOCAL_RANK") == "0"


def first_process_alive() -> bool:
    """Under torchrun, whether this machine's first process (a sibling with LOCAL_RANK 0) still runs: one killed
    outright says nothing, so what it would have said falls to the others. True where that cannot be told."""
    if first_process_on_machine():
        return True
    parent, me = os.getppid(), os.getpid()
    try:
        entries = [e for e in Path("/proc").iterdir() if e.name.isdigit() and int(e.name) != me]
    except OSError:  # no /proc (not Linux)
        return True
    for entry in entries:
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            environ = (entry / "environ").read_bytes()
        except (OSError, ValueError):  # (gone meanwhile)
            continue
        if int(ppid) == parent and state != "Z" and b"\0LOCAL_RANK=0\0" in b"\0" + environ:
            return True
    return False


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity; every core where that is unknown)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def cpu_info(path: str = "/proc/cpuinfo") -> Dict[str, str]:
    """The first processor's fields of Linux's /proc/cpuinfo (``vendor_id``, ``cpu family``, ``model``,
    ``model name``, ``flags`` ...; empty elsewhere): what tells a Zen 1 from a Zen 3 where the flags and a VM's
    name ("AMD EPYC") are the same."""
    fields: Dict[str, str] = {}
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block ends
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    return fields


def native_bf16_cpu() -> bool:
    """Whether this CPU runs bf16 matrix products natively (AVX-512 BF16 or AMX), by oneDNN's own
    probe. Elsewhere torch emulates bf16, many times slower than fp32: choose fp32 there."""
    import torch

    try:  # a private API, so guarded
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
