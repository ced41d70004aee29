"""Small, valid Lightning scripts drawn from a grammar, one per seed.

:func:`spec` draws a script's features from ``random.Random(seed)`` (Trainer arguments, which
hooks and steps the module defines and what they return, what it logs and how, its optimizers
and schedulers, its data, callbacks and loggers, which stages run); :func:`render` writes the
script as a Lightning 2.6.6 user would (``import lightning.pytorch as L``), and :func:`port` makes
the fullshard script from it by changing the imports only, as a porting user does. The spec is
plain JSON data, so a difference can be minimized by dropping features (``minimize.py``).

Every script records what a user could observe through the recorders of tests/porting/recording.py
(the hooks called, in order, with their arguments' gist; the metrics after each stage), a logger
of its own (every ``log_metrics``/``log_hyperparams`` call) and its own values (what each stage
returned, the Trainer's counters); the runner adds files, checkpoints, warnings and exceptions.
"""

from __future__ import annotations

import random
from typing import Any

import extensions

FEATURES = (
    "trainer",
    "training_step",
    "validation",
    "test",
    "predict",
    "logging",
    "epoch_end_logging",
    "optim",
    "data",
    "callbacks",
    "loggers",
    "hooks",
    "manual",
    "datamodule",
)

# Module hooks a generated script may define itself (beside the recorder's defaults), each with a
# body that changes nothing but what it returns, where the hook's return value matters.
MODULE_HOOK_BODIES: dict[str, str] = {
    "on_train_batch_start": "if batch_idx == {skip_at}:\n            return -1",
    "on_train_epoch_end": "self.log('epoch_mark', float(self.current_epoch))",
    "on_validation_epoch_end": "self.log('val_mark', 1.0 + self.current_epoch)",
    "on_before_optimizer_step": "self.log('grad_seen', 1.0)",
    "on_save_checkpoint": "checkpoint['user_note'] = 'kept'",
    "on_load_checkpoint": "self.loaded_note = checkpoint.get('user_note')",
    "on_fit_start": "self.fit_started = True",
    "on_validation_model_eval": "self.eval()",
}


def _pick(rng: random.Random, *options: Any, weights: list[float] | None = None) -> Any:
    return rng.choices(options, weights=weights)[0]


