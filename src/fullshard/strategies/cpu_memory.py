"""Host memory settings for FSDP on CPU: glibc's mmap threshold and transparent huge pages.

[Note: CPU memory under FSDP]
glibc serves a request of at least the mmap threshold with its own ``mmap``, returned to the system
on ``free``, but raises the threshold to the size of each such block freed (up to 32 MiB). FSDP on
CPU gathers a unit, frees it, gathers the next: after the first free these buffers come from the
heap, between long-lived shards and optimizer state, and the holes they leave stay resident, so the
process grows as if nothing were sharded (benchmarks/cpu_allocator.py: FULL_SHARD's peak about
DDP's). A fixed threshold (``cpu_mmap_threshold``, 128 KiB by default) turns the adjustment off:
every gathered unit, gradient and optimizer temporary is mapped afresh and returned when freed.

The price is paid in page faults: the kernel finds and zeroes every page of every fresh mapping on
first touch, 4 KiB at a time, hundreds of thousands of faults per step on a 100M-parameter model.
With transparent huge pages a fault maps 2 MiB, so the same step takes a few hundred times fewer
faults. torch asks for them (``madvise(MADV_HUGEPAGE)`` on CPU tensors of 2 MiB or more) when
``THP_MEM_ALLOC_ENABLE=1`` is in the environment the first time it makes such a tensor; it reads the
variable then, once. So an FSDP strategy with a fixed threshold sets it when it is created
(:func:`request_huge_pages`; not when it is set already: ``THP_MEM_ALLOC_ENABLE=0`` keeps torch's
default), which is early enough when no tensor of 2 MiB or more exists yet: layers built in
``configure_model`` or with ``empty_init``, and in every process fullshard's launcher starts, which
inherit the variable. On CPU, the FSDP strategies check at setup (:func:`huge_pages_problem`) that
torch's large tensors are in fact eligible for huge pages and say once why not, when they are not.

Only FSDP asks: where large blocks come from glibc's heap (DDP, ``cpu_mmap_threshold=None``),
huge pages do not save faults but cost time (benchmarks/cpu_allocator.py: DDP 13-43% more CPU
per step), so a process that never creates an FSDP strategy keeps torch's default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from pathlib import Path

from fullshard.rank_zero import rank_zero_warn

THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_M_MMAP_THRESHOLD = -3  # mallopt(3) parameter number in glibc's malloc.h
_PROBE_BYTES = 6 * 1024 * 1024  # a tensor that holds at least one aligned 2 MiB page


def check_mmap_threshold(threshold: object) -> int | None:
    """``cpu_mmap_threshold`` as given to an FSDP strategy, checked: bytes (an int > 0) or None."""
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, int) or threshold <= 0
    ):
        from fullshard.errors import MisconfigurationError

        raise MisconfigurationError(
            f"cpu_mmap_threshold={threshold!r} is invalid: use a size in bytes (int > 0, e.g. "
            "128 * 1024) or None to keep glibc's default."
        )
    return threshold


def request_huge_pages() -> None:
    """Ask torch for transparent huge pages for large CPU tensors (Linux only), unless
    ``THP_MEM_ALLOC_ENABLE`` is set already; see [Note: CPU memory under FSDP]."""
    if platform.system() == "Linux":
        os.environ.setdefault(THP_VARIABLE, "1")


def set_up_cpu_memory(threshold: int | None) -> None:
    """What the FSDP strategies do on CPU at setup: fix glibc's mmap threshold at ``threshold``
    bytes (None: leave glibc as it is) and say once when huge pages are not in use."""
    if threshold is None:
        return
    fix_malloc_mmap_threshold(threshold)
    problem = huge_pages_problem()
    if problem is not None:
        rank_zero_warn(
            f"FSDP on CPU maps every gathered unit afresh (cpu_mmap_threshold={threshold}), and without "
            f"transparent huge pages each 4 KiB of it costs a page fault: {problem}. Create the Trainer "
            "before making large tensors (build large layers in configure_model), or start the processes "
            "with THP_MEM_ALLOC_ENABLE=1, for "
            "hundreds of times fewer faults (docs/fsdp/cpu.md); THP_MEM_ALLOC_ENABLE=0 turns this "
            "check off."
        )


def fix_malloc_mmap_threshold(threshold: int) -> bool:
    """Give glibc's malloc a fixed mmap threshold (``mallopt(M_MMAP_THRESHOLD, threshold)``); see
    [Note: CPU memory under FSDP]. Returns False where there is no glibc (other C libraries, other
    systems): nothing is changed there."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold)))


def kernel_thp_mode(setting: Path = THP_SETTING) -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None
    where the system has none."""
    try:
        words = setting.read_text().split()
    except OSError:
        return None
    return next((word[1:-1] for word in words if word.startswith("[")), None)


def huge_pages_problem(setting: Path = THP_SETTING) -> str | None:
    """Why torch's large CPU tensors do not get transparent huge pages in this process, or None
    when they do (or the user turned them off with ``THP_MEM_ALLOC_ENABLE=0``)."""
    if os.environ.get(THP_VARIABLE, "1") in ("0", ""):
        return None
    mode = kernel_thp_mode(setting)
    if mode is None:
        return f"this system has no transparent huge pages ({setting} is missing)"
    if mode == "never":
        return f"transparent huge pages are off on this machine ({setting} reads [never])"
    if mode == "always":
        return None
    import torch

    probe = torch.empty(_PROBE_BYTES, dtype=torch.uint8)
    eligible = _thp_eligible(probe.data_ptr())
    del probe
    if eligible is False:
        return (
            f"torch read {THP_VARIABLE} before fullshard set it: a CPU tensor of 2 MiB or more was made "
            "before the FSDP strategy was created"
        )
    return None


def _thp_eligible(address: int) -> bool | None:
    """The ``THPeligible`` flag of the mapping holding ``address`` in /proc/self/smaps (None:
    not found, or the kernel does not report it)."""
    inside = False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    start, _, end = head.partition("-")
                    inside = int(start, 16) <= address < int(end, 16)
                elif inside and head == "THPeligible:":
                    return line.split()[1] == "1"
    except (OSError, ValueError):
        return None
    return None
