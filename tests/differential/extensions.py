"""The generator's second round of features: the rest of Lightning's callbacks, a DataModule's own
hooks, torchmetrics Metric objects given to ``self.log``, a TensorBoardLogger and the tuner.

They are drawn from a random stream of their own (:func:`draw`, seeded by the script's seed), so
the features of the first round (generate.py) stay as they were drawn; :func:`generate.render`
asks this module for the lines each feature adds. Every feature is plain JSON under the spec's
``"more"`` key, so the minimizer drops them as it drops the others.
"""

from __future__ import annotations

import os
import random
from typing import Any

# callbacks of Lightning's set beyond ModelCheckpoint, EarlyStopping and LearningRateMonitor, as a
# user writes them (the arguments drawn in draw())
CALLBACKS = (
    "StochasticWeightAveraging",
    "GradientAccumulationScheduler",
    "Timer",
    "BackboneFinetuning",
    "ModelPruning",
    "ModelSummary",
    "LambdaCallback",
    "EMAWeightAveraging",
    "SpikeDetection",
    "OnExceptionCheckpoint",
    "LearningRateFinder",
    "PredictionWriter",
)
# DataModule hooks a script may define itself (the recorder records them all either way)
DATAMODULE_HOOKS: dict[str, tuple[str, str]] = {
    "prepare_data": ("self", "self.calls.append('prepare_data')"),
    "setup": ("self, stage", "self.calls.append(['setup', stage])"),
    "teardown": ("self, stage", "self.calls.append(['teardown', stage])"),
    "state_dict": ("self", "return {'calls': len(self.calls)}"),
    "load_state_dict": ("self, state_dict", "self.calls.append(['loaded', state_dict])"),
    "on_before_batch_transfer": ("self, batch, dataloader_idx", "return batch"),
    "on_after_batch_transfer": ("self, batch, dataloader_idx", "return [batch[0] * 1.0, batch[1]]"),
}


# DIFFERENTIAL_BATCH_SIZE_FINDER=1 draws Tuner.scale_batch_size calls too (fuzz.py's runs inherit it)
BATCH_SIZE_FINDER = os.environ.get("DIFFERENTIAL_BATCH_SIZE_FINDER") == "1"


def _pick(rng: random.Random, *options: Any) -> Any:
    return rng.choice(options)