def spec(seed: int) -> dict[str, Any]:
    """The features of script number ``seed`` (plain JSON data)."""
    rng = random.Random(seed)
    manual = rng.random() < 0.15
    trainer: dict[str, Any] = {}
    if rng.random() < 0.5:
        trainer["max_epochs"] = _pick(rng, 1, 2, 3)
    else:
        trainer["max_steps"] = _pick(rng, 1, 3, 5, 8)
        # bounded: a skipped epoch (on_train_batch_start returning -1) takes no step, so
        # max_steps alone could loop for ever, as under Lightning
        trainer["max_epochs"] = _pick(rng, 1, 2, 4)
    for key, options in (
        ("limit_train_batches", (2, 3, 0.5, 1.0, 0)),
        ("limit_val_batches", (1, 2, 0.5, 0)),
        ("limit_test_batches", (1, 2, 0.5)),
        ("limit_predict_batches", (1, 2)),
        ("val_check_interval", (1.0, 0.5, 0.5, 1, 2)),
        ("check_val_every_n_epoch", (1, 2, None)),
        ("num_sanity_val_steps", (0, 1, 2, -1)),
        ("log_every_n_steps", (1, 2, 3, 50)),
        ("min_epochs", (1, 2)),
        ("min_steps", (2, 4)),
        ("reload_dataloaders_every_n_epochs", (1, 2)),
    ):
        if rng.random() < 0.22:
            trainer[key] = rng.choice(options)
    if not manual:
        if rng.random() < 0.25:
            trainer["accumulate_grad_batches"] = _pick(rng, 2, 3)
        if rng.random() < 0.2:
            trainer["gradient_clip_val"] = _pick(rng, 0.05, 0.5)
            if rng.random() < 0.5:
                trainer["gradient_clip_algorithm"] = _pick(rng, "norm", "value")
    if rng.random() < 0.08:
        trainer["fast_dev_run"] = _pick(rng, True, 2)
    if rng.random() < 0.08:
        trainer["overfit_batches"] = _pick(rng, 1, 2, 0.5)
    if rng.random() < 0.1:
        trainer["deterministic"] = True
    if rng.random() < 0.1:
        trainer["precision"] = _pick(rng, "32-true", "bf16-mixed", "64-true")
    if rng.random() < 0.05:
        trainer["barebones"] = True
    trainer["enable_checkpointing"] = rng.random() < 0.35
    trainer["enable_model_summary"] = rng.random() < 0.2

    training_step = {
        "returns": _pick(rng, "loss", "dict", "dict_extra", "none_if_high", weights=[6, 2, 1, 1]),
        "batch_idx": rng.random() < 0.85,
    }
    n_val = _pick(rng, 0, 1, 1, 1, 2)
    validation = {
        "loaders": n_val,
        "dataloader_idx": n_val > 1 or rng.random() < 0.2,
        "returns": _pick(rng, "none", "loss", "dict"),
    }
    test = {"run": rng.random() < 0.4, "loaders": _pick(rng, 1, 1, 2)}
    predict = {"run": rng.random() < 0.3, "returns": _pick(rng, "tensor", "dict", "none", weights=[4, 1, 1])}
    validate_run = rng.random() < 0.3

    def log_call(name: str, stage: str) -> dict[str, Any]:
        call: dict[str, Any] = {"name": name}
        for key, options in (
            ("on_step", (True, False)),
            ("on_epoch", (True, False)),
            ("prog_bar", (True, False)),
            ("logger", (True, False)),
            ("reduce_fx", ("mean", "sum", "max", "min")),
            ("batch_size", (1, 2, 5)),
            ("sync_dist", (True,)),
        ):
            if rng.random() < 0.3:
                call[key] = rng.choice(options)
        if stage != "train" and rng.random() < 0.2:
            call["add_dataloader_idx"] = rng.choice((True, False))
        on_step = call.get("on_step", stage == "train")
        on_epoch = call.get("on_epoch", stage != "train")
        if not on_step and not on_epoch and rng.random() < 0.9:  # mostly a call that records something
            call["on_epoch"] = True
        return call

    logging: dict[str, list[dict[str, Any]]] = {
        "train": [log_call("train_loss", "train")]
        + ([log_call("train_aux", "train")] if rng.random() < 0.3 else []),
        "val": [log_call("val_loss", "val")] if rng.random() < 0.9 else [],
        "test": [log_call("test_loss", "test")],
    }
    log_dict = rng.random() < 0.2

    def monitored() -> str:
        """A metric to monitor: mostly one the script logs (val_loss only where validation logs it)."""
        if rng.random() < 0.1:
            return _pick(rng, "val_loss", "train_loss")
        return "val_loss" if n_val and logging["val"] and rng.random() < 0.6 else "train_loss"

    epoch_end_logging = rng.random() < 0.2

    optim: dict[str, Any] = {
        "optimizer": _pick(rng, "SGD", "Adam"),
        "count": 2 if manual and rng.random() < 0.4 else 1,
    }
    if rng.random() < 0.45:
        kind = _pick(rng, "StepLR", "ExponentialLR", "plateau")
        optim["scheduler"] = {
            "kind": kind,
            "form": _pick(rng, "dict", "list") if kind != "plateau" else "dict",
            "interval": _pick(rng, "epoch", "step"),
            "frequency": _pick(rng, 1, 2),
            "monitor": monitored() if kind == "plateau" else None,
        }
    data = {
        "train_size": _pick(rng, 6, 8, 10, 12, 7),
        "val_size": _pick(rng, 4, 6, 5),
        "batch_size": _pick(rng, 2, 3, 4),
        "iterable": rng.random() < 0.12,
        "shuffle": rng.random() < 0.3,
        "drop_last": rng.random() < 0.15,
        "empty_train": rng.random() < 0.03,
    }
    callbacks: list[dict[str, Any]] = []
    if trainer["enable_checkpointing"] and rng.random() < 0.7:
        ckpt: dict[str, Any] = {"kind": "ModelCheckpoint"}
        if rng.random() < 0.5:
            ckpt["monitor"] = monitored()
            ckpt["mode"] = _pick(rng, "min", "max")
            ckpt["save_top_k"] = _pick(rng, 1, 2, -1)
        if rng.random() < 0.3:
            ckpt["every_n_train_steps"] = _pick(rng, 1, 2)
        if rng.random() < 0.4:
            ckpt["save_last"] = True
        if rng.random() < 0.3:
            ckpt["filename"] = "{epoch}-{step}"
        callbacks.append(ckpt)
    if rng.random() < 0.25:
        callbacks.append(
            {
                "kind": "EarlyStopping",
                "monitor": monitored(),
                "patience": _pick(rng, 0, 1, 3),
                "mode": _pick(rng, "min", "max"),
                "check_on_train_epoch_end": _pick(rng, None, True, False),
            }
        )
    # no TensorBoardLogger: Lightning's environment has no tensorboard (its default logger then is
    # a CSVLogger, which tests/twins/bars_loggers.py compares), and fullshard's test extra has it
    loggers = _pick(rng, [], ["memory"], ["memory", "csv"], ["csv"], ["csv", "memory"], False)
    if rng.random() < 0.2 and (loggers or rng.random() < 0.1):  # mostly where it has a logger to write to
        callbacks.append(
            {"kind": "LearningRateMonitor", "logging_interval": _pick(rng, None, "step", "epoch")}
        )
    hooks = sorted(rng.sample(sorted(MODULE_HOOK_BODIES), k=_pick(rng, 0, 1, 2, 3)))
    if trainer.get("barebones") and rng.random() < 0.8:  # mostly what barebones allows
        trainer.update(enable_checkpointing=False, enable_model_summary=False)
        loggers, callbacks, log_dict, epoch_end_logging = False, [], False, False
        logging = {"train": [], "val": [], "test": []}
        hooks = [h for h in hooks if "self.log" not in MODULE_HOOK_BODIES[h]]
    drawn = {
        "seed": seed,
        "trainer": trainer,
        "training_step": training_step,
        "validation": validation,
        "validate": validate_run,
        "test": test,
        "predict": predict,
        "logging": logging,
        "log_dict": log_dict,
        "epoch_end_logging": epoch_end_logging,
        "optim": optim,
        "data": data,
        "callbacks": callbacks,
        "loggers": loggers,
        "hooks": hooks,
        "skip_at": _pick(rng, 0, 1, 2),
        "manual": manual,
        "datamodule": rng.random() < 0.25,
        "resume": trainer["enable_checkpointing"] and rng.random() < 0.3,
    }
    drawn["more"] = extensions.draw(seed, drawn)
    return drawn


