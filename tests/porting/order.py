"""The documented hook order: passages of the Lightning recordings (tests/porting/expected/).

docs/lightning.md shows this text between its ``hook-order`` markers, and
tests/test_lightning_table.py checks that the two agree. After regenerating the fixtures, print
the new text with::

    python tests/porting/order.py
"""

from __future__ import annotations

import re

from hooks import NOT_CALLED_BY_FULLSHARD
from runner import load_expected

# (title, script, first event, last event): the passage runs from the first event starting with
# the first text to the next event starting with the last text, both included, in rank 0's record.
SECTIONS = (
    (
        "fit: setup, sanity check, the first training batch",
        "plateau_param_groups",
        "S fit",
        "M on_train_batch_end",
    ),
    (
        "an epoch ends: validation, epoch-end hooks, the scheduler steps",
        "plateau_param_groups",
        "C on_train_batch_end(batch_idx=3",
        "M on_train_epoch_start",
    ),
    (
        "accumulate_grad_batches=4, gradient_clip_val: a micro-batch without a step",
        "clip_accumulate",
        "C on_train_batch_start(batch_idx=1",
        "M on_train_batch_end(batch_idx=1",
    ),
    (
        "... and the micro-batch that steps",
        "clip_accumulate",
        "C on_train_batch_start(batch_idx=3",
        "M on_train_batch_end(batch_idx=3",
    ),
    (
        "ModelCheckpoint saves in on_validation_end",
        "early_stop_test_predict",
        "C on_validation_end",
        "M on_validation_end",
    ),
    ("fit ends", "plateau_param_groups", "C on_train_end", "M teardown"),
    (
        'a DataModule; fit(ckpt_path="last") resumes',
        "datamodule_resume",
        "S resume from last",
        "M on_train_epoch_start",
    ),
    ('test(ckpt_path="best")', "early_stop_test_predict", "S test", "M teardown(stage=test)"),
    ('predict(ckpt_path="best")', "early_stop_test_predict", "S predict", "M teardown(stage=predict)"),
    (
        "validate() with the module's own val_dataloader",
        "fast_dev_run",
        "S validate limit 1",
        "M teardown(stage=validate)",
    ),
)
_SKIP_FIRST = {"C on_validation_end": "C on_train_start"}  # start after the sanity check's


def _index(events: list[str], prefix: str, start: int = 0) -> int:
    for i in range(start, len(events)):
        if events[i].startswith(prefix):
            return i
    raise ValueError(f"no event starting with {prefix!r} after position {start}")


def _line(event: str, state: str) -> str:
    event = re.sub(r", x0=[-0-9.e]+|x0=[-0-9.e]+, ?", "", event).replace("()", "")
    who, _, rest = event.partition(" ")
    note = (
        "    # Lightning only: not called by fullshard"
        if who == "M" and rest.split("(")[0] in NOT_CALLED_BY_FULLSHARD
        else ""
    )
    return f"  {state:8} {event}{note}"


def documented_order() -> str:
    """The text of the hook-order block of docs/lightning.md."""
    out = []
    for title, script, first, last in SECTIONS:
        rank0 = load_expected(script)["ranks"][0]
        events, states = rank0["events"], rank0["states"]
        begin = _index(events, first, _index(events, _SKIP_FIRST[first]) if first in _SKIP_FIRST else 0)
        end = _index(events, last, begin + 1)
        out.append(f"{title}  [{script}]")
        out += [_line(e, s) for e, s in zip(events[begin : end + 1], states[begin : end + 1], strict=True)]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(documented_order(), end="")