def draw(seed: int, base: dict[str, Any]) -> dict[str, Any]:
    """The second-round features of script ``seed``, given its first-round spec ``base``."""
    rng = random.Random(f"more-{seed}")
    automatic_single = not base["manual"] and base["optim"]["count"] == 1
    callbacks: list[dict[str, Any]] = []
    for kind in CALLBACKS:
        if rng.random() >= 0.06:
            continue
        # mostly scripts the callback can run in (what Lightning refuses is drawn rarely)
        if kind in ("BackboneFinetuning", "LearningRateFinder") and not automatic_single:
            continue
        if kind in ("StochasticWeightAveraging", "GradientAccumulationScheduler") and not automatic_single:
            continue
        if kind == "GradientAccumulationScheduler" and "accumulate_grad_batches" in base["trainer"]:
            continue
        if kind == "OnExceptionCheckpoint" and not base["trainer"]["enable_checkpointing"]:
            continue
        args: dict[str, Any] = {}
        if kind == "StochasticWeightAveraging":
            args = {"swa_lrs": _pick(rng, 0.05, 0.01), "swa_epoch_start": _pick(rng, 1, 0.5, 2)}
            if (
                isinstance(args["swa_epoch_start"], int)
                and args["swa_epoch_start"] >= base["trainer"]["max_epochs"]
            ):
                # averaging that never starts: Lightning 2.6.6 still copies its average (the weights
                # at fit start) into the model when fit ends, losing the training (docs/lightning.md,
                # "Differences found by machine"), which no accepted row can single out
                args["swa_epoch_start"] = 0.5
        elif kind == "GradientAccumulationScheduler":
            # [epoch, factor] pairs: the spec is JSON, whose keys are strings
            args = {"scheduling": _pick(rng, [[0, 2]], [[0, 1], [1, 2]], [[1, 3]])}
        elif kind == "Timer":
            args = {"duration": "00:00:10:00", "interval": _pick(rng, "step", "epoch")}
        elif kind == "BackboneFinetuning":
            args = {"unfreeze_backbone_at_epoch": _pick(rng, 1, 2)}
        elif kind == "ModelPruning":
            args = {"pruning_fn": "l1_unstructured", "amount": _pick(rng, 0.3, 0.5)}
        elif kind == "ModelSummary":
            args = {"max_depth": _pick(rng, 1, 2, -1)}
        elif kind == "SpikeDetection":
            args = {"warmup": _pick(rng, 1, 2), "exclude_batches_path": "spikes"}
        elif kind == "OnExceptionCheckpoint":
            args = {"dirpath": "on_exception"}
        elif kind == "LearningRateFinder":
            args = {"num_training_steps": 4, "early_stop_threshold": None}
        elif kind == "PredictionWriter":
            args = {"write_interval": _pick(rng, "batch", "epoch", "batch_and_epoch")}
        callbacks.append({"kind": kind, **args})
    kinds = {c["kind"] for c in base["callbacks"]}
    early_stopping: dict[str, Any] = {}
    if "EarlyStopping" in kinds and rng.random() < 0.5:
        for key, options in (
            ("min_delta", (0.0, 0.01, 1.0)),
            ("stopping_threshold", (0.5, 10.0)),
            ("divergence_threshold", (0.01, 100.0)),
            ("check_finite", (False,)),
        ):
            if rng.random() < 0.35:
                early_stopping[key] = rng.choice(options)
    checkpoint: dict[str, Any] = {}
    if "ModelCheckpoint" in kinds and rng.random() < 0.5:
        for key, options in (
            ("every_n_epochs", (1, 2)),
            ("save_on_train_epoch_end", (True, False)),
            ("save_weights_only", (True,)),
            ("auto_insert_metric_name", (False,)),
            ("enable_version_counter", (False,)),
        ):
            if rng.random() < 0.3:
                checkpoint[key] = rng.choice(options)
    metric = None
    if rng.random() < 0.15:
        metric = {
            "stage": _pick(rng, "train", "val", "val") if base["validation"]["loaders"] else "train",
            "on_step": _pick(rng, True, False),
            "kind": _pick(rng, "MeanSquaredError", "MeanAbsoluteError"),
        }
    datamodule_hooks: list[str] = []
    if base["datamodule"] and rng.random() < 0.6:
        datamodule_hooks = sorted(rng.sample(sorted(DATAMODULE_HOOKS), k=_pick(rng, 0, 1, 2, 3, 4)))
    tensorboard = isinstance(base["loggers"], list) and rng.random() < 0.15
    lr_find = automatic_single and rng.random() < 0.05
    # Tuner.scale_batch_size: the DataModule's batch_size attribute, its loader built with it.
    # Drawn only when asked for (BATCH_SIZE_FINDER): fullshard's finder does not match Lightning's
    # yet (docs/lightning.md, "Differences found by machine"), so the corpus leaves it out
    scale_batch_size = BATCH_SIZE_FINDER and (
        base["datamodule"]
        and not base["data"]["iterable"]
        and not base["data"]["empty_train"]
        and rng.random() < 0.2
    )
    return {
        "callbacks": callbacks,
        "early_stopping": early_stopping,
        "checkpoint": checkpoint,
        "metric": metric,
        "datamodule_hooks": datamodule_hooks,
        "tensorboard": tensorboard,
        "lr_find": lr_find,
        "scale_batch_size": scale_batch_size,
    }


def _more(s: dict[str, Any]) -> dict[str, Any]:
    return s.get("more") or {}


def callback_names(s: dict[str, Any]) -> list[str]:
    """The callback classes the script imports beside the first round's."""
    names = sorted({c["kind"] for c in _more(s).get("callbacks", [])} - {"PredictionWriter"})
    if any(c["kind"] == "PredictionWriter" for c in _more(s).get("callbacks", [])):
        names.append("BasePredictionWriter")
    return sorted(names)


def imports(s: dict[str, Any]) -> list[str]:
    more = _more(s)
    out = []
    if more.get("metric"):
        out.append("import torchmetrics")
    if more.get("lr_find") or more.get("scale_batch_size"):
        out.append("from lightning.pytorch.tuner import Tuner")
    if more.get("datamodule_hooks") is not None and s["datamodule"] and more.get("datamodule_hooks"):
        out.append("from recording import RecordDataModuleHooks")
    return out


def classes(s: dict[str, Any]) -> list[str]:
    """Classes the script defines before its model (a prediction writer)."""
    for c in _more(s).get("callbacks", []):
        if c["kind"] == "PredictionWriter":
            return [
                "class Writer(BasePredictionWriter):",
                "    def __init__(self, write_interval):",
                "        super().__init__(write_interval)",
                "        self.written = []",
                "",
                "    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,"
                " dataloader_idx):",
                "        self.written.append(['batch', batch_idx, dataloader_idx, list(batch_indices or [])])",
                "",
                "    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):",
                "        self.written.append(['epoch', len(predictions), [list(b) for b in batch_indices]])",
                "",
                "",
            ]
    return []


def backbone(s: dict[str, Any]) -> bool:
    return any(c["kind"] == "BackboneFinetuning" for c in _more(s).get("callbacks", []))