# ---------------------------------------------------------------------------------- render
def _kwargs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items())


def _log_lines(calls: list[dict[str, Any]], value: str, indent: str) -> list[str]:
    lines = []
    for call in calls:
        options = {k: v for k, v in call.items() if k != "name"}
        extra = (", " + _kwargs(options)) if options else ""
        lines.append(f"{indent}self.log({call['name']!r}, {value}{extra})")
    return lines


def _training_step(s: dict[str, Any]) -> list[str]:
    step = s["training_step"]
    args = "self, batch, batch_idx" if step["batch_idx"] else "self, batch"
    out = [f"    def training_step({args}):", "        x, y = batch", "        loss = F.mse_loss(self(x), y)"]
    out += extensions.metric_lines(s, "train")
    if s["manual"]:
        opts = "opt_a, opt_b = self.optimizers()" if s["optim"]["count"] == 2 else "opt_a = self.optimizers()"
        out += [
            f"        {opts}",
            "        opt_a.zero_grad()",
            "        self.manual_backward(loss)",
            "        opt_a.step()",
        ]
        if s["optim"]["count"] == 2:
            out += [
                "        opt_b.zero_grad()",
                "        self.manual_backward(F.mse_loss(self(x), y) * 0.5)",
                "        opt_b.step()",
            ]
        if s["optim"].get("scheduler") and s["optim"]["scheduler"]["kind"] != "plateau":
            out += [
                "        sched = self.lr_schedulers()",
                "        (sched[0] if isinstance(sched, list) else sched).step()",
            ]
    out += _log_lines(s["logging"]["train"], "loss", "        ")
    if s["log_dict"]:
        out.append(
            "        self.log_dict({'dict_a': loss * 2, 'dict_b': float(loss) + 1.0}, on_step=True, on_epoch=True)"
        )
    returns = step["returns"]
    if returns == "loss":
        out.append("        return loss")
    elif returns == "dict":
        out.append("        return {'loss': loss}")
    elif returns == "dict_extra":
        out.append("        return {'loss': loss, 'pred_mean': self(x).mean().detach()}")
    else:
        out += ["        if float(loss) > 1.0:", "            return None", "        return loss"]
    return out


