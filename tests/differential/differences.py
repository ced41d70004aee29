"""What differs between a script's observations under Lightning 2.6.6 and under fullshard.

:func:`differences` returns one line per difference, ``"<kind>: <detail>"``, kinds being
``exception``, ``events``, ``metrics``, ``values``, ``warnings``, ``files``, ``checkpoints``,
``csv`` and ``tensorboard`` (the scalars of each run directory). A line that matches an accepted difference of docs/lightning.md (the table under
"Differential harness: accepted differences", read by :func:`accepted`) is dropped by
:func:`unexplained`: every difference the harness finds is fixed or written down there with its
reason.

Warnings compare by category and topic: both frameworks write their messages in their own words,
so :data:`TOPICS` names the warnings that are the same warning (a regular expression over either
framework's message); a warning no topic names compares by its text, digits and addresses taken
out. Warnings torch raises about Lightning's own use of torch (:data:`NOT_OBSERVED`) are left out.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs" / "lightning.md"
ACCEPTED_HEADING = "### Differential harness: accepted differences"
ACCEPTED_DDP_HEADING = "### Differential harness on 2 processes: accepted differences"

# (topic, a regular expression matching Lightning's message or fullshard's)
TOPICS: list[tuple[str, str]] = [
    (
        "epoch value logged without sync_dist on several processes",
        r"self\.log\('(\w+)', \.\.\., sync_dist=True\)` when logging on epoch level"
        r"|self\.log\('(\w+)', \.\.\.\) on epoch level without sync_dist",
    ),
    (
        "evaluation entry point splits its data over processes",
        r"Using `DistributedSampler` with the dataloaders\. During `trainer\.\w+\(\)`"
        r"|trainer\.\w+\(\) on \d+ processes splits the \w+ dataloader",
    ),
    ("no workers", r"does not have many workers|num_workers=0|few workers"),
    (
        "fewer batches than log_every_n_steps",
        r"number of training batches \(\d+\) is smaller than the logging interval"
        r"|fewer than Trainer\(log_every_n_steps=\d+\)",
    ),
    (
        "plateau keys ignored under manual optimization",
        r"keys will be ignored.*manual optimization|which manual optimization ignores",
    ),
    ("training_step returned None", r"`training_step` returned `None`|training_step returned None"),
    (
        "checkpoint callbacks missing",
        r"callbacks used to create the checkpoint need to be provided|holds callback states that no callback",
    ),
    (
        "monitored key not found",
        r"could not find the monitored key|cannot find '\w+' among the logged metrics",
    ),
    ("self.log with logger=True but no logger", r"logger=True\)`? .*no logger configured"),
    ("predict_step returned None", r"predict returned None|predict_step returned None"),
    ("empty dataloader", r"Total length of `DataLoader` across ranks is zero|dataloader has length zero"),
    (
        "module's batch-transfer hook beside a DataModule",
        r"overridden `\w+` in `LightningModule` but have passed in a `LightningDataModule`"
        r"|overridden `\w+` in the LightningModule, and the LightningDataModule passed",
    ),
    (
        "ModelCheckpoint dirpath changed since the checkpoint",
        r"The dirpath has changed from .* won't be reloaded"
        r"|ModelCheckpoint's dirpath changed from .* \(in the checkpoint\)",
    ),
    (
        "a step checkpoint under manual optimization holds the weights after the update",
        r"no pre-optimization state was saved|that is AFTER its optimizer\.step\(\) calls",
    ),
    (
        "fit without ckpt_path resumes from 'last' because of an OnExceptionCheckpoint",
        r"`\.fit\(ckpt_path=None\)` was called without a model\. The last model of the previous `fit`"
        r"|without ckpt_path, with an OnExceptionCheckpoint callback, resumes from the newest",
    ),
    (
        "ckpt_path='last' found no checkpoint",
        r"ckpt_path=\"last\"\) is set, but there is no last checkpoint available|\(ckpt_path='last'\) found no checkpoint",
    ),
    (
        "a batch-transfer hook in both the module and the DataModule",
        r"overridden `\w+` in both `LightningModule` and `LightningDataModule`"
        r"|overridden `\w+` in both the Module and the DataModule",
    ),
    (
        "self.log under barebones",
        r"trying to `self\.log\(\)` but `Trainer\(barebones=True\)`|was called with Trainer\(barebones=True\)",
    ),
    (
        "no learning-rate finder in a fast_dev_run",
        r"Skipping learning rate finder since `fast_dev_run`|learning rate finder is skipped in a fast_dev_run",
    ),
    (
        "SWA replaces a scheduler not stepped every epoch",
        r"SWA is currently only supported every epoch|SWA steps its scheduler every epoch",
    ),
    (
        "optimizer_step/optimizer_zero_grad overridden with gradient accumulation",
        r"accumulate_grad_batches != \d+\)` and overriding `LightningModule\.optimizer_"
        r"|With gradient accumulation, the module's optimizer_step/optimizer_zero_grad overrides",
    ),
]
# torch's deprecation warnings about how Lightning calls torch, not observations of the script
NOT_OBSERVED = [
    r"isinstance\(treespec, LeafSpec\)` is deprecated",
    # torch's once-per-process warning about float(loss) in the generated log_dict call
    r"Converting a tensor with requires_grad=True to a scalar",
    # fullshard's advice about the machine's memory set-up under FSDP on CPU (transparent huge
    # pages): given or not by the environment, not by the script
    r"FSDP on CPU maps every gathered unit afresh",
]
# exception types by the name a ported script catches them with (fullshard.utilities.exceptions)
# (an optimizer state with another number of parameter groups: a ValueError under both, torch's own
# under Lightning, a subclass of it under fullshard that names the optimizer and the fix)
EXCEPTION_NAMES = {
    "MisconfigurationError": "MisconfigurationException",
    "OptimizerGroupsMismatchError": "ValueError",
}


def close(a: Any, b: Any, rel: float = 1e-4, abs_: float = 1e-6) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return (
            isinstance(a, int | float)
            and isinstance(b, int | float)
            and math.isclose(a, b, rel_tol=rel, abs_tol=abs_)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel, abs_) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel, abs_) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def warning_topics(seen: list[list[str]]) -> list[str]:
    topics = []
    for category, message in seen:
        if any(re.search(p, message) for p in NOT_OBSERVED):
            continue
        topic = next((name for name, pattern in TOPICS if re.search(pattern, message, re.I)), None)
        if topic is None:
            topic = re.sub(r"0x[0-9a-f]+|\d+", "N", message)[:160]
        topics.append(f"{category}: {topic}")
    return sorted(topics)


def _lightning_names(event: str) -> str:
    for ours, theirs in EXCEPTION_NAMES.items():
        event = event.replace(f"exception={ours}", f"exception={theirs}")
    return event


def _csv_rows(lines: list[str]) -> list[dict[str, Any]]:
    rows = []
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        rows.append({k: (float(v) if v not in ("", None) else None) for k, v in row.items()})
    return rows


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=repr)
    return text if len(text) < 400 else text[:400] + "..."


def differences(lightning: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """Every observable difference of one script, one line each."""
    found: list[str] = []
    l_err, o_err = lightning.get("error"), ours.get("error")
    if (l_err is None) != (o_err is None):
        side = "lightning" if l_err else "fullshard"
        err = l_err or o_err
        found.append(f"exception: only {side} raised {err['type']} in {err['stage']}: {err['message'][:200]}")
    elif l_err and o_err:
        l_type, o_type = l_err["type"], EXCEPTION_NAMES.get(o_err["type"], o_err["type"])
        if l_type != o_type:
            found.append(
                f"exception: lightning raised {l_type}, fullshard {o_type} ({o_err['message'][:150]})"
            )
        elif l_err["stage"] != o_err["stage"]:
            found.append(
                f"exception: {l_type} raised in {o_err['stage']} by fullshard, in {l_err['stage']} by lightning"
                f" ({o_err['message'][:150]})"
            )
    # a metrics snapshot taken after the stage both frameworks raised the same exception in is
    # told apart: what the metrics hold then depends on where the step was cut short
    crashed = l_err["stage"] if l_err and o_err and not found else None
    if found and (o_err or {}).get("stage") == "build":
        # fullshard refused the script at construction: what Lightning went on to do is the
        # consequence of that one difference, not another one
        return found
    ours_events = [_lightning_names(e) for e in ours["events"]]
    if lightning["events"] != ours_events:
        # one line per place where the hook sequences part (at most 8: the rest follow from them),
        # named by the script's part it is in (the last "S <part>" mark before it: fit, resume, ...)
        matcher = difflib.SequenceMatcher(None, lightning["events"], ours_events, autojunk=False)
        for group in list(matcher.get_grouped_opcodes(1))[:8]:
            start = group[0][1]
            marks = [e[2:] for e in lightning["events"][: start + 1] if e.startswith("S ")]
            lines: list[str] = []
            for tag, i1, i2, j1, j2 in group:
                if tag == "equal":
                    lines += [" " + e for e in lightning["events"][i1:i2]]
                    continue
                lines += ["-" + e for e in lightning["events"][i1:i2]]
                lines += ["+" + e for e in ours_events[j1:j2]]
            found.append(f"events [{marks[-1] if marks else 'start'}]: " + " | ".join(lines[:12]))
    elif lightning["states"] != ours["states"]:
        at = next(
            i for i, (a, b) in enumerate(zip(lightning["states"], ours["states"], strict=False)) if a != b
        )
        found.append(
            f"events: at {lightning['events'][at]} lightning is at {lightning['states'][at]}, fullshard at {ours['states'][at]}"
        )
    for a, b in zip(lightning["metrics"], ours["metrics"], strict=False):
        kind = "metrics (after the exception)" if crashed and a["point"].split()[0] == crashed else "metrics"
        for key in ("callback_metrics", "logged_metrics", "progress_bar_metrics"):
            if not close(a[key], b[key]):
                found.append(
                    f"{kind}: {key} after {a['point']}: lightning {_short(a[key])}, fullshard {_short(b[key])}"
                )
    if len(lightning["metrics"]) != len(ours["metrics"]):
        found.append(
            f"metrics: {len(lightning['metrics'])} snapshots under lightning, {len(ours['metrics'])} under fullshard"
        )
    for key in sorted(set(lightning["values"]) | set(ours["values"])):
        a, b = lightning["values"].get(key), ours["values"].get(key)
        if not close(a, b):
            found.append(f"values: {key}: lightning {_short(a)}, fullshard {_short(b)}")
    l_warn, o_warn = warning_topics(lightning["warnings"]), warning_topics(ours["warnings"])
    for topic in sorted(set(l_warn) | set(o_warn)):
        if l_warn.count(topic) != o_warn.count(topic):
            found.append(
                f"warnings: {topic!r} {l_warn.count(topic)}x under lightning, {o_warn.count(topic)}x under fullshard"
            )
    if lightning["files"] != ours["files"]:
        only_l = sorted(set(lightning["files"]) - set(ours["files"]))
        only_o = sorted(set(ours["files"]) - set(lightning["files"]))
        found.append(f"files: only lightning wrote {only_l}, only fullshard wrote {only_o}")
    for name in sorted(set(lightning["checkpoints"]) & set(ours["checkpoints"])):
        a, b = lightning["checkpoints"][name], ours["checkpoints"][name]
        if not isinstance(a, dict) or not isinstance(b, dict):
            if a != b:
                found.append(f"checkpoints: {name}: lightning {a}, fullshard {b}")
            continue
        missing = sorted(set(a["keys"]) - set(b["keys"]))  # fullshard's extra keys are its own records
        if missing:
            found.append(f"checkpoints: {name} lacks {missing} under fullshard")
        for key in ("global_step", "epoch", "state_dict", "callbacks", "optimizer_states", "lr_schedulers"):
            if a[key] != b[key]:
                found.append(f"checkpoints: {name} {key}: lightning {a[key]}, fullshard {b[key]}")
    for name in sorted(set(lightning["csv"]) & set(ours["csv"])):
        a_rows, b_rows = _csv_rows(lightning["csv"][name]), _csv_rows(ours["csv"][name])
        if not close(a_rows, b_rows):
            found.append(f"csv: {name}: lightning {_short(a_rows)}, fullshard {_short(b_rows)}")
    l_tb, o_tb = lightning.get("tensorboard", {}), ours.get("tensorboard", {})
    for name in sorted(set(l_tb) | set(o_tb)):
        a, b = l_tb.get(name), o_tb.get(name)
        if not close(a, b):
            found.append(f"tensorboard: {name}: lightning {_short(a)}, fullshard {_short(b)}")
    return found


def accepted(docs: Path = DOCS, heading: str = ACCEPTED_HEADING) -> list[tuple[str, str]]:
    """(pattern, reason) of each accepted difference in docs/lightning.md (``heading``: its table;
    :data:`ACCEPTED_DDP_HEADING`, those only the 2-process subset shows)."""
    text = docs.read_text()
    if heading not in text:
        return []
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        # cells split at pipes a backslash does not escape; "\\|" in a cell is a "|" (markdown)
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows.append((cells[0].strip("`"), cells[1]))
    return rows


def unexplained(found: list[str], rules: list[tuple[str, str]]) -> list[str]:
    """The lines of ``found`` that no rule accepts. An accepted exception explains the rest of its
    script: what follows a run that one framework ended and the other did not is its consequence
    (the exception line comes first, see :func:`differences`); an accepted difference in the
    batches a part trained on explains the rest of that part's hooks."""

    def accepted_line(line: str) -> bool:
        return any(re.search(pattern, line) for pattern, _ in rules)

    if found and found[0].startswith("exception:") and accepted_line(found[0]):
        return [line for line in found if line.startswith("exception:") and not accepted_line(line)]
    # An accepted difference in which batches a part of the script trained on (a batch-start hook
    # given other samples) explains the rest of that part's hook sequence: a step that returns
    # None on one batch and a loss on another is its consequence.
    reordered = {
        m.group(1)
        for line in found
        if (m := re.match(r"events \[(\w+)\]: .*on_train_batch_start\(", line)) and accepted_line(line)
    }
    return [
        line
        for line in found
        if not accepted_line(line) and not re.match(rf"events \[({'|'.join(reordered) or '$^'})\]: ", line)
    ]
