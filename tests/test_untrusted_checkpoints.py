"""A checkpoint from someone else runs no code: every load path unpickles with an allowlist.

Each forged checkpoint holds an object whose unpickling runs ``touch MARKER`` (``os.system``), put
where an attacker who can write the files would put it (see tests/scripts/untrusted_job.py): a
full file's hyperparameters or callback states, a sharded checkpoint's ``meta.pt``, DCP's
``.metadata`` index, or a non-tensor entry of DCP's data (the commit record's sizes and CRC-32s
fixed up). Every load path must refuse it with nothing run, saying what it found, where, and how
to opt in; with the opt-in it loads (and the marker appears: that is what trust means).

One process (single device) unless marked ``multiprocess`` (FSDP on 2 CPU processes).
"""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import pickletools
import re
import shutil
import sys
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fullshard
from ckpt_helpers import Net, assert_same_state, full_state, make_data, run_single
from conftest import SCRIPTS, check_ok, run_script
from fullshard.checkpoint import io as checkpoint_io
from fullshard.checkpoint import trust
from fullshard.checkpoint.archive import archive_entries, verify_full_file
from fullshard.checkpoint.io import load_torch_file
from fullshard.checkpoint.layout import META_NAME, CommitRecord
from fullshard.checkpoint.lightning import loop_state
from fullshard.checkpoint.progress_checks import check_loop_state
from fullshard.checkpoint.tools import consolidate, export_safetensors, inspect, read_sharded, verify
from fullshard.checkpoint.validate import check_optimizer_shapes
from fullshard.cli import main as cli
from fullshard.errors import CorruptCheckpointError, MisconfigurationError, UntrustedCheckpointError

sys.path.insert(0, str(SCRIPTS))
from untrusted_job import SYSTEM, Payload, fix_record, forge_bytes, forge_full, forge_index, forge_meta

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
FORGED = ("full", "callback", "meta.pt", ".metadata", "bytes")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A full and a sharded checkpoint at step 4 (one device)."""
    root = tmp_path_factory.mktemp("saved")
    for fmt in ("full", "sharded"):
        run_single(root, fmt=fmt, save=root / f"{fmt}.ckpt")
    return {fmt: root / f"{fmt}.ckpt" for fmt in ("full", "sharded")}


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    """The file a forged checkpoint's code creates when it runs."""
    return tmp_path / "MARKER"


def _forge(saved: dict[str, Path], kind: str, tmp_path: Path, marker: Path) -> tuple[Path, str]:
    """A forged copy of a saved checkpoint, and the file its error must name."""
    if kind in ("full", "callback"):
        ckpt = Path(shutil.copy(saved["full"], tmp_path / "evil.ckpt"))
        forge_full(ckpt, marker, "callbacks" if kind == "callback" else "hyper_parameters")
        return ckpt, str(ckpt)
    ckpt = Path(shutil.copytree(saved["sharded"], tmp_path / "evil.ckpt"))
    forge = {"meta.pt": forge_meta, ".metadata": forge_index, "bytes": forge_bytes}[kind]
    named = forge(ckpt, marker)
    return ckpt, f"{named} (entry 'model.evil')" if kind == "bytes" else str(named)


def _refused(load: Callable[[], Any], named: str, marker: Path) -> UntrustedCheckpointError:
    """``load()`` raises UntrustedCheckpointError naming what the file holds, the file and the
    opt-in, and nothing ran."""
    with pytest.raises(UntrustedCheckpointError) as caught:
        load()
    message = str(caught.value)
    assert re.search(rf"holds {re.escape(SYSTEM)}, which is not plain data", message), message
    assert named in message, message
    assert "trust_checkpoint=True" in message and "--trust" in message, message
    assert "fullshard checkpoint export" in message  # how to hand weights to others
    assert caught.value.found == (SYSTEM,)
    assert not marker.exists(), "the forged checkpoint ran its code"
    return caught.value


def _fit(root: Path, ckpt: Path | str, model: Net | None = None, **kwargs: Any) -> fullshard.Trainer:
    trainer, _ = run_single(root, max_steps=4, resume=ckpt, model=model, **kwargs)
    return trainer


class ValNet(Net):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log(
            "val_loss", torch.nn.functional.mse_loss(self.head(self.blocks(batch[0])).squeeze(-1), batch[1])
        )


# ---------------------------------------------------------------------------- every load path
@pytest.mark.parametrize("kind", FORGED)
def test_fit_refuses_forged_checkpoints(
    saved: dict[str, Path], tmp_path: Path, marker: Path, kind: str
) -> None:
    ckpt, named = _forge(saved, kind, tmp_path, marker)
    if kind == "bytes":  # fit reads only the tensors its model has: the extra entry is never unpickled
        _fit(tmp_path, ckpt)
        assert not marker.exists()
        return
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _refused(lambda: _fit(tmp_path, ckpt, model=model), named, marker)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("kind", ["full", "meta.pt", ".metadata"])
def test_validate_refuses_forged_checkpoints(
    saved: dict[str, Path], tmp_path: Path, marker: Path, kind: str
) -> None:
    ckpt, named = _forge(saved, kind, tmp_path, marker)
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    loader = DataLoader(make_data(), batch_size=8)
    _refused(lambda: trainer.validate(ValNet(), loader, ckpt_path=ckpt), named, marker)
    trainer.validate(ValNet(), loader, ckpt_path=ckpt, trust_checkpoint=True)
    assert marker.exists()


@pytest.mark.parametrize("kind", FORGED)
def test_load_from_checkpoint_refuses_forged_checkpoints(
    saved: dict[str, Path], tmp_path: Path, marker: Path, kind: str
) -> None:
    ckpt, named = _forge(saved, kind, tmp_path, marker)
    _refused(lambda: Net.load_from_checkpoint(ckpt), named, marker)
    # trusted: the payload runs (n_blocks becomes its return value, overridden here); the forged
    # DCP entry is a key the module does not have
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Net.load_from_checkpoint(ckpt, trust_checkpoint=True, strict=kind != "bytes", n_blocks=3)
    assert isinstance(model, Net) and marker.exists()