def _eval_step(s: dict[str, Any], stage: str, loaders: int, with_idx: bool, returns: str) -> list[str]:
    args = "self, batch, batch_idx, dataloader_idx=0" if with_idx else "self, batch, batch_idx"
    out = [f"    def {stage}_step({args}):", "        x, y = batch", "        loss = F.mse_loss(self(x), y)"]
    out += _log_lines(s["logging"]["val" if stage == "validation" else "test"], "loss", "        ")
    if stage == "validation":
        out += extensions.metric_lines(s, "val")
    if returns == "loss":
        out.append("        return loss")
    elif returns == "dict":
        out.append("        return {'loss': loss}")
    return out


def _configure_optimizers(s: dict[str, Any]) -> list[str]:
    optim = s["optim"]
    make = (
        f"torch.optim.SGD({{params}}, lr={extensions.learning_rate(s, '0.1')})"
        if optim["optimizer"] == "SGD"
        else f"torch.optim.Adam({{params}}, lr={extensions.learning_rate(s, '0.01')})"
    )
    out = ["    def configure_optimizers(self):"]
    if optim["count"] == 2:
        out.append("        opt_a = " + make.format(params="self.layer.parameters()"))
        out.append("        opt_b = " + make.format(params="self.head.parameters()"))
        opts = "[opt_a, opt_b]"
    else:
        out.append(
            "        opt_a = " + make.format(params=extensions.optimizer_params(s, "self.parameters()"))
        )
        opts = "opt_a"
    sched = optim.get("scheduler")
    if not sched:
        out.append(f"        return {opts}")
        return out
    if sched["kind"] == "StepLR":
        out.append("        sched = torch.optim.lr_scheduler.StepLR(opt_a, step_size=1, gamma=0.5)")
    elif sched["kind"] == "ExponentialLR":
        out.append("        sched = torch.optim.lr_scheduler.ExponentialLR(opt_a, gamma=0.9)")
    else:
        out.append("        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt_a, patience=0)")
    if sched["form"] == "list":
        out.append(f"        return {opts if optim['count'] == 2 else '[opt_a]'}, [sched]")
        return out
    config: dict[str, Any] = {"interval": sched["interval"], "frequency": sched["frequency"]}
    if sched["monitor"]:
        config["monitor"] = sched["monitor"]
    items = ", ".join(f"{k!r}: {v!r}" for k, v in config.items())
    if optim["count"] == 2:
        out.append(
            f"        return [{{'optimizer': opt_a, 'lr_scheduler': {{'scheduler': sched, {items}}}}}, {{'optimizer': opt_b}}]"
        )
    else:
        out.append(f"        return {{'optimizer': opt_a, 'lr_scheduler': {{'scheduler': sched, {items}}}}}")
    return out


def _loaders(s: dict[str, Any]) -> list[str]:
    data = s["data"]
    out = [
        "def tensors(n, seed):",
        "    g = torch.Generator().manual_seed(seed)",
        "    return torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)",
        "",
        "",
    ]
    if data["iterable"]:
        out += [
            "class Stream(IterableDataset):",
            "    def __init__(self, n, seed):",
            "        self.x, self.y = tensors(n, seed)",
            "",
            "    def __iter__(self):",
            "        return iter(zip(self.x, self.y))",
            "",
            "",
        ]
    train_ds = "Stream({n}, {seed})" if data["iterable"] else "TensorDataset(*tensors({n}, {seed}))"
    train_kw = "batch_size=batch_size"
    if data["shuffle"] and not data["iterable"]:
        train_kw += ", shuffle=True"
    if data["drop_last"]:
        train_kw += ", drop_last=True"
    n_train = 0 if data["empty_train"] else data["train_size"]
    out += [
        f"def train_loader(batch_size={data['batch_size']}):",
        f"    return DataLoader({train_ds.format(n=n_train, seed=1)}, {train_kw})",
        "",
        "",
        "def eval_loaders(count, seed):",
        f"    loaders = [DataLoader(TensorDataset(*tensors({data['val_size']} + i, seed + i)), batch_size={data['batch_size']})"
        " for i in range(count)]",
        "    return loaders[0] if count == 1 else loaders",
        "",
        "",
    ]
    return out


