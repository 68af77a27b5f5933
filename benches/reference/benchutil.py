"""Measurement helpers shared by the reference benchmark scripts.

Memory is read the same way the Rust engine reads it, so the two columns compare like with like:
``VmHWM`` (peak resident set) and ``VmRSS`` from ``/proc/self/status``. Writing ``5`` to
``/proc/self/clear_refs`` resets ``VmHWM`` to the current RSS (Linux >= 4.0), which lets a script
measure the peak of the timed steps alone, separately from the peak of loading.
"""
from __future__ import annotations

import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> float | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb() -> float | None:
    kb = _status_kb("VmRSS")
    return None if kb is None else kb / 1024.0


def peak_rss_mb() -> float | None:
    kb = _status_kb("VmHWM")
    return None if kb is None else kb / 1024.0


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


# glibc's mallopt parameter and the threshold the engine pins too (daemon/src/bench/memory.rs).
_M_MMAP_THRESHOLD = -3
_LIVE_MMAP_THRESHOLD = 64 * 1024


def follow_live_allocations() -> bool:
    """Makes the resident set follow live allocations from here on, exactly as the engine does:
    glibc's mmap threshold pinned low, free heap pages handed back. Lasts for the rest of the
    process and slows large allocations, so it is for the last, untimed phase. False where the C
    library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        pinned = libc.mallopt(_M_MMAP_THRESHOLD, _LIVE_MMAP_THRESHOLD) == 1
        libc.malloc_trim(0)
        return pinned
    except (OSError, AttributeError):
        return False


def live_step_mb(step, steps: int) -> float | None:
    """Peak live memory of ``steps`` more calls of ``step()``, MiB: the peak resident set above
    the resident set right before them, once it follows live allocations. Counts neither what
    the allocator kept from earlier steps nor one-time initialisation (done in warmup)."""
    if steps <= 0 or not follow_live_allocations():
        return None
    start = rss_mb()
    if start is None or not reset_peak_rss():
        return None
    for _ in range(steps):
        step()
    peak = peak_rss_mb()
    return None if peak is None else max(peak - start, 0.0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Wall-clock and process CPU milliseconds of a block, synchronising the device on both ends."""

    def __init__(self, device: torch.device):
        self.device = device
        self.ms = 0.0
        self.cpu_ms = 0.0

    def __enter__(self):
        sync(self.device)
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.ms = (time.perf_counter() - self._t0) * 1e3
        self.cpu_ms = (time.process_time() - self._c0) * 1e3
        return False


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def set_threads(n: int | None) -> int:
    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def compare_to(result: dict, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Records how far our output is from the engine's (``max_abs_diff``, ``rel_l2_diff``)."""
    diff = ours - theirs
    result["max_abs_diff"] = float(diff.abs().max())
    result["rel_l2_diff"] = float(diff.norm() / theirs.norm().clamp(min=1e-30))


def finish(result: dict) -> int:
    """Emits the result and returns the exit code; the process peak is the larger of the load
    and the timed phases (VmHWM was reset between them)."""
    peaks = (result.get("load_peak_rss_mb"), result.get("step_peak_rss_mb"), peak_rss_mb(), 0.0)
    result["peak_rss_mb"] = max(x for x in peaks if x is not None)
    emit(result)
    return 0 if "error" not in result else 1


def emit(obj: dict) -> None:
    """The result is the LAST line of stdout, one JSON object (the Rust harness reads it)."""
    sys.stdout.flush()
    print(json.dumps(obj, allow_nan=False, default=_json_default), flush=True)


def _json_default(x):
    if isinstance(x, float):
        return None
    if isinstance(x, torch.Tensor):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x)}")


def finite_or_none(x: float | None) -> float | None:
    if x is None:
        return None
    return x if x == x and abs(x) != float("inf") else None


def cuda_memory(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    return {
        "cuda_max_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20,
        "cuda_max_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20,
    }