@pytest.mark.parametrize("kind", FORGED)
def test_tools_refuse_forged_checkpoints(
    saved: dict[str, Path], tmp_path: Path, marker: Path, kind: str
) -> None:
    ckpt, named = _forge(saved, kind, tmp_path, marker)
    out = tmp_path / "out"
    _refused(lambda: export_safetensors(ckpt, out / "w.safetensors"), named, marker)
    if kind != "bytes":  # inspect reads the index, never the values
        result = inspect(ckpt)
        assert result.problem is not None and SYSTEM in result.problem and "--trust" in result.problem
        assert not marker.exists()
    if ckpt.is_dir():
        _refused(lambda: consolidate(ckpt, out / "c.ckpt"), named, marker)
    assert not out.exists() or not any(out.iterdir())  # nothing written
    if ckpt.is_dir():
        consolidated = consolidate(ckpt, out / "c.ckpt", trust_checkpoint=True)
        assert marker.exists() and consolidated.is_file()
    else:
        export_safetensors(ckpt, out / "w.safetensors", trust_checkpoint=True)
        assert marker.exists()


def test_command_line_refuses_and_trusts_on_request(
    saved: dict[str, Path], tmp_path: Path, marker: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, named = _forge(saved, ".metadata", tmp_path, marker)
    assert cli(["checkpoint", "inspect", str(ckpt)]) == 1
    printed = capsys.readouterr().out
    assert f"holds {SYSTEM}" in printed and "--trust" in printed and named in printed
    for command in (
        ["consolidate", str(ckpt), str(tmp_path / "c.ckpt")],
        ["export", str(ckpt), str(tmp_path / "hf")],
    ):
        assert cli(["checkpoint", *command]) == 1
        error = capsys.readouterr().err
        assert error.startswith("fullshard: error: The checkpoint file") and "--trust" in error
    assert not marker.exists() and not (tmp_path / "c.ckpt").exists() and not (tmp_path / "hf").exists()
    assert cli(["checkpoint", "inspect", "--trust", str(ckpt)]) == 0
    assert marker.exists() and "global step 4" in capsys.readouterr().out


def test_last_resolves_to_a_forged_checkpoint_and_refuses_it(
    saved: dict[str, Path], tmp_path: Path, marker: Path
) -> None:
    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    ckpt, _ = _forge(saved, "full", tmp_path, marker)
    last = Path(shutil.move(ckpt, ckpts / "last.ckpt"))
    callback = fullshard.ModelCheckpoint(dirpath=ckpts, save_top_k=0)
    _refused(
        lambda: _fit(tmp_path, "last", enable_checkpointing=True, callbacks=[callback]), str(last), marker
    )


def test_lightning_checkpoint_with_code_is_refused(tmp_path: Path, marker: Path) -> None:
    from lckpt_models import LIGHTNING_FIXTURE, MLP

    lightning = torch.load(LIGHTNING_FIXTURE, weights_only=True)
    lightning["hyper_parameters"]["hidden"] = Payload(marker)
    torch.save(lightning, tmp_path / "lightning.ckpt")
    _refused(
        lambda: MLP.load_from_checkpoint(tmp_path / "lightning.ckpt"),
        str(tmp_path / "lightning.ckpt"),
        marker,
    )


def test_trusted_resume_loads_the_checkpoint(saved: dict[str, Path], tmp_path: Path, marker: Path) -> None:
    ckpt, _ = _forge(saved, "callback", tmp_path, marker)
    trainer = fullshard.Trainer(
        accelerator="cpu", devices=1, max_steps=6, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(Net(), DataLoader(make_data(), batch_size=8), ckpt_path=ckpt, trust_checkpoint=True)
    assert marker.exists() and trainer.global_step == 6


def test_the_error_survives_a_broadcast() -> None:
    import pickle

    error = trust.untrusted_error("/x/c.ckpt", [SYSTEM])
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.path, copy.found) == (type(error), str(error), "/x/c.ckpt", (SYSTEM,))


def test_error_message(tmp_path: Path) -> None:
    file = tmp_path / "c.ckpt"
    torch.save({"hyper_parameters": {"a": Payload(tmp_path / "M")}}, file)
    expected = (
        f"The checkpoint file '{file}' holds {SYSTEM}, which is not plain data (tensors, numbers, strings, "
        "lists, dicts); fullshard's own entries never need more, so it comes from hyperparameters, callback "
        "states or on_save_checkpoint entries holding other objects, or from a file made to attack whoever "
        "opens it. Unpickling it could run code the file chooses, so nothing was loaded. Load it only if you "
        "trust who wrote it: pass trust_checkpoint=True to the call that loads it (fit/validate/test/predict, "
        "Module.load_from_checkpoint, consolidate, inspect, export_safetensors), or --trust to `fullshard "
        "checkpoint`. To hand weights to others, export them: `fullshard checkpoint export` writes "
        "safetensors, which hold no code (docs/checkpoints.md, 'Loading checkpoints you did not write')."
    )
    with pytest.raises(UntrustedCheckpointError, match=f"^{re.escape(expected)}$"):
        load_torch_file(file, file)
    assert not (tmp_path / "M").exists()


def test_trust_checkpoint_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(
        MisconfigurationError, match=r"trust_checkpoint='yes' is invalid: pass True or False\."
    ):
        fullshard.Trainer(accelerator="cpu", devices=1, logger=False).fit(Net(), trust_checkpoint="yes")  # type: ignore[arg-type]


# ------------------------------------------ plain data that is still hostile (issue 37, wt-ckpta)
# Checkpoints edited as anyone can (torch.save rewrites the archive's CRC-32s): each is refused
# with CorruptCheckpointError naming the entry, within seconds, the file's bytes as they were and
# the model's weights untouched. [Note: loaded data is walked within bounds] in trust.py,
# [Note: loop counters checked on resume] in progress_checks.py, [Note: optimizer states checked
# against the parameters] in validate.py.
def _edited(saved: dict[str, Path], tmp_path: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    checkpoint = torch.load(saved["full"], weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, tmp_path / "edited.ckpt")
    return tmp_path / "edited.ckpt"


def _refused_resume(ckpt: Path, tmp_path: Path, pattern: str) -> None:
    """``fit(ckpt_path=ckpt)`` raises CorruptCheckpointError matching ``pattern`` and naming the
    file, with the model's weights and the file's bytes unchanged."""
    before, model = _bytes_of(ckpt), Net()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CorruptCheckpointError, match=pattern) as caught:
        _fit(tmp_path, ckpt, model=model)
    assert str(ckpt) in str(caught.value)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert _bytes_of(ckpt) == before


def _bytes_of(ckpt: Path) -> dict[str, bytes]:
    files = sorted(ckpt.rglob("*")) if ckpt.is_dir() else [ckpt]
    return {str(f): f.read_bytes() for f in files if f.is_file()}


def _shared_lists(depth: int = 40) -> list[Any]:
    nested: list[Any] = []
    for _ in range(depth):
        nested = [nested, nested]  # 2**depth paths through depth + 1 lists
    return nested


SHARED = r"shares its lists or dicts so that a walk of it as a tree visits more than 1,000,000 objects"


@pytest.mark.parametrize("where", ["hyper_parameters", "callbacks"])
def test_shared_nested_lists_are_refused_at_once(saved: dict[str, Path], tmp_path: Path, where: str) -> None:
    ckpt = _edited(saved, tmp_path, lambda c: c[where].update(deep=_shared_lists()))
    assert ckpt.stat().st_size < saved["full"].stat().st_size + 4096  # a few bytes more than the real one
    entry = re.escape(f"its entry ['{where}']['deep'][0]... {SHARED[:20]}")
    started = time.monotonic()
    for trust_checkpoint in (False, True):  # a trusted file is walked within bounds too
        with pytest.raises(CorruptCheckpointError, match=entry):
            Net.load_from_checkpoint(ckpt, trust_checkpoint=trust_checkpoint)
    problem = inspect(ckpt).problem
    assert problem is not None and re.search(SHARED, problem), problem
    _refused_resume(ckpt, tmp_path, entry)
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)  # was: no answer in 60 s
def test_the_command_line_refuses_shared_nested_lists_in_seconds(
    saved: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _edited(saved, tmp_path, lambda c: c["hyper_parameters"].update(deep=_shared_lists()))
    started = time.monotonic()
    assert cli(["checkpoint", "inspect", str(ckpt)]) == 1
    assert time.monotonic() - started < 10
    printed = capsys.readouterr().out
    assert re.search(SHARED, printed) and str(ckpt) in printed, printed


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (functools.reduce(lambda inner, _: [inner], range(150), []), r"nests deeper than 100 levels"),
        (
            (lambda itself: (itself.append(itself), itself)[1])([]),
            r"holds itself \(a list or dict inside itself\)",
        ),
        ({("a", (1, 2)): 1, "deep": {"x": [0] * 8}}, None),  # tuple keys and a few levels load
    ],
    ids=["deep", "itself", "plain"],
)
def test_loaded_data_nesting_and_cycles(tmp_path: Path, value: Any, said: str | None) -> None:
    buffer = io.BytesIO()
    torch.save({"hyper_parameters": {"v": value}}, buffer)
    if said is None:
        buffer.seek(0)
        assert load_torch_file(buffer, "x.ckpt")["hyper_parameters"]["v"] == value
        return
    buffer.seek(0)
    with pytest.raises(
        CorruptCheckpointError, match=rf"'x\.ckpt' .*its entry \['hyper_parameters'\]\['v'\].* {said}"
    ):
        load_torch_file(buffer, "x.ckpt")