def render(s: dict[str, Any], *, strategy: str | None = None, devices: int = 1) -> str:
    """Script ``s`` as a Lightning 2.6.6 user writes it; with ``strategy``, its Trainers get
    ``devices=devices, strategy=strategy`` instead of ``devices=1`` (the 2-process subset)."""
    lines = [
        f'"""Generated Lightning script, seed {s["seed"]} (tests/differential/generate.py)."""',
        "import torch",
        "import torch.nn.functional as F",
        "from torch import nn",
        "from torch.utils.data import DataLoader, IterableDataset, TensorDataset",
        "",
        "import lightning.pytorch as L",
        "from lightning.pytorch.callbacks import "
        + ", ".join(
            ["EarlyStopping", "LearningRateMonitor", "ModelCheckpoint", *extensions.callback_names(s)]
        ),
        "from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger",
        "from recording import RecordCallbackHooks, RecordModuleHooks, mark, snapshot, value",
        *extensions.imports(s),
        "",
        "",
    ]
    lines += _loaders(s)
    lines += extensions.classes(s)
    lines += [
        "class Memory(Logger):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.calls = []",
        "",
        "    @property",
        "    def name(self):",
        "        return 'memory'",
        "",
        "    @property",
        "    def version(self):",
        "        return 0",
        "",
        "    def log_metrics(self, metrics, step=None):",
        "        self.calls.append([step, {k: round(float(v), 5) for k, v in sorted(metrics.items())}])",
        "",
        "    def log_hyperparams(self, params, *args, **kwargs):",
        "        self.calls.append(['hparams', sorted(dict(params))])",
        "",
        "",
        "class Recorder(RecordCallbackHooks, L.Callback):",
        "    pass",
        "",
        "",
        "class Net(RecordModuleHooks, L.LightningModule):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.layer = nn.Linear(4, 3)",
        "        self.head = nn.Linear(3, 1)",
        *extensions.module_init(s),
    ]
    if s["manual"]:
        lines.append("        self.automatic_optimization = False")
    forward = f"        return self.head(torch.tanh(self.layer({extensions.forward_input(s)})))"
    lines += ["", "    def forward(self, x):", forward, ""]
    lines += [*_training_step(s), ""]
    val = s["validation"]
    if val["loaders"]:
        lines += [*_eval_step(s, "validation", val["loaders"], val["dataloader_idx"], val["returns"]), ""]
    if s["test"]["run"]:
        lines += [*_eval_step(s, "test", s["test"]["loaders"], s["test"]["loaders"] > 1, "none"), ""]
    if s["predict"]["run"]:
        ret = {"tensor": "self(batch[0])", "dict": "{'y': self(batch[0])}", "none": "None"}[
            s["predict"]["returns"]
        ]
        lines += ["    def predict_step(self, batch, batch_idx):", f"        return {ret}", ""]
    if s["epoch_end_logging"]:
        lines += [
            "    def on_train_epoch_end(self):",
            "        self.log('epoch_end_value', torch.tensor(float(self.current_epoch)) + 0.5)",
            "",
        ]
    for hook in s["hooks"]:
        if hook == "on_train_epoch_end" and s["epoch_end_logging"]:
            continue
        params = {
            "on_train_batch_start": "batch, batch_idx",
            "on_save_checkpoint": "checkpoint",
            "on_load_checkpoint": "checkpoint",
            "on_before_optimizer_step": "optimizer",
        }.get(hook, "")
        body = MODULE_HOOK_BODIES[hook].format(skip_at=s["skip_at"])
        lines += [f"    def {hook}(self{', ' + params if params else ''}):", f"        {body}", ""]
    lines += [*_configure_optimizers(s), "", ""]
    if s["datamodule"]:
        bases, hooks = extensions.datamodule_lines(s)
        lines += [
            f"class Data({bases}):",
            *hooks,
            "    def train_dataloader(self):",
            f"        return train_loader({extensions.datamodule_batch_size(s)})",
            "",
        ]
        if val["loaders"]:
            lines += [
                "    def val_dataloader(self):",
                f"        return eval_loaders({val['loaders']}, 10)",
                "",
            ]
        if s["test"]["run"]:
            lines += [
                "    def test_dataloader(self):",
                f"        return eval_loaders({s['test']['loaders']}, 20)",
                "",
            ]
        if s["predict"]["run"]:
            lines += ["    def predict_dataloader(self):", "        return eval_loaders(1, 30)", ""]
        lines.append("")
    lines += _main(s)
    text = "\n".join(lines) + "\n"
    if strategy is not None:
        text = text.replace("devices=1,", f"devices={devices}, strategy={strategy!r},")
    return text