def module_init(s: dict[str, Any]) -> list[str]:
    more, out = _more(s), []
    if backbone(s):
        out.append("        self.backbone = nn.Linear(4, 4)")
    if more.get("metric"):
        out.append(f"        self.metric = torchmetrics.{more['metric']['kind']}()")
    if tunes_lr(s):
        out.append("        self.lr = 0.05")
    return out


def forward_input(s: dict[str, Any]) -> str:
    return "self.backbone(x)" if backbone(s) else "x"


def metric_lines(s: dict[str, Any], stage: str) -> list[str]:
    metric = _more(s).get("metric")
    if not metric or metric["stage"] != stage:
        return []
    name = "train_metric" if stage == "train" else "val_metric"
    return [
        "        self.metric(self(x), y)",
        f"        self.log({name!r}, self.metric, on_step={metric['on_step']}, on_epoch=True)",
    ]


def optimizer_params(s: dict[str, Any], default: str) -> str:
    return "filter(lambda p: p.requires_grad, self.parameters())" if backbone(s) else default


def tunes_lr(s: dict[str, Any]) -> bool:
    """Whether the learning-rate finder runs (its attribute ``lr`` is then the optimizer's)."""
    return bool(_more(s).get("lr_find")) or any(
        c["kind"] == "LearningRateFinder" for c in _more(s).get("callbacks", [])
    )


def learning_rate(s: dict[str, Any], default: str) -> str:
    return "self.lr" if tunes_lr(s) else default


def datamodule_batch_size(s: dict[str, Any]) -> str:
    """The argument of the DataModule's ``train_loader`` call: its ``batch_size`` attribute where
    the batch size finder scales it."""
    return "self.batch_size" if _more(s).get("scale_batch_size") else ""


def datamodule_lines(s: dict[str, Any]) -> tuple[str, list[str]]:
    """The DataModule's bases and the hooks it defines beside its loaders."""
    hooks = _more(s).get("datamodule_hooks") or []
    scaled = _more(s).get("scale_batch_size")
    if not hooks and not scaled:
        return "L.LightningDataModule", []
    out = ["    def __init__(self):", "        super().__init__()", "        self.calls = []"]
    if scaled:
        out.append(f"        self.batch_size = {s['data']['batch_size']}")
    out.append("")
    for hook in hooks:
        params, body = DATAMODULE_HOOKS[hook]
        out += [f"    def {hook}({params}):", f"        {body}", ""]
    return ("RecordDataModuleHooks, L.LightningDataModule" if hooks else "L.LightningDataModule"), out


def callback_calls(s: dict[str, Any]) -> list[str]:
    out = []
    for c in _more(s).get("callbacks", []):
        args = {k: v for k, v in c.items() if k != "kind"}
        if c["kind"] == "LambdaCallback":
            out.append(
                "LambdaCallback(on_train_epoch_end=lambda trainer, module: module.log('lambda_mark', 2.0))"
            )
        elif c["kind"] == "PredictionWriter":
            out.append(f"Writer({args['write_interval']!r})")
        elif c["kind"] == "GradientAccumulationScheduler":
            out.append(f"GradientAccumulationScheduler(scheduling={dict(map(tuple, args['scheduling']))!r})")
        else:
            out.append(f"{c['kind']}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
    return out


def callback_extra(s: dict[str, Any], kind: str) -> dict[str, Any]:
    """Extra arguments of a first-round EarlyStopping or ModelCheckpoint."""
    key = {"EarlyStopping": "early_stopping", "ModelCheckpoint": "checkpoint"}.get(kind)
    return dict(_more(s).get(key, {})) if key else {}


def logger_extra(s: dict[str, Any]) -> list[str]:
    return ["TensorBoardLogger('tb')"] if _more(s).get("tensorboard") else []


def before_fit(s: dict[str, Any], fit_args: str) -> list[str]:
    out = []
    if _more(s).get("scale_batch_size"):
        out += [
            "    mark('scale_batch_size')",
            f"    found = Tuner(trainer).scale_batch_size({fit_args}, mode='power', steps_per_trial=1, max_trials=3)",
            "    value('scale_batch_size', [found, data.batch_size])",
        ]
    if not _more(s).get("lr_find"):
        return out
    return [
        *out,
        "    mark('lr_find')",
        f"    finder = Tuner(trainer).lr_find({fit_args}, num_training=5, early_stop_threshold=None)",
        "    value('lr_find', [len(finder.results['lr']), model.lr])",
    ]


def after_all(s: dict[str, Any]) -> list[str]:
    out = []
    if any(c["kind"] == "PredictionWriter" for c in _more(s).get("callbacks", [])):
        out.append("    value('written', [c.written for c in trainer.callbacks if isinstance(c, Writer)])")
    if s["datamodule"] and _more(s).get("datamodule_hooks"):
        out.append("    value('datamodule calls', data.calls)")
    return out