def _rewrite_pickle(src: Path, dst: Path, edit: Callable[[bytes], bytes]) -> None:
    """``src`` with its pickle entry edited and the archive rewritten (CRC-32s recomputed)."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            data = old.read(info)
            new.writestr(info, edit(data) if info.filename.endswith("/data.pkl") else data)


def test_a_list_as_a_dict_key_is_corrupt(saved: dict[str, Path], tmp_path: Path) -> None:
    source = _edited(saved, tmp_path, lambda c: c["hyper_parameters"].update(KEYMARK=1))
    ckpt = tmp_path / "listkey.ckpt"

    def list_as_key(data: bytes) -> bytes:
        at = data.index(b"X\x07\x00\x00\x00KEYMARK")  # BINUNICODE 'KEYMARK', the key
        return data[:at] + b"]" + data[at + 12 :]  # EMPTY_LIST in its place

    _rewrite_pickle(source, ckpt, list_as_key)
    before = ckpt.read_bytes()
    said = rf"'{re.escape(str(ckpt))}' is damaged or not a checkpoint: its pickle builds what no pickle of plain data holds \(TypeError: unhashable type: 'list'\)"
    with pytest.raises(CorruptCheckpointError, match=said):
        Net.load_from_checkpoint(ckpt)
    _refused_resume(ckpt, tmp_path, said)
    assert ckpt.read_bytes() == before


def test_a_loop_state_of_another_type_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    ckpt = _edited(saved, tmp_path, lambda c: c.update(loops="x"))
    _refused_resume(
        ckpt, tmp_path, r"its 'loops' entry is 'x' \(str\), but it must be a dict of the loop's counters"
    )


@pytest.mark.parametrize(
    ("key", "value"), [("global_step", -7), ("global_step", 10**18), ("batches_in_epoch", 10**12)]
)
def test_loop_counters_out_of_range_are_refused(
    saved: dict[str, Path], tmp_path: Path, key: str, value: int
) -> None:
    ckpt = _edited(saved, tmp_path, lambda c: c["loops"].update({key: value}))
    _refused_resume(
        ckpt,
        tmp_path,
        rf"its loops\['{key}'\] is {value} \(int\), but it must be an int from 0 to 10,000,000,000\.",
    )


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ({"epoch": True}, r"loops\['epoch'\] is True \(bool\), but it must be an int from 0"),
        ({"total_batch_idx": 2.0}, r"loops\['total_batch_idx'\] is 2\.0 \(float\), but it must be an int"),
        (
            {"samples_in_epoch": -1},
            r"loops\['samples_in_epoch'\] is -1 \(int\), but it must be an int from 0 to 1,000,000,000,000,000",
        ),
        ({"data_seed": "11"}, r"loops\['data_seed'\] is '11' \(str\), but it must be None or an int"),
        ({"epoch_finished": 1}, r"loops\['epoch_finished'\] is 1 \(int\), but it must be True or False"),
        (
            {"epoch_rng_state": [1, 2]},
            r"loops\['epoch_rng_state'\] is \[1, 2\] \(list\), but it must be None or",
        ),
        (
            {"loader_positions": [{"batches": -2, "samples": None}]},
            r"loops\['loader_positions'\]\[0\]\['batches'\] is -2",
        ),
        (
            {"batches_that_stepped": 5, "total_batch_idx": 4},
            r"loops\['batches_that_stepped'\] is 5 \(int\), but .* cannot exceed loops\['total_batch_idx'\] \(4\)",
        ),
        ({"global_step": None}, r"loops\['global_step'\] is None \(NoneType\)"),
    ],
    ids=["bool", "float", "samples", "seed", "finished", "rng", "positions", "stepped", "none"],
)
def test_every_loop_entry_is_checked(saved: dict[str, Path], edit: dict[str, Any], said: str) -> None:
    loops = {**torch.load(saved["full"], weights_only=True)["loops"], **edit}
    with pytest.raises(
        CorruptCheckpointError, match=rf"^The checkpoint 'c\.ckpt' is damaged or was edited: its {said}"
    ):
        check_loop_state(loops, "c.ckpt")
    check_loop_state(torch.load(saved["full"], weights_only=True)["loops"], "c.ckpt")  # the real one passes
    with pytest.raises(CorruptCheckpointError, match=r"its 'loops' entry lacks 'global_step'"):
        check_loop_state({"epoch": 0, "batches_in_epoch": 0}, "c.ckpt")


def test_lightning_loop_counters_are_checked_as_converted() -> None:
    with pytest.raises(
        CorruptCheckpointError,
        match=r"its entry \['loops'\]\['fit_loop'\]\['epoch_progress'\] is 'x' \(str\), but it must be a dict",
    ):
        loop_state({"loops": {"fit_loop": {"epoch_progress": "x"}}}, "l.ckpt")
    with pytest.raises(CorruptCheckpointError, match=r"its entry \['global_step'\] is -1 \(int\)"):
        loop_state({"epoch": 0, "global_step": -1}, "l.ckpt")


def test_an_optimizer_state_of_another_shape_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    def edit(checkpoint: dict[str, Any]) -> None:
        checkpoint["optimizer_states"][0]["state"]["blocks.0.fc.weight"]["exp_avg"] = torch.zeros(1_000_000)

    ckpt = _edited(saved, tmp_path, edit)
    _refused_resume(
        ckpt,
        tmp_path,
        r"its optimizer state does not fit the parameters its model state has: blocks\.0\.fc\.weight's 'exp_avg' "
        r"of optimizer 0 \(AdamW\) has shape \(1000000,\), the parameter \(16, 16\)\. Nothing was loaded",
    )


def test_a_sharded_optimizer_state_is_checked_by_its_index(tmp_path: Path) -> None:
    trainer, model = run_single(tmp_path, fmt="sharded")
    trainer.optimizers[0].state[model.head.weight]["exp_avg_sq"] = torch.zeros(7, 16)
    trainer.save_checkpoint(tmp_path / "sharded.ckpt")  # a consistent record of a wrong state
    _refused_resume(
        tmp_path / "sharded.ckpt",
        tmp_path,
        r"head\.weight's 'exp_avg_sq' of optimizer 0 \(AdamW\) has shape \(7, 16\), the parameter \(1, 16\)",
    )


def test_optimizer_states_torch_keeps_in_other_shapes_pass() -> None:
    # what torch.optim keeps in other shapes passes: Adafactor's factored moments; LBFGS's flat vectors
    weight = {"w": torch.Size([8, 4])}
    factored = [(0, "w", "row_var", (8, 1)), (0, "w", "col_var", (1, 4)), (0, "w", "step", ())]
    check_optimizer_shapes("s.ckpt", weight, [torch.optim.Adafactor([torch.zeros(8, 4)])], factored)
    check_optimizer_shapes("s.ckpt", weight, [torch.optim.LBFGS([torch.zeros(8, 4)])], [(0, "w", "d", (32,))])
    adafactor = [torch.optim.Adafactor([torch.zeros(8, 4)])]
    for key, shape in (("row_var", (4, 1)), ("step", (3,)), ("variance", (1, 4))):
        with pytest.raises(
            CorruptCheckpointError, match=rf"w's '{key}' of optimizer 0 \(Adafactor\) has shape"
        ):
            check_optimizer_shapes("s.ckpt", weight, adafactor, [(0, "w", key, shape)])


# --------------------------------------------------------------------- what still loads as before
def test_older_fullshard_numpy_rng_state_loads(saved: dict[str, Path], tmp_path: Path) -> None:
    """Checkpoints written before [Note: portable RNG states] hold NumPy's state as an ndarray."""
    checkpoint = torch.load(saved["full"], weights_only=True)
    for states in checkpoint["rng_states"]:
        kind, keys, *rest = states["numpy"]
        states["numpy"] = (kind, np.asarray(keys, dtype=np.uint32), *rest)
    torch.save(checkpoint, tmp_path / "older.ckpt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(
        tmp_path / "older.ckpt"
    )  # not torch's default
    trainer = _fit(tmp_path, tmp_path / "older.ckpt")
    assert trainer.global_step == 4
    Net.load_from_checkpoint(tmp_path / "older.ckpt")
    assert inspect(tmp_path / "older.ckpt").problem is None