def _callback(c: dict[str, Any], s: dict[str, Any]) -> str:
    args = {k: v for k, v in c.items() if k != "kind" and v is not None}
    args.update(extensions.callback_extra(s, c["kind"]))
    if c["kind"] == "ModelCheckpoint":
        args = {"dirpath": "ckpts", **args}
    return f"{c['kind']}({_kwargs(args)})"


def _main(s: dict[str, Any]) -> list[str]:
    trainer = dict(s["trainer"])
    callbacks = ["Recorder()"] + [_callback(c, s) for c in s["callbacks"]] + extensions.callback_calls(s)
    if s["loggers"] is False:
        logger = "False"
    else:
        made = {"memory": "memory", "csv": "CSVLogger('logs')", "tensorboard": "TensorBoardLogger('logs')"}
        logger = "[" + ", ".join([*(made[name] for name in s["loggers"]), *extensions.logger_extra(s)]) + "]"
    val = s["validation"]
    out = [
        "def main():",
        f"    L.seed_everything({s['seed']})",
        "    memory = Memory()",
        "    model = Net()",
        "    trainer = L.Trainer(",
        "        accelerator='cpu', devices=1, enable_progress_bar=False, default_root_dir='.',",
        f"        callbacks=[{', '.join(callbacks)}],",
        f"        logger={logger},",
    ]
    if trainer:
        out.append(f"        {_kwargs(trainer)},")
    out.append("    )")
    if s["datamodule"]:
        out.append("    data = Data()")
        fit_args = "model, datamodule=data"
    else:
        fit_args = "model, train_dataloaders=train_loader()"
        if val["loaders"]:
            fit_args += f", val_dataloaders=eval_loaders({val['loaders']}, 10)"
    out += extensions.before_fit(s, fit_args)
    out += [
        "    try:",
        "        mark('fit')",
        f"        trainer.fit({fit_args})",
        "    finally:",
        "        snapshot('fit', trainer)",
        "        value('after fit', [trainer.global_step, trainer.current_epoch, trainer.state.status.value])",
    ]
    if s["resume"]:
        out += [
            "    mark('resume')",
            "    path = 'resume.ckpt'",
            "    trainer.save_checkpoint(path)",
            "    more = L.Trainer(accelerator='cpu', devices=1, enable_progress_bar=False, default_root_dir='.',"
            " logger=False, callbacks=[Recorder()], max_epochs=trainer.current_epoch + 1)",
            f"    more.fit(Net(), {fit_args.split(', ', 1)[1]}, ckpt_path=path)",
            "    value('after resume', [more.global_step, more.current_epoch])",
        ]
    eval_source = "datamodule=data" if s["datamodule"] else "dataloaders=eval_loaders({n}, {seed})"
    if s["validate"] and val["loaders"]:
        out += [
            "    mark('validate')",
            f"    value('validate', trainer.validate(model, {eval_source.format(n=val['loaders'], seed=10)}, verbose=False))",
            "    snapshot('validate', trainer)",
        ]
    if s["test"]["run"]:
        out += [
            "    mark('test')",
            f"    value('test', trainer.test(model, {eval_source.format(n=s['test']['loaders'], seed=20)}, verbose=False))",
            "    snapshot('test', trainer)",
        ]
    if s["predict"]["run"]:
        out += [
            "    mark('predict')",
            f"    predictions = trainer.predict(model, {eval_source.format(n=1, seed=30)})",
            "    value('predict', predictions)",
        ]
    out += [*extensions.after_all(s), "    value('memory logger', memory.calls)", ""]
    return out


def port(source: str) -> str:
    """The same script for fullshard: only the imports change, as a porting user changes them."""
    return source.replace("lightning.pytorch", "fullshard")
