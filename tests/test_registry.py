"""The strategy registry: names, defaults, duplicates, unknown names and entry points."""

from __future__ import annotations

import importlib.metadata
import sys
import textwrap
from pathlib import Path

import pytest

import fullshard
from fullshard.errors import StrategyRegistryError
from fullshard.strategies import STRATEGY_REGISTRY, DDPStrategy, SingleDeviceStrategy, StrategyRegistry


def test_builtin_names_are_registered() -> None:
    assert {"single_device", "ddp", "ddp_spawn"} <= set(STRATEGY_REGISTRY.available())
    assert isinstance(STRATEGY_REGISTRY.get("single_device"), SingleDeviceStrategy)
    spawn = STRATEGY_REGISTRY.get("ddp_spawn")
    assert isinstance(spawn, DDPStrategy) and spawn.start_method == "spawn"
    assert STRATEGY_REGISTRY.get("ddp").start_method == "popen"
    assert "torch.multiprocessing" in STRATEGY_REGISTRY.describe()["ddp_spawn"]


def test_register_with_default_arguments_and_override() -> None:
    registry = StrategyRegistry()
    registry.register("mine", DDPStrategy, "my ddp", find_unused_parameters=True)
    built = registry.get("mine")
    assert isinstance(built, DDPStrategy) and built.ddp_kwargs == {"find_unused_parameters": True}
    assert registry.get("mine", find_unused_parameters=False).ddp_kwargs == {"find_unused_parameters": False}
    with pytest.raises(
        StrategyRegistryError, match=r"'mine' is already registered \(by DDPStrategy\).*override=True"
    ):
        registry.register("mine", SingleDeviceStrategy)
    registry.register("mine", SingleDeviceStrategy, override=True)
    assert isinstance(registry.get("mine"), SingleDeviceStrategy)


def test_unknown_name_lists_available() -> None:
    with pytest.raises(
        StrategyRegistryError,
        match=r"Unknown strategy 'dpp'\. Did you mean 'ddp'\? Available strategies: .*ddp.*single_device",
    ):
        STRATEGY_REGISTRY.get("dpp")
    with pytest.raises(StrategyRegistryError, match="Unknown strategy 'dpp'"):
        fullshard.Trainer(accelerator="cpu", strategy="dpp")


@pytest.mark.parametrize(
    ("given", "nearest"), [("fdsp", "fsdp"), ("FSDP2", "fsdp2"), ("ddp-spawn", "ddp_spawn")]
)
def test_unknown_name_suggests_the_nearest(given: str, nearest: str) -> None:
    with pytest.raises(
        StrategyRegistryError, match=rf"Unknown strategy '{given}'\. Did you mean '{nearest}'\?"
    ):
        fullshard.Trainer(accelerator="cpu", strategy=given)


def test_unknown_name_far_from_every_name_gets_no_suggestion() -> None:
    with pytest.raises(StrategyRegistryError, match=r"Unknown strategy 'horovod'\. Available strategies: "):
        STRATEGY_REGISTRY.get("horovod")


def test_entry_point_registers_a_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "thirdparty_strategy.py"
    package.write_text(
        textwrap.dedent("""
        from fullshard.strategies import SingleDeviceStrategy

        class ThirdPartyStrategy(SingleDeviceStrategy):
            strategy_name = "third_party"

            @classmethod
            def register_strategies(cls, registry):
                registry.register("third_party", cls, description="from an installed package")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.metadata.EntryPoint(
        name="third_party",
        value="thirdparty_strategy:ThirdPartyStrategy.register_strategies",
        group="fullshard.strategies",
    )

    def fake_entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
        return [entry] if group == "fullshard.strategies" else []

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    registry = StrategyRegistry()
    assert registry.load_entry_points() == ["third_party"]
    strategy = registry.get("third_party")
    assert type(strategy).__name__ == "ThirdPartyStrategy"
    assert registry.describe() == {"third_party": "from an installed package"}
    sys.modules.pop("thirdparty_strategy", None)


def test_entry_point_that_is_not_callable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bad_ep.py").write_text("NOT_CALLABLE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.metadata.EntryPoint(
        name="bad", value="bad_ep:NOT_CALLABLE", group="fullshard.strategies"
    )
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [entry])
    with pytest.raises(StrategyRegistryError, match="'bad_ep:NOT_CALLABLE', which is not callable"):
        StrategyRegistry().load_entry_points()
    sys.modules.pop("bad_ep", None)