def test_other_arrays_stay_refused(tmp_path: Path) -> None:
    """Only the uint32 array of NumPy's RNG state is admitted, not an object array (whose items
    would be further pickles) nor the other dtypes."""
    for array, found in (
        (np.array([Payload(tmp_path / "M")], dtype=object), SYSTEM),
        (np.zeros(2), "numpy.dtypes.Float64DType"),
    ):
        buffer = io.BytesIO()
        torch.save({"x": array}, buffer)
        buffer.seek(0)
        with pytest.raises(UntrustedCheckpointError, match=rf"'x\.ckpt' holds {re.escape(found)}, which"):
            load_torch_file(buffer, "x.ckpt")
    assert not (tmp_path / "M").exists()


def test_types_the_user_allowlisted_load(tmp_path: Path) -> None:
    before = set(torch.serialization.get_safe_globals())
    torch.save({"hyper_parameters": {"where": Path("/data")}}, tmp_path / "c.ckpt")
    with pytest.raises(UntrustedCheckpointError, match=r"holds pathlib\.PosixPath"):
        load_torch_file(tmp_path / "c.ckpt", tmp_path / "c.ckpt")
    with torch.serialization.safe_globals([type(Path("/data"))]):
        assert load_torch_file(tmp_path / "c.ckpt", "c")["hyper_parameters"]["where"] == Path("/data")
        with trust.allowed_globals():  # fullshard's own admission leaves the user's in place
            pass
        assert type(Path("/data")) in torch.serialization.get_safe_globals()
    assert set(torch.serialization.get_safe_globals()) == before


