"""The hooks the porting scripts record, with Lightning 2.x's parameter names (after ``self``).

Pure data, shared by the recorder (``recording.py``), the porting test and the table test.
"""

from __future__ import annotations

_NONE: tuple[str, ...] = ()
_BATCH = ("batch", "batch_idx", "dataloader_idx")
_BATCH_END = ("outputs", "batch", "batch_idx", "dataloader_idx")

# Every hook of ``LightningModule`` (``ModelHooks``, ``DataHooks``, ``CheckpointHooks`` and the
# optimisation hooks of ``LightningModule`` itself) except the deprecated
# ``configure_sharded_model`` and the dataloader methods (see STEP_METHODS).
MODULE_HOOKS: dict[str, tuple[str, ...]] = {
    "prepare_data": _NONE,
    "setup": ("stage",),
    "teardown": ("stage",),
    "configure_model": _NONE,
    "configure_callbacks": _NONE,
    "on_fit_start": _NONE,
    "on_fit_end": _NONE,
    "on_train_start": _NONE,
    "on_train_end": _NONE,
    "on_validation_start": _NONE,
    "on_validation_end": _NONE,
    "on_test_start": _NONE,
    "on_test_end": _NONE,
    "on_predict_start": _NONE,
    "on_predict_end": _NONE,
    "on_train_epoch_start": _NONE,
    "on_train_epoch_end": _NONE,
    "on_validation_epoch_start": _NONE,
    "on_validation_epoch_end": _NONE,
    "on_test_epoch_start": _NONE,
    "on_test_epoch_end": _NONE,
    "on_predict_epoch_start": _NONE,
    "on_predict_epoch_end": _NONE,
    "on_train_batch_start": ("batch", "batch_idx"),
    "on_train_batch_end": ("outputs", "batch", "batch_idx"),
    "on_validation_batch_start": _BATCH,
    "on_validation_batch_end": _BATCH_END,
    "on_test_batch_start": _BATCH,
    "on_test_batch_end": _BATCH_END,
    "on_predict_batch_start": _BATCH,
    "on_predict_batch_end": _BATCH_END,
    "on_validation_model_zero_grad": _NONE,
    "on_validation_model_eval": _NONE,
    "on_validation_model_train": _NONE,
    "on_test_model_eval": _NONE,
    "on_test_model_train": _NONE,
    "on_predict_model_eval": _NONE,
    "on_before_zero_grad": ("optimizer",),
    "on_before_backward": ("loss",),
    "on_after_backward": _NONE,
    "on_before_optimizer_step": ("optimizer",),
    "on_save_checkpoint": ("checkpoint",),
    "on_load_checkpoint": ("checkpoint",),
    "on_before_batch_transfer": ("batch", "dataloader_idx"),
    "transfer_batch_to_device": ("batch", "device", "dataloader_idx"),
    "on_after_batch_transfer": ("batch", "dataloader_idx"),
    "optimizer_step": ("epoch", "batch_idx", "optimizer", "optimizer_closure"),
    "optimizer_zero_grad": ("epoch", "batch_idx", "optimizer"),
    "lr_scheduler_step": ("scheduler", "metric"),
    "configure_gradient_clipping": ("optimizer", "gradient_clip_val", "gradient_clip_algorithm"),
    "backward": ("loss",),
}

# Methods a user defines (never given a default by the recorder: Lightning decides from whether
# they are overridden, e.g. whether there is validation data): recorded when a script defines them.
STEP_METHODS: dict[str, tuple[str, ...]] = {
    "training_step": ("batch", "batch_idx"),
    "validation_step": ("batch", "batch_idx", "dataloader_idx"),
    "test_step": ("batch", "batch_idx", "dataloader_idx"),
    "predict_step": ("batch", "batch_idx", "dataloader_idx"),
    "configure_optimizers": _NONE,
    "train_dataloader": _NONE,
    "val_dataloader": _NONE,
    "test_dataloader": _NONE,
    "predict_dataloader": _NONE,
}

# Every hook of Lightning's ``Callback`` (parameters after ``trainer, pl_module``; ``state_dict``
# and ``load_state_dict`` take no trainer).
CALLBACK_HOOKS: dict[str, tuple[str, ...]] = {
    "setup": ("stage",),
    "teardown": ("stage",),
    "on_fit_start": _NONE,
    "on_fit_end": _NONE,
    "on_sanity_check_start": _NONE,
    "on_sanity_check_end": _NONE,
    "on_train_start": _NONE,
    "on_train_end": _NONE,
    "on_validation_start": _NONE,
    "on_validation_end": _NONE,
    "on_test_start": _NONE,
    "on_test_end": _NONE,
    "on_predict_start": _NONE,
    "on_predict_end": _NONE,
    "on_train_epoch_start": _NONE,
    "on_train_epoch_end": _NONE,
    "on_validation_epoch_start": _NONE,
    "on_validation_epoch_end": _NONE,
    "on_test_epoch_start": _NONE,
    "on_test_epoch_end": _NONE,
    "on_predict_epoch_start": _NONE,
    "on_predict_epoch_end": _NONE,
    "on_train_batch_start": ("batch", "batch_idx"),
    "on_train_batch_end": ("outputs", "batch", "batch_idx"),
    "on_validation_batch_start": _BATCH,
    "on_validation_batch_end": _BATCH_END,
    "on_test_batch_start": _BATCH,
    "on_test_batch_end": _BATCH_END,
    "on_predict_batch_start": _BATCH,
    "on_predict_batch_end": _BATCH_END,
    "on_before_zero_grad": ("optimizer",),
    "on_before_backward": ("loss",),
    "on_after_backward": _NONE,
    "on_before_optimizer_step": ("optimizer",),
    "on_save_checkpoint": ("checkpoint",),
    "on_load_checkpoint": ("checkpoint",),
    "on_exception": ("exception",),
    "state_dict": _NONE,
    "load_state_dict": ("state_dict",),
}
CALLBACK_NO_TRAINER = frozenset({"state_dict", "load_state_dict"})

# ``LightningDataModule`` hooks with a default (the dataloader methods are STEP_METHODS). The
# batch-transfer hooks are left out: a DataModule that defines them takes them over from the
# module, so the recorder must not define them.
DATAMODULE_HOOKS: dict[str, tuple[str, ...]] = {
    "prepare_data": _NONE,
    "setup": ("stage",),
    "teardown": ("stage",),
    "state_dict": _NONE,
    "load_state_dict": ("state_dict",),
    "on_exception": ("exception",),
}

# [Note: hooks fullshard does not call]
# Lightning hooks that fullshard documents as "not supported" (docs/lightning.md). Under
# fullshard the recorder does not define them (so fullshard sees a module that does not override
# them), and the porting test drops them from Lightning's recorded order before comparing.
# tests/test_lightning_table.py checks that this set and the table's "not supported" hook rows
# agree, and that fullshard.LightningModule has no such method: the day fullshard adds one, the
# table, this set and the fixtures' comparison all have to move together.
NOT_CALLED_BY_FULLSHARD: dict[str, str] = {}  # none left: fullshard calls every hook the scripts record
