"""The machine a run's numbers came from. Float kernels round differently on different CPUs (AVX-512, AVX2,
SSE4.1 paths) and a GAN or a few training steps turn that rounding into another run: one seed of Table 2's
Centralized scored Dice 75.99 through this host's AVX-512 kernels and 79.57 through its AVX2 ones. A summary
and a result file therefore say which CPU and which kernel path made them, so a number that does not repeat
elsewhere can be told from one that changed with the code."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedistill import devices

#: How a result file names runs whose summaries predate this record.
NOT_RECORDED = "not recorded"


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> dict[str, Any]:
    """What a summary records: the CPU, its core count, the ATen kernel path in use (`ATEN_CPU_CAPABILITY`
    can lower it), oneDNN's ISA cap when one is set, and the GPU when the run's device is one."""
    found: dict[str, Any] = {
        "cpu": cpu_name(),
        "cpus": os.cpu_count() or 1,
        "kernels": torch.backends.cpu.get_cpu_capability(),
    }
    if os.environ.get("ONEDNN_MAX_CPU_ISA"):
        found["onednn_max_isa"] = os.environ["ONEDNN_MAX_CPU_ISA"]
    if devices.current().type == "cuda":
        found["gpu"] = torch.cuda.get_device_name(devices.current())
    return found


def describe(found: Mapping[str, Any] | None) -> str:
    """One line for a record: `Intel(R) Xeon(R) Processor, 2 CPUs, AVX512 kernels` (+ oneDNN cap, GPU)."""
    if not found:
        return NOT_RECORDED
    parts = [str(found.get("cpu", "unknown CPU")), f"{found.get('cpus', '?')} CPUs",
             f"{found.get('kernels', '?')} kernels"]  # fmt: skip
    if found.get("onednn_max_isa"):
        parts.append(f"oneDNN capped at {found['onednn_max_isa']}")
    if found.get("gpu"):
        parts.append(str(found["gpu"]))
    return ", ".join(parts)


def this_machine(threads: int | None = None) -> str:
    """`describe` of the machine running now, with the torch version and, when given, the thread count: what
    a result measured in this process names."""
    extra = [f"{threads} thread(s)"] if threads else []
    return ", ".join([describe(machine()), *extra, f"torch {torch.__version__}"])


def joined(descriptions: Iterable[str]) -> str:
    """`describe` lines of several runs, each once in order: a record built from runs of two machines says
    so."""
    seen: list[str] = []
    for line in descriptions:
        if line not in seen:
            seen.append(line)
    return "; ".join(seen) if seen else NOT_RECORDED


def of_summary(summary: Mapping[str, Any]) -> str:
    """The machine a run's summary names; a run resumed on another machine names each, in order."""
    history = summary.get("machine_history")
    return " then ".join(history) if history else describe(summary.get("machine"))


def of_summaries(summaries: Iterable[Mapping[str, Any]]) -> str:
    """The machines a set of runs' summaries came from (`joined`)."""
    return joined(of_summary(summary) for summary in summaries)


def history_after(history: Iterable[str], found: Mapping[str, Any]) -> list[str]:
    """The machines a run has run on, `found` (this start's) added unless it is the last one already: a
    checkpoint carries the list, so a run resumed elsewhere keeps where each part of it ran."""
    return appended(list(history), describe(found))


def appended(history: list[str], now: str) -> list[str]:
    """`history` (what a checkpoint carries: the machines or code fingerprints a run has run on) with this
    start's `now` added, unless it is the last one already."""
    return history if history and history[-1] == now else [*history, now]


def of_rows(rows: Iterable[Mapping[str, Any]]) -> str:
    """The machines a result file's rows name (each row's `machine`, a `describe` line), `joined`."""
    return joined(row.get("machine", NOT_RECORDED) for row in rows)
