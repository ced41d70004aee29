"""Host memory settings for FSDP on CPU: torch's transparent huge pages and glibc's mmap threshold
([Note: CPU memory under FSDP] in fullshard/strategies/cpu_memory.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from fullshard.strategies import cpu_memory
from fullshard.strategies.cpu_memory import (
    THP_VARIABLE,
    huge_pages_problem,
    kernel_thp_mode,
    set_up_cpu_memory,
)


def _python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter whose environment lacks THP_MEM_ALLOC_ENABLE unless given."""
    environment = {k: v for k, v in os.environ.items() if k != THP_VARIABLE}
    environment.update(env)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(sys.platform != "linux", reason="torch reads THP_MEM_ALLOC_ENABLE on Linux only")
def test_fsdp_strategies_ask_torch_for_huge_pages_unless_the_user_chose() -> None:
    script = """
import os
import fullshard
from fullshard.strategies import DDPStrategy, FSDP2Strategy, FSDPStrategy
seen = [os.environ.get("THP_MEM_ALLOC_ENABLE")]  # importing changes nothing: DDP keeps torch's default
for make in (FSDPStrategy, FSDP2Strategy, lambda: FSDPStrategy(cpu_mmap_threshold=None), DDPStrategy):
    os.environ.pop("THP_MEM_ALLOC_ENABLE", None)
    make()
    seen.append(os.environ.get("THP_MEM_ALLOC_ENABLE"))
os.environ["THP_MEM_ALLOC_ENABLE"] = "0"  # the user's choice stays
FSDPStrategy()
seen.append(os.environ["THP_MEM_ALLOC_ENABLE"])
print(seen)
"""
    # cpu_mmap_threshold=None: glibc's heap, where huge pages would cost time
    assert _python(script) == str([None, "1", "1", None, None, "0"])


def test_kernel_mode_is_the_bracketed_word(tmp_path: Path) -> None:
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert kernel_thp_mode(setting) == "madvise"
    assert kernel_thp_mode(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "has no transparent huge pages"),
        ("always madvise [never]\n", "reads [never]"),
        ("[always] madvise never\n", None),
    ],
)
def test_problem_named_from_the_kernel_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, expected: str | None
) -> None:
    monkeypatch.setenv(THP_VARIABLE, "1")
    setting = tmp_path / "enabled"
    if content is not None:
        setting.write_text(content)
    problem = huge_pages_problem(setting)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem and str(setting) in problem


def test_users_opt_out_is_not_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(THP_VARIABLE, "0")
    assert huge_pages_problem(tmp_path / "missing") is None


@pytest.mark.skipif(kernel_thp_mode() != "madvise", reason="needs transparent huge pages in madvise mode")
def test_probe_tells_whether_torch_saw_the_setting_in_time() -> None:
    probe = (
        "from fullshard.strategies.cpu_memory import fix_malloc_mmap_threshold, huge_pages_problem\n"
        "fix_malloc_mmap_threshold(128 * 1024)\n"
        "print(huge_pages_problem())\n"
    )
    strategy = "import fullshard\nfullshard.strategies.FSDPStrategy()\n"
    assert _python("import torch\n" + strategy + "x = torch.ones(4 << 20)\n" + probe) == "None"
    late = _python("import torch\nx = torch.ones(4 << 20)\n" + strategy + probe)
    assert "a CPU tensor of 2 MiB or more was made before the FSDP strategy was created" in late


def test_setup_warns_once_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    thresholds: list[int] = []
    monkeypatch.setattr(cpu_memory, "fix_malloc_mmap_threshold", thresholds.append)
    monkeypatch.setattr(cpu_memory, "huge_pages_problem", lambda: "the reason")
    with pytest.warns(UserWarning, match=r"cpu_mmap_threshold=131072.*the reason.*THP_MEM_ALLOC_ENABLE=1"):
        set_up_cpu_memory(128 * 1024)
    assert thresholds == [128 * 1024]
    monkeypatch.setattr(cpu_memory, "huge_pages_problem", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no problem, no warning
        set_up_cpu_memory(64 * 1024)
        set_up_cpu_memory(None)  # glibc as it is: nothing to fix, nothing to check
    assert thresholds == [128 * 1024, 64 * 1024]