# the opcodes a damaged byte of whose operand still loads: a memo slot or the protocol number
# (nothing changes), or a number (that one number changes)
_NO_CHANGE_OPERANDS = ("BINPUT", "LONG_BINPUT", "PROTO")
_NUMBER_OPERANDS = ("BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT")


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """Every leaf of a loaded checkpoint by its path (a tensor as its layout and values)."""
    if isinstance(value, dict):
        return {p: v for k, item in value.items() for p, v in _leaves(item, (*path, k)).items()}
    if isinstance(value, list | tuple):
        found = {(*path, "len"): len(value)}
        for i, item in enumerate(value):
            found.update(_leaves(item, (*path, i)))
        return found
    if isinstance(value, torch.Tensor):
        layout = (tuple(value.shape), value.dtype, value.stride(), value.storage_offset())
        return {path: (*layout, value.flatten().tolist())}
    return {path: value}


def test_damaged_pickle_is_corrupt_not_untrusted(saved: dict[str, Path], tmp_path: Path) -> None:
    """Each byte of two stretches of a full checkpoint's pickle (its first 250 bytes: the
    checkpoint's own entries; and 250 from the model's first weight: its name and tensor records),
    and the length byte of its first 100 long integers (the random states'), replaced by an opcode
    no pickle has, read by load_torch_file (which does not check CRC-32s: the load around it
    does): CorruptCheckpointError, never UntrustedCheckpointError (nothing names code, even where
    torch reads garbage as a global's name) and never another exception. A byte that loads is an
    operand that holds any value: a memo slot or the protocol (the same checkpoint), a number
    (that one number differs), or a long integer's length (the bytes after it read anew: the
    checkpoint differs, as plain data, maybe not even a dict); the archive's CRC-32, which every load checks first,
    refuses each of those. (The stretches hold the same bytes at every run; the long integers,
    random numbers, do not, and each of their outcomes is one of the above.)"""
    data = saved["full"].read_bytes()
    entry = next(e for e in archive_entries(saved["full"]) if e.name.endswith("/data.pkl"))
    pickled = data[entry.offset : entry.offset + entry.size]
    starts = {pos: op.name for op, _, pos in pickletools.genops(pickled)}
    original = _leaves(load_torch_file(saved["full"], "c.ckpt"))
    weights = pickled.index(b"blocks.0.fc.weight") - 5  # its BINUNICODE opcode and length
    lengths = [pos + 1 for pos, name in sorted(starts.items()) if name == "LONG1"][:100]
    assert len(lengths) == 100
    corrupt, loaded = 0, []
    for offset in [*range(250), *range(weights, weights + 250), *lengths]:
        damaged = bytearray(data)
        damaged[entry.offset + offset] = 0xFE
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's, for a damaged protocol number
                checkpoint = load_torch_file(io.BytesIO(bytes(damaged)), "c.ckpt")
        except CorruptCheckpointError as err:
            assert re.match(r"The checkpoint file 'c\.ckpt' is damaged or not a checkpoint \(", str(err)), err
            corrupt += 1
            continue
        opcode_at = max(pos for pos in starts if pos <= offset)
        opcode = starts[opcode_at]
        assert opcode_at < offset, f"byte {offset} is the opcode {opcode} itself, yet it loaded"
        leaves = _leaves(checkpoint)
        changed = {p for p in original.keys() | leaves.keys() if original.get(p) != leaves.get(p)}
        if opcode in _NO_CHANGE_OPERANDS:
            assert not changed, (offset, opcode, changed)
        elif offset in lengths:
            assert changed, offset
        else:
            assert opcode in _NUMBER_OPERANDS, (offset, opcode)
            assert len(changed) == 1 and isinstance(original[next(iter(changed))], int | float), changed
        loaded.append(bytes(damaged))
    assert corrupt > 300 and loaded  # both kinds met: the stretches cover what they claim
    for i, damaged_bytes in enumerate(loaded[:: max(1, len(loaded) // 20)]):  # the load's CRC-32 check
        file = tmp_path / f"damaged{i}.ckpt"
        file.write_bytes(damaged_bytes)
        with pytest.raises(
            CorruptCheckpointError, match=rf"entry '{re.escape(entry.name)}' fails its CRC-32"
        ):
            verify_full_file(file)


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_plain_checkpoints_load_unchanged(saved: dict[str, Path], tmp_path: Path, fmt: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "not plain data" warning on save either
        trainer, _ = run_single(tmp_path, fmt=fmt, max_steps=4, save=tmp_path / "again.ckpt")
    resumed = _fit(tmp_path, tmp_path / "again.ckpt")
    assert_same_state(full_state(resumed), full_state(trainer))
    assert inspect(saved[fmt]).problem is None
    Net.load_from_checkpoint(saved[fmt])


# ------------------------------------------------------------------------------------- saving
class PathNet(Net):
    def __init__(self, data_dir: Any = Path("/data"), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()


class ObjectState(fullshard.Callback):
    def state_dict(self) -> dict[str, Any]:
        return {"thing": np.zeros(2)}


def test_saving_warns_once_when_a_load_will_need_trust(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint_io, "_warned", set())
    with pytest.warns(UserWarning) as caught:
        trainer, _ = run_single(
            tmp_path, model=PathNet(), callbacks=[ObjectState()], save=tmp_path / "a.ckpt"
        )
        trainer.save_checkpoint(tmp_path / "b.ckpt")
    said = [str(w.message) for w in caught if "not plain data" in str(w.message)]
    assert len(said) == 1, said
    assert re.search(
        r"not plain data: callbacks\['ObjectState'\] \(numpy\.dtypes\.Float64DType\); "
        r"hyper_parameters\['data_dir'\] \(pathlib\.PosixPath\)\. "
        r"fullshard loads checkpoints without running code from them, so loading this one will need "
        r"trust_checkpoint=True",
        said[0],
    ), said[0]
    with pytest.raises(UntrustedCheckpointError, match=r"holds .*pathlib\.PosixPath"):
        PathNet.load_from_checkpoint(tmp_path / "a.ckpt")
    assert PathNet.load_from_checkpoint(tmp_path / "a.ckpt", trust_checkpoint=True).hparams[
        "data_dir"
    ] == Path("/data")


def test_not_plain_names_each_entry() -> None:
    checkpoint = {"loops": {"epoch": 1}, "hyper_parameters": {"lr": 0.1, "where": Path("/x")}, "odd": {1, 2}}
    assert checkpoint_io.not_plain(checkpoint) == ["hyper_parameters['where'] (pathlib.PosixPath)"]
    plain = {"hyper_parameters": {"lr": 0.1}, "callbacks": {"x": {"t": torch.ones(2), "s": torch.Size([2])}}}
    assert checkpoint_io.not_plain(plain) == []
    # a numeric array other than the RNG state's: admitted globals, a dtype class that is not
    assert checkpoint_io.not_plain({"odd": np.zeros(2)}) == ["'odd' (numpy.dtypes.Float64DType)"]


# --------------------------------------------------------------------------- several processes
@pytest.mark.multiprocess
def test_every_rank_refuses_forged_checkpoints(tmp_path: Path) -> None:
    check_ok(run_script("untrusted_job.py", "--out", str(tmp_path), timeout=180))
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, log in enumerate(logs):
        for case, named in (("full", "evil-full.ckpt'"), ("meta", f"{META_NAME}'"), ("index", ".metadata'")):
            assert log[case]["error"] == "UntrustedCheckpointError", (rank, log[case])
            assert log[case]["message"] == logs[0][case]["message"]  # the same error on every rank
            assert named in log[case]["message"] and f"holds {SYSTEM}" in log[case]["message"]
        assert log["changed"] == [] and log["ran"] is False
        assert log["trusted"]["error"] is None and log["ran_trusted"] is True
    assert CommitRecord.read(tmp_path / "evil-index.ckpt").world_size == 2


# ==================================================================================================
# Checkpoints that lie about themselves, edited with their CRC-32s recomputed (issue 37): verify
# checks what a load checks, a tie is believed only where the checkpoint agrees, and a sharded
# checkpoint reads nothing outside its directory. Each refusal leaves every file as it was.
# ==================================================================================================
class _Storage:
    """A tensor's storage record in a pickle, kept as the persistent id ``torch.save`` wrote."""

    def __init__(self, pid: Any) -> None:
        self.pid = pid


class _TensorRecord:
    """A tensor record (``_rebuild_tensor_v2`` and its arguments), editable and written back as is."""

    def __init__(self, *args: Any) -> None:
        self.args = list(args)

    def __reduce__(self) -> tuple[Any, ...]:
        return (torch._utils._rebuild_tensor_v2, tuple(self.args))


class _RecordReader(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> _Storage:
        return _Storage(pid)

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _TensorRecord
        return super().find_class(module, name)  # our own file: what torch.save wrote


class _RecordWriter(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, _Storage) else None


def _edit_records(file: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite the pickle of the full checkpoint ``file`` after ``change`` (its tensors as
    _TensorRecord), the archive rewritten with every CRC-32 valid, as anyone editing it can."""
    with zipfile.ZipFile(file) as archive:
        entries = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as archive:
        for name, content in entries:
            if name.endswith("/data.pkl"):
                checkpoint = _RecordReader(io.BytesIO(content)).load()
                change(checkpoint)
                buffer = io.BytesIO()
                _RecordWriter(buffer, protocol=2).dump(checkpoint)
                content = buffer.getvalue()
            archive.writestr(name, content)


def _tree(root: Path) -> dict[str, Any]:
    """Everything under ``root``: each link's target, each file's bytes."""
    found: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        found[name] = (
            ("link", os.readlink(path)) if path.is_symlink() else path.is_file() and path.read_bytes()
        )
    return found


def test_verify_reports_a_tensor_record_the_load_refuses(
    saved: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full checkpoint whose storage record for one weight claims 10**12 elements (in 1 KiB):
    inspect --verify said "checksums: all match"; it reports what the load raises."""
    ckpt = Path(shutil.copy(saved["full"], tmp_path / "huge.ckpt"))

    def claim(checkpoint: dict[str, Any]) -> None:
        storage = checkpoint["state_dict"]["blocks.0.fc.weight"].args[0]
        storage.pid = (*storage.pid[:4], 10**12)

    _edit_records(ckpt, claim)
    assert verify_full_file(ckpt)  # every CRC-32 matches: the edit recomputed them
    before = _tree(tmp_path)
    with pytest.raises(CorruptCheckpointError) as loaded:
        Net.load_from_checkpoint(ckpt)
    said = str(loaded.value)
    assert re.search(
        r"'.*huge\.ckpt' is damaged or not a checkpoint \(RuntimeError: record size \(1024 bytes\) does not "
        r"match expected size \(4000000000000 bytes",
        said,
    ), said
    with pytest.raises(CorruptCheckpointError) as resumed:
        _fit(tmp_path, ckpt)
    with pytest.raises(CorruptCheckpointError) as verified:
        verify(ckpt)
    assert str(verified.value) == str(resumed.value) == said  # what verify says is what a load raises
    report = inspect(ckpt, verify_checksums=True)
    assert (report.verified, report.complete, report.problem) == (False, False, said)
    assert cli(["checkpoint", "inspect", "--verify", str(ckpt)]) == 1
    printed = capsys.readouterr().out
    assert "checksums:   FAILED: a load would refuse it (see problem)" in printed and said in printed
    assert _tree(tmp_path) == before


def test_export_refuses_a_view_claiming_more_elements_than_its_storage(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    """A weight recorded as (10**12,) with stride 0 over its 256 floats: torch loads such a view
    (it stays inside its storage), the load's shape check refuses it, and the export, which
    writes tensors dense, refuses it before allocating 4 TB."""
    ckpt = Path(shutil.copy(saved["full"], tmp_path / "expanded.ckpt"))

    def expand(checkpoint: dict[str, Any]) -> None:
        checkpoint["state_dict"]["blocks.0.fc.weight"].args[2:4] = [(10**12,), (0,)]

    _edit_records(ckpt, expand)
    before = _tree(tmp_path)
    with pytest.raises(
        CorruptCheckpointError,
        match=r"expanded\.ckpt' stores 'blocks\.0\.fc\.weight' as \(1000000000000,\) float32 \(4000000000000 bytes\) "
        r"over 1024 bytes of data \(a view that repeats its elements\): exporting it would write every element",
    ):
        export_safetensors(ckpt, tmp_path / "w.safetensors")
    assert _tree(tmp_path) == before


def _tied(saved: dict[str, Path], tmp_path: Path, fmt: str, ties: Any) -> Path:
    """A copy of the saved checkpoint of ``fmt`` whose record of tied parameters is ``ties``
    (a sharded one's commit and rank records fixed up)."""
    if fmt == "full":
        ckpt = Path(shutil.copy(saved["full"], tmp_path / "tied.ckpt"))
        checkpoint = torch.load(ckpt, weights_only=True)
        checkpoint[checkpoint_io.TIED_KEY] = ties
        torch.save(checkpoint, ckpt)
        return ckpt
    ckpt = Path(shutil.copytree(saved["sharded"], tmp_path / "tied.ckpt"))
    meta = ckpt / CommitRecord.read(ckpt).data / META_NAME
    checkpoint = torch.load(meta, weights_only=True)
    checkpoint[checkpoint_io.TIED_KEY] = ties
    torch.save(checkpoint, meta)
    fix_record(ckpt)
    return ckpt


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_a_tie_between_tensors_of_other_shapes_is_refused(
    saved: dict[str, Path], tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tied_parameters`` forged to say blocks.0.fc.weight (16, 16) is head.weight (1, 16): the
    export wrote head.weight's values under blocks.0.fc.weight's name."""
    ckpt = _tied(saved, tmp_path, fmt, {"blocks.0.fc.weight": "head.weight"})
    out = tmp_path / "out"
    before = _tree(tmp_path)
    tie = r"records 'blocks\.0\.fc\.weight' as tied to 'head\.weight' \(one tensor under two names: tied_parameters\)"
    shapes = (
        r"it stores 'blocks\.0\.fc\.weight' as \(16, 16\) float32 and 'head\.weight' as \(1, 16\) float32"
    )
    refused = rf"The checkpoint '.*tied\.ckpt' {tie}, but {shapes}, so the two are no tie\. Nothing was read"
    with pytest.raises(CorruptCheckpointError, match=refused):
        export_safetensors(ckpt, out / "w.safetensors")
    with pytest.raises(CorruptCheckpointError, match=refused):
        verify(ckpt)
    assert cli(["checkpoint", "export", str(ckpt), str(out)]) == 1
    assert re.search(refused, capsys.readouterr().err)
    report = inspect(ckpt)  # from the index alone: the shapes, without dtypes
    assert report.problem is not None and re.search(
        rf"{tie}, but it stores 'blocks\.0\.fc\.weight' as \(16, 16\) and 'head\.weight' as \(1, 16\)",
        report.problem,
    )
    if fmt == "sharded":  # the loads read the record (a full checkpoint's load reads each name's own tensor)
        with pytest.raises(CorruptCheckpointError, match=refused):
            Net.load_from_checkpoint(ckpt)
        model = Net()
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(
            CorruptCheckpointError, match=rf"{tie}, but it stores .* as \(16, 16\) and .* as \(1, 16\)"
        ):
            _fit(tmp_path, ckpt, model=model)
        assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert _tree(tmp_path) == before and not out.exists()


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_a_tie_between_tensors_of_other_values_is_not_believed(
    saved: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    """Two weights of one shape and dtype recorded as one tensor: where both are read, their
    values must be equal; the Trainer's sharded load reads a stored alias from its own bytes."""
    ckpt = _tied(saved, tmp_path, fmt, {"blocks.1.fc.weight": "blocks.0.fc.weight"})
    before = _tree(tmp_path)
    refused = (
        r"records 'blocks\.1\.fc\.weight' as tied to 'blocks\.0\.fc\.weight' .*, but it stores 'blocks\.1\.fc\.weight' "
        r"with values other than 'blocks\.0\.fc\.weight''s \(both \(16, 16\) float32\), so the two are no tie"
    )
    with pytest.raises(CorruptCheckpointError, match=refused):
        export_safetensors(ckpt, tmp_path / "w.safetensors")
    with pytest.raises(CorruptCheckpointError, match=refused):
        verify(ckpt)
    if fmt == "sharded":
        with pytest.raises(CorruptCheckpointError, match=refused):
            Net.load_from_checkpoint(ckpt)
        _, stored = read_sharded(saved["sharded"], verify=True, trust=False, prefix="model.")
        model = Net()
        _fit(tmp_path, ckpt, model=model)  # at step 4 already: the weights are the checkpoint's
        assert torch.equal(model.blocks[1].fc.weight, stored["model"]["blocks.1.fc.weight"])
        assert not torch.equal(model.blocks[1].fc.weight, model.blocks[0].fc.weight)
    assert _tree(tmp_path) == before


def test_a_tie_record_that_is_no_mapping_of_names_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    for fmt in ("full", "sharded"):
        (tmp_path / fmt).mkdir()
        ckpt = _tied(saved, tmp_path / fmt, fmt, ["blocks.0.fc.weight"])
        with pytest.raises(
            CorruptCheckpointError,
            match=r"tied\.ckpt' records its tied parameters as a list that is not a mapping of parameter names "
            r"\{alias: canonical\}\. Nothing was read through it\.",
        ):
            export_safetensors(ckpt, tmp_path / fmt / "w.safetensors")
        assert not (tmp_path / fmt / "w.safetensors").exists()


def _shard(ckpt: Path) -> Path:
    return ckpt / CommitRecord.read(ckpt).data / "__0_0.distcp"


def test_a_shard_linked_outside_the_checkpoint_is_refused(
    saved: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shard replaced by a link to a file of the same bytes outside the checkpoint (every
    CRC-32 matches): refused by every reader, naming the link and where it points, unless the
    user opts in (FULLSHARD_CHECKPOINT_LINKS_OUTSIDE=1)."""
    ckpt = Path(shutil.copytree(saved["sharded"], tmp_path / "ckpt"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shard = _shard(ckpt)
    target = Path(shutil.move(shard, elsewhere / "__0_0.distcp"))
    shard.symlink_to(target)
    before = _tree(tmp_path)
    refused = (
        rf"The sharded checkpoint '{re.escape(str(ckpt))}' reads outside its directory: {shard.parent.name}/__0_0\.distcp "
        rf"is a symbolic link to '{re.escape(str(target))}' \(resolving to '{re.escape(str(target))}'\), outside the "
        r"checkpoint directory, which a load never reads: copy the file into the checkpoint in place of the link, or, "
        r"if you made the link, set FULLSHARD_CHECKPOINT_LINKS_OUTSIDE=1 to follow it\. Nothing was loaded\."
    )
    for load in (
        lambda: Net.load_from_checkpoint(ckpt),
        lambda: _fit(tmp_path, ckpt),
        lambda: consolidate(ckpt, tmp_path / "c.ckpt"),
        lambda: export_safetensors(ckpt, tmp_path / "w.safetensors"),
        lambda: verify(ckpt),
    ):
        with pytest.raises(CorruptCheckpointError, match=f"^{refused}"):
            load()
    assert re.match(refused, inspect(ckpt).problem or "")
    assert _tree(tmp_path) == before
    monkeypatch.setenv("FULLSHARD_CHECKPOINT_LINKS_OUTSIDE", "1")  # the user made the link: it loads
    assert verify(ckpt) == "sharded" and _fit(tmp_path, ckpt).global_step == 4
    monkeypatch.setenv("FULLSHARD_CHECKPOINT_LINKS_OUTSIDE", "yes")
    with pytest.raises(
        MisconfigurationError,
        match=r"The environment variable FULLSHARD_CHECKPOINT_LINKS_OUTSIDE='yes' is invalid: set it to 1 to let",
    ):
        verify(ckpt)


def test_a_data_directory_or_record_linked_outside_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(saved["sharded"], tmp_path / "ckpt"))
    data = _shard(ckpt).parent
    moved = Path(shutil.move(data, tmp_path / data.name))
    data.symlink_to(moved, target_is_directory=True)
    with pytest.raises(
        CorruptCheckpointError,
        match=rf"reads outside its directory: {data.name} is a symbolic link to '{re.escape(str(moved))}'",
    ) as caught:
        Net.load_from_checkpoint(ckpt)
    assert str(caught.value).count("is a symbolic link") == 1  # said once, not once per file
    data.unlink()
    shutil.move(moved, data)
    record = ckpt / "fullshard-checkpoint.json"
    outside = Path(shutil.move(record, tmp_path / "record.json"))
    record.symlink_to(outside)
    with pytest.raises(CorruptCheckpointError, match=r"fullshard-checkpoint\.json is a symbolic link to"):
        _fit(tmp_path, ckpt)


def test_links_inside_the_checkpoint_are_followed(saved: dict[str, Path], tmp_path: Path) -> None:
    """A checkpoint whose files link to each other inside it, then copied with its links and
    reached through a link to it (as last.ckpt can be): loads, verifies, exports."""
    original = Path(shutil.copytree(saved["sharded"], tmp_path / "original"))
    shard = _shard(original)
    kept = Path(shutil.move(shard, original / "store.distcp"))
    shard.symlink_to(os.path.relpath(kept, shard.parent))
    ckpt = Path(shutil.copytree(original, tmp_path / "copied", symlinks=True))
    assert _shard(ckpt).is_symlink()
    (tmp_path / "last.ckpt").symlink_to(ckpt, target_is_directory=True)
    assert verify(tmp_path / "last.ckpt") == "sharded"
    assert _fit(tmp_path, tmp_path / "last.ckpt").global_step == 4
    assert (
        Net.load_from_checkpoint(ckpt) is not None
        and export_safetensors(ckpt, tmp_path / "w.safetensors").is_file()
    )


def test_a_damaged_value_dcp_stores_as_bytes_is_corrupt(saved: dict[str, Path], tmp_path: Path) -> None:
    """A sharded checkpoint rewritten with a non-tensor model entry (DCP stores it as torch.save
    bytes), one byte of its pickle damaged and the records fixed up: the readers raise
    CorruptCheckpointError naming the entry, not DCP's CheckpointException around a bare error."""
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from fullshard.checkpoint.commit import ShardWriter

    ckpt = Path(shutil.copytree(saved["sharded"], tmp_path / "ckpt"))
    data = _shard(ckpt).parent
    _, state = read_sharded(ckpt, verify=True, trust=False)
    state["model"]["extra"] = ["a plain value", 7]
    for file in [data / ".metadata", *data.glob("*.distcp")]:
        file.unlink()
    dcp_save(state, storage_writer=ShardWriter(data, single_file_per_rank=True), no_dist=True)
    with open(data / ".metadata", "rb") as f:
        index = pickle.load(f)  # our own file, just written
    stored = next(info for key, info in index.storage_data.items() if key.fqn.startswith("model.extra"))
    shard = data / stored.relative_path
    content = bytearray(shard.read_bytes())
    content[content.index(b"data.pkl", stored.offset) + len(b"data.pkl") + 40] = 0xFE  # inside its pickle
    shard.write_bytes(bytes(content))
    fix_record(ckpt)
    before = _tree(tmp_path)
    damaged = rf"file \"{re.escape(str(data))} \(entry 'model\.extra'\)\" is damaged or not a checkpoint \(UnicodeDecodeError"
    for load in (
        lambda: Net.load_from_checkpoint(ckpt, strict=False),
        lambda: export_safetensors(ckpt, tmp_path / "w.safetensors"),
        lambda: verify(ckpt),
    ):
        with pytest.raises(CorruptCheckpointError, match=damaged):
            load()
    assert _tree(tmp_path) == before


def test_a_tie_between_views_repeating_their_elements_is_refused_at_once(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    """Two weights recorded as (10**12,) with stride 0 and tied: comparing their values would
    read 10**12 elements each; the tie is refused from their layout instead."""
    ckpt = Path(shutil.copy(saved["full"], tmp_path / "views.ckpt"))

    def expand_and_tie(checkpoint: dict[str, Any]) -> None:
        for key in ("blocks.0.fc.weight", "blocks.1.fc.weight"):
            checkpoint["state_dict"][key].args[2:4] = [(10**12,), (0,)]
        checkpoint[checkpoint_io.TIED_KEY] = {"blocks.1.fc.weight": "blocks.0.fc.weight"}

    _edit_records(ckpt, expand_and_tie)
    with pytest.raises(
        CorruptCheckpointError,
        match=r"it stores 'blocks\.1\.fc\.weight' and 'blocks\.0\.fc\.weight' as two different views, one "
        r"repeating its elements, so the two are no tie",
    ):
        export_safetensors(ckpt, tmp_path / "w.safetensors")
    assert not (tmp_path / "w.safetensors").exists()
