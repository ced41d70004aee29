"""Lightning's module paths under fullshard, as data: which fullshard object each name a script
imports from ``lightning.pytorch.<path>`` (or ``pytorch_lightning.<path>``) is, and why the
ones fullshard has not are missing. :mod:`fullshard.lightning_aliases` reads these tables (when
a path is first imported, never at ``import fullshard``); docs/lightning.md ("Module paths")
lists the same reasons, and tests/test_module_paths.py checks both against Lightning 2.6.6's
recorded modules (tests/fixtures/lightning_2.6.6_module_paths.json).

``ALIASES``: a Lightning path, relative to ``lightning.pytorch``, to ``{name: "module:attribute"}``
(or ``"module"`` for a name that is a module).
A path that is also a real fullshard module (``callbacks``, ``strategies.ddp``) needs rows only
for the names that module does not define itself.
``NOT_SUPPORTED``: a whole path, or ``"path:name"``, to why fullshard has not it and what to do.
"""

_CB = "fullshard.trainer.callbacks"
_LOG = "fullshard.trainer.loggers"

ALIASES: dict[str, dict[str, str]] = {
    "": {
        "cli_lightning_logo": "fullshard.cli.logo:cli_lightning_logo",
        # `import lightning.pytorch as L` makes these attributes (`L.callbacks.ModelCheckpoint`)
        **{name: f"fullshard.{name}" for name in ("callbacks", "core", "loggers", "plugins", "profilers")},
        **{name: f"fullshard.{name}" for name in ("strategies", "trainer", "tuner", "utilities")},
    },
    "callbacks.batch_size_finder": {
        "BatchSizeFinder": "fullshard.tuner.callbacks.batch_size_finder:BatchSizeFinder"
    },
    "callbacks.callback": {"Callback": f"{_CB}.base:Callback"},
    "callbacks.checkpoint": {"Checkpoint": f"{_CB}.base:Checkpoint"},
    "callbacks.device_stats_monitor": {"DeviceStatsMonitor": f"{_CB}.device_stats:DeviceStatsMonitor"},
    "callbacks.early_stopping": {
        "EarlyStopping": f"{_CB}.early_stopping:EarlyStopping",
        "EarlyStoppingReason": f"{_CB}.early_stopping:EarlyStoppingReason",
    },
    "callbacks.finetuning": {
        "BackboneFinetuning": f"{_CB}.finetuning:BackboneFinetuning",
        "BaseFinetuning": f"{_CB}.finetuning:BaseFinetuning",
    },
    "callbacks.gradient_accumulation_scheduler": {
        "GradientAccumulationScheduler": f"{_CB}.gradient_accumulation:GradientAccumulationScheduler"
    },
    "callbacks.lambda_function": {"LambdaCallback": f"{_CB}.lambda_function:LambdaCallback"},
    "callbacks.lr_finder": {"LearningRateFinder": "fullshard.tuner.callbacks.lr_finder:LearningRateFinder"},
    "callbacks.lr_monitor": {"LearningRateMonitor": f"{_CB}.lr_monitor:LearningRateMonitor"},
    "callbacks.model_checkpoint": {"ModelCheckpoint": f"{_CB}.model_checkpoint:ModelCheckpoint"},
    "callbacks.model_summary": {"ModelSummary": f"{_CB}.model_summary:ModelSummary"},
    "callbacks.on_exception_checkpoint": {
        "OnExceptionCheckpoint": f"{_CB}.on_exception_checkpoint:OnExceptionCheckpoint"
    },
    "callbacks.prediction_writer": {
        "BasePredictionWriter": f"{_CB}.prediction_writer:BasePredictionWriter",
        "WriteInterval": f"{_CB}.prediction_writer:WriteInterval",
    },
    "callbacks.progress": {
        "ProgressBar": f"{_CB}.progress_bar:ProgressBar",
        "RichProgressBar": f"{_CB}.rich_progress:RichProgressBar",
        "TQDMProgressBar": "fullshard.callbacks:TQDMProgressBar",
    },
    "callbacks.progress.progress_bar": {"ProgressBar": f"{_CB}.progress_bar:ProgressBar"},
    "callbacks.progress.rich_progress": {
        "RichProgressBar": f"{_CB}.rich_progress:RichProgressBar",
        "RichProgressBarTheme": f"{_CB}.rich_progress:RichProgressBarTheme",
    },
    "callbacks.progress.tqdm_progress": {"TQDMProgressBar": "fullshard.callbacks:TQDMProgressBar"},
    "callbacks.pruning": {"ModelPruning": f"{_CB}.pruning:ModelPruning"},
    "callbacks.rich_model_summary": {"RichModelSummary": f"{_CB}.model_summary:RichModelSummary"},
    "callbacks.spike": {"SpikeDetection": f"{_CB}.spike:SpikeDetection"},
    "callbacks.stochastic_weight_avg": {
        "StochasticWeightAveraging": f"{_CB}.stochastic_weight_avg:StochasticWeightAveraging"
    },
    "callbacks.throughput_monitor": {"ThroughputMonitor": f"{_CB}.throughput:ThroughputMonitor"},
    "callbacks.timer": {"Timer": f"{_CB}.timer:Timer"},
    "callbacks.weight_averaging": {
        "EMAWeightAveraging": f"{_CB}.weight_averaging:EMAWeightAveraging",
        "WeightAveraging": f"{_CB}.weight_averaging:WeightAveraging",
    },
    "cli": {
        "LRSchedulerCallable": "fullshard.utilities.types:LRSchedulerCallable",
        "LRSchedulerType": "fullshard.utilities.types:LRSchedulerType",
        "LRSchedulerTypeTuple": "fullshard.utilities.types:LRSchedulerTypeTuple",
        "LRSchedulerTypeUnion": "fullshard.utilities.types:LRSchedulerTypeUnion",
        "OptimizerCallable": "fullshard.utilities.types:OptimizerCallable",
    },
    "core": {
        "LightningDataModule": "fullshard.datamodule:LightningDataModule",
        "LightningModule": "fullshard.module:LightningModule",
    },
    "core.datamodule": {"LightningDataModule": "fullshard.datamodule:LightningDataModule"},
    "core.hooks": {
        "DataHooks": "fullshard.module_hooks:DataHooks",
        "ModelHooks": "fullshard.module_hooks:ModelHooks",
    },
    "core.module": {"LightningModule": "fullshard.module:LightningModule"},
    "core.optimizer": {"LightningOptimizer": "fullshard.trainer.optimization:LightningOptimizer"},
    "demos.transformer": {
        "Dictionary": "fullshard.demos.wikitext:Dictionary",
        "LightningTransformer": "fullshard.demos.lightning_transformer:LightningTransformer",
        "WikiText2": "fullshard.demos.wikitext:WikiText2",
        "tokenize": "fullshard.demos.wikitext:tokenize",
    },
    "plugins.environments": {
        "ClusterEnvironment": "fullshard.launch.environments:ClusterEnvironment",
        "LightningEnvironment": "fullshard.launch.environments:LocalEnvironment",
        "SLURMEnvironment": "fullshard.plugins.settings:SLURMEnvironment",
        "TorchElasticEnvironment": "fullshard.launch.environments:TorchElasticEnvironment",
    },
    "plugins.io": {
        "AsyncCheckpointIO": "fullshard.plugins.settings:AsyncCheckpointIO",
        "TorchCheckpointIO": "fullshard.plugins.settings:TorchCheckpointIO",
    },
    "plugins.io.async_plugin": {"AsyncCheckpointIO": "fullshard.plugins.settings:AsyncCheckpointIO"},
    "plugins.io.torch_plugin": {"TorchCheckpointIO": "fullshard.plugins.settings:TorchCheckpointIO"},
    "plugins.layer_sync": {
        "LayerSync": "fullshard.plugins.settings:LayerSync",
        "TorchSyncBatchNorm": "fullshard.plugins.settings:TorchSyncBatchNorm",
    },
    "plugins.precision": {
        "FSDPPrecision": "fullshard.precision:FSDPPrecision",
        "HalfPrecision": "fullshard.plugins.settings:HalfPrecision",
        "MixedPrecision": "fullshard.plugins.settings:MixedPrecision",
        "Precision": "fullshard.precision:Precision",
    },
    "plugins.precision.amp": {"MixedPrecision": "fullshard.plugins.settings:MixedPrecision"},
    "plugins.precision.fsdp": {"FSDPPrecision": "fullshard.precision:FSDPPrecision"},
    "plugins.precision.half": {"HalfPrecision": "fullshard.plugins.settings:HalfPrecision"},
    "plugins.precision.precision": {"Precision": "fullshard.precision:Precision"},
    "loggers.comet": {"CometLogger": f"{_LOG}.comet:CometLogger"},
    "loggers.csv_logs": {
        "CSVLogger": f"{_LOG}.csv_logger:CSVLogger",
        "ExperimentWriter": f"{_LOG}.csv_logger:ExperimentWriter",
    },
    "loggers.logger": {
        "DummyLogger": f"{_LOG}.base:DummyLogger",
        "Logger": f"{_LOG}.base:Logger",
        "rank_zero_experiment": f"{_LOG}.base:rank_zero_experiment",
    },
    "loggers.mlflow": {"MLFlowLogger": f"{_LOG}.mlflow:MLFlowLogger"},
    "loggers.tensorboard": {"TensorBoardLogger": f"{_LOG}.tensorboard:TensorBoardLogger"},
    "loggers.wandb": {"WandbLogger": f"{_LOG}.wandb:WandbLogger"},
    "profilers.profiler": {"Profiler": "fullshard.profilers.base:Profiler"},
    "trainer": {
        "Trainer": "fullshard.trainer.trainer:Trainer",
        "seed_everything": "fullshard.seed:seed_everything",
    },
    "utilities": {"CombinedLoader": "fullshard.trainer.combined_loader:CombinedLoader"},
    "utilities.combined_loader": {"CombinedLoader": "fullshard.trainer.combined_loader:CombinedLoader"},
    "utilities.data": {"extract_batch_size": "fullshard.trainer.metrics:extract_batch_size"},
    "utilities.enums": {"GradClipAlgorithmType": "fullshard.utilities:GradClipAlgorithmType"},
    "utilities.exceptions": {"MisconfigurationException": "fullshard.errors:MisconfigurationError"},
    "utilities.grads": {"grad_norm": "fullshard.utilities:grad_norm"},
    "utilities.memory": {"is_oom_error": "fullshard.tuner.batch_size_scaling:is_oom_error"},
    "utilities.parsing": {
        "AttributeDict": "fullshard.module:AttributeDict",
        "is_picklable": "fullshard.utilities:is_picklable",
    },
    "utilities.seed": {"isolate_rng": "fullshard.tuner.lr_finder:isolate_rng"},
    "utilities.rank_zero": {
        "rank_zero_debug": "fullshard.rank_zero:rank_zero_debug",
        "rank_zero_deprecation": "fullshard.utilities:rank_zero_deprecation",
        "rank_zero_info": "fullshard.rank_zero:rank_zero_info",
        "rank_zero_only": "fullshard.rank_zero:rank_zero_only",
        "rank_zero_warn": "fullshard.rank_zero:rank_zero_warn",
    },
}

_XLA = "XLA (TPU) is not among fullshard's accelerators (CPU and CUDA)"
_DEEPSPEED = (
    "DeepSpeed is not among fullshard's strategies; its sharding is FSDP: "
    "Trainer(strategy='fsdp') or FSDP2Strategy"
)
_CHECKPOINT_IO = (
    "fullshard writes its checkpoints itself (docs/checkpoints.md) and takes no custom writer; "
    "AsyncCheckpointIO and TorchCheckpointIO are accepted (fullshard.plugins)"
)
_DOUBLE = "fullshard has no float64 precision; its precisions are Trainer(precision=)'s five settings"
_ENVIRONMENTS = (
    "fullshard detects SLURM and torchrun (TorchElastic) jobs; launch the job with torchrun, or pass "
    "a ClusterEnvironment subclass of your own"
)
_LOOPS = (
    "Lightning's loops are private classes (_FitLoop, ...) a script may swap in on the Trainer; "
    "fullshard's loops are its own (fullshard.trainer.loops) and cannot be replaced: "
    "customise a run through hooks and callbacks"
)
_TRAINER_PARTS = (
    "a private part of Lightning's Trainer (no public names); fullshard's Trainer is built "
    "differently: use the Trainer's own arguments and properties"
)
_LAUNCHERS = (
    "Lightning's launchers are private classes; fullshard's are fullshard.launch.SubprocessScriptLauncher "
    "and SpawnLauncher, chosen by the strategy"
)
_ACCELERATORS = (
    "fullshard has no Accelerator objects: name the accelerator as a string, "
    "Trainer(accelerator='cpu', 'cuda' or 'auto')"
)
_HOSTED = "it talks to Lightning AI's hosted platform, which fullshard has no client for"
_SUMMARY = (
    "fullshard's model summary is the table callbacks.ModelSummary prints (max_depth=); its "
    "rows are not public objects"
)
_PRIVATE_HELPERS = "Lightning's private helpers (no public names)"

NOT_SUPPORTED: dict[str, str] = {
    # whole modules
    "accelerators": _ACCELERATORS,
    "accelerators.accelerator": _ACCELERATORS,
    "accelerators.cpu": _ACCELERATORS,
    "accelerators.cuda": _ACCELERATORS,
    "accelerators.mps": "Apple's MPS is not among fullshard's accelerators (CPU and CUDA)",
    "accelerators.xla": _XLA,
    "core.mixins": (
        "save_hyperparameters and hparams are methods of fullshard's LightningModule and "
        "LightningDataModule themselves; there is no separate mixin class"
    ),
    "core.mixins.hparams_mixin": (
        "save_hyperparameters and hparams are methods of fullshard's LightningModule and "
        "LightningDataModule themselves; there is no separate mixin class"
    ),
    "core.saving": (
        "Lightning's helpers to read and write hparams.yaml and tags.csv; fullshard's loggers write "
        "hparams.yaml themselves and load_from_checkpoint reads the hyperparameters from the "
        "checkpoint: read a YAML file with yaml.safe_load"
    ),
    "loggers.litlogger": f"LitLogger: {_HOSTED}",
    "loggers.neptune": (
        "fullshard has no Neptune logger: use CSVLogger, TensorBoardLogger, WandbLogger, "
        "MLFlowLogger or CometLogger, or subclass fullshard.loggers.Logger"
    ),
    "loggers.utilities": _PRIVATE_HELPERS,
    "loops": _LOOPS,
    "loops.evaluation_loop": _LOOPS,
    "loops.fetchers": _LOOPS,
    "loops.fit_loop": _LOOPS,
    "loops.loop": _LOOPS,
    "loops.optimization": _LOOPS,
    "loops.optimization.automatic": _LOOPS,
    "loops.optimization.closure": _LOOPS,
    "loops.optimization.manual": _LOOPS,
    "loops.prediction_loop": _LOOPS,
    "loops.progress": _LOOPS,
    "loops.training_epoch_loop": _LOOPS,
    "loops.utilities": _LOOPS,
    "overrides": "Lightning's wrappers around torch's DDP internals; fullshard's strategies wrap the model themselves",
    "overrides.distributed": (
        "Lightning's evaluation sampler and DDP internals; fullshard's Trainer adds the distributed "
        "sampler itself (Trainer(use_distributed_sampler=))"
    ),
    "plugins.io.checkpoint_plugin": _CHECKPOINT_IO,
    "plugins.io.wrapper": _CHECKPOINT_IO,
    "plugins.io.xla_plugin": _XLA,
    "plugins.precision.bitsandbytes": (
        "bitsandbytes quantisation needs the bitsandbytes package and is not among fullshard's "
        "precisions (Trainer(precision=))"
    ),
    "plugins.precision.deepspeed": _DEEPSPEED,
    "plugins.precision.double": _DOUBLE,
    "plugins.precision.transformer_engine": (
        "NVIDIA Transformer Engine's FP8 needs the transformer_engine package and is not among "
        "fullshard's precisions (Trainer(precision=))"
    ),
    "plugins.precision.xla": _XLA,
    "profilers.xla": _XLA,
    "strategies.deepspeed": _DEEPSPEED,
    "strategies.launchers": _LAUNCHERS,
    "strategies.launchers.launcher": _LAUNCHERS,
    "strategies.launchers.multiprocessing": _LAUNCHERS,
    "strategies.launchers.subprocess_script": _LAUNCHERS,
    "strategies.launchers.xla": _XLA,
    "strategies.single_xla": _XLA,
    "strategies.xla": _XLA,
    "trainer.configuration_validator": _TRAINER_PARTS,
    "trainer.connectors": _TRAINER_PARTS,
    "trainer.connectors.accelerator_connector": _TRAINER_PARTS,
    "trainer.connectors.callback_connector": _TRAINER_PARTS,
    "trainer.connectors.checkpoint_connector": _TRAINER_PARTS,
    "trainer.connectors.data_connector": _TRAINER_PARTS,
    "trainer.connectors.logger_connector": _TRAINER_PARTS,
    "trainer.connectors.logger_connector.fx_validator": _TRAINER_PARTS,
    "trainer.connectors.logger_connector.logger_connector": _TRAINER_PARTS,
    "trainer.connectors.logger_connector.result": _TRAINER_PARTS,
    "trainer.connectors.signal_connector": _TRAINER_PARTS,
    "trainer.setup": _TRAINER_PARTS,
    "utilities.argparse": _PRIVATE_HELPERS + "; fullshard's command lines are fullshard.cli.LightningCLI",
    "utilities.compile": (
        "Lightning's helpers to unwrap a torch.compile'd module; fullshard compiles through "
        "Trainer(compile=) and keeps the module uncompiled"
    ),
    "utilities.consolidate_checkpoint": (
        "Lightning's command to merge a sharded checkpoint; fullshard's is "
        "`fullshard checkpoint consolidate` (docs/checkpoints.md)"
    ),
    "utilities.deepspeed": _DEEPSPEED,
    "utilities.memory": (
        "Lightning's CUDA memory helpers; fullshard has is_oom_error only (call torch.cuda.empty_cache() "
        "and gc.collect() yourself)"
    ),
    "utilities.migration": (
        "upgrades checkpoints written by older Lightning versions; fullshard reads Lightning 2.x "
        "checkpoints as they are (docs/checkpoints.md)"
    ),
    "utilities.migration.migration": (
        "upgrades checkpoints written by older Lightning versions; fullshard reads Lightning 2.x "
        "checkpoints as they are (docs/checkpoints.md)"
    ),
    "utilities.migration.utils": (
        "upgrades checkpoints written by older Lightning versions; fullshard reads Lightning 2.x "
        "checkpoints as they are (docs/checkpoints.md)"
    ),
    "utilities.model_registry": f"the model registry: {_HOSTED}",
    "utilities.model_summary": _SUMMARY,
    "utilities.model_summary.model_summary": _SUMMARY,
    "utilities.model_summary.model_summary_deepspeed": _DEEPSPEED,
    "utilities.parameter_tying": (
        "helpers to re-tie weights after moving a model to XLA; fullshard keeps tied parameters tied "
        "itself (one FSDP unit holds both)"
    ),
    "utilities.signature_utils": _PRIVATE_HELPERS,
    "utilities.testing": "Lightning's own test-suite helpers (no public names)",
    "utilities.upgrade_checkpoint": (
        "upgrades checkpoints written by older Lightning versions; fullshard reads Lightning 2.x "
        "checkpoints as they are (docs/checkpoints.md)"
    ),
    # single names
    "callbacks.finetuning:multiplicative": "Lightning's default lr lambda of BackboneFinetuning; pass lambda_func= yourself",
    "callbacks.progress.progress_bar:get_standard_metrics": "fullshard's progress bar shows the logged metrics itself; override ProgressBar.get_metrics",
    "callbacks.progress.tqdm_progress:Tqdm": "the tqdm subclass of Lightning's bar; fullshard's ProgressBar makes its own",
    "callbacks.progress.tqdm_progress:convert_inf": "a private helper of Lightning's bar",
    "callbacks.timer:Interval": "fullshard's Timer takes interval='step' or 'epoch' as strings",
    "core.hooks:CheckpointHooks": (
        "on_save_checkpoint and on_load_checkpoint are methods of fullshard's LightningModule "
        "itself; there is no separate mixin class"
    ),
    "cli:instantiate_module": "build the module with fullshard.cli.instantiate_class (a class_path/init_args dict)",
    "core.module:MODULE_OPTIMIZERS": "a type alias of Lightning's internals",
    "core.optimizer:do_nothing_closure": "a private helper of Lightning's manual optimisation",
    "loggers.comet:FRAMEWORK_NAME": "a constant of Lightning's Comet client",
    "loggers.comet:comet_experiment": "a private helper of Lightning's CometLogger",
    "loggers.logger:merge_dicts": "a helper of Lightning's logger aggregation; fullshard's loggers do not aggregate",
    "loggers.mlflow:LOCAL_FILE_URI_PREFIX": "a constant of Lightning's MLflow client",
    "profilers.pytorch:RegisterRecordFunction": "a helper of Lightning's PyTorchProfiler; fullshard's records with torch.profiler.record_function",
    "profilers.pytorch:ScheduleWrapper": "a helper of Lightning's PyTorchProfiler; fullshard passes schedule= to torch.profiler.profile",
    "loggers:LitLogger": f"LitLogger: {_HOSTED}",
    "plugins:BitsandbytesPrecision": "bitsandbytes quantisation needs the bitsandbytes package and is not among fullshard's precisions (Trainer(precision=))",
    "plugins:CheckpointIO": _CHECKPOINT_IO,
    "plugins:DeepSpeedPrecision": _DEEPSPEED,
    "plugins:DoublePrecision": _DOUBLE,
    "plugins:TransformerEnginePrecision": "NVIDIA Transformer Engine's FP8 needs the transformer_engine package and is not among fullshard's precisions (Trainer(precision=))",
    "plugins:XLACheckpointIO": _XLA,
    "plugins:XLAPrecision": _XLA,
    "plugins.environments:KubeflowEnvironment": _ENVIRONMENTS,
    "plugins.environments:LSFEnvironment": _ENVIRONMENTS,
    "plugins.environments:MPIEnvironment": _ENVIRONMENTS,
    "plugins.environments:XLAEnvironment": _XLA,
    "plugins.io:CheckpointIO": _CHECKPOINT_IO,
    "plugins.io:XLACheckpointIO": _XLA,
    "plugins.precision:BitsandbytesPrecision": "bitsandbytes quantisation needs the bitsandbytes package and is not among fullshard's precisions (Trainer(precision=))",
    "plugins.precision:DeepSpeedPrecision": _DEEPSPEED,
    "plugins.precision:DoublePrecision": _DOUBLE,
    "plugins.precision:TransformerEnginePrecision": "NVIDIA Transformer Engine's FP8 needs the transformer_engine package and is not among fullshard's precisions (Trainer(precision=))",
    "plugins.precision:XLAPrecision": _XLA,
    "profilers:XLAProfiler": _XLA,
    "strategies:DeepSpeedStrategy": _DEEPSPEED,
    "utilities:find_shared_parameters": "helpers to re-tie weights after moving a model to XLA; fullshard keeps tied parameters tied itself",
    "utilities:set_shared_parameters": "helpers to re-tie weights after moving a model to XLA; fullshard keeps tied parameters tied itself",
    "utilities.data:BType": "a type variable of Lightning's internals",
    "utilities.data:has_len_all_ranks": "a private check of Lightning's data connector; fullshard checks loader lengths itself",
    "utilities.exceptions:SIGTERMException": (
        "fullshard ends a fit that received SIGTERM with fullshard.trainer.preemption.TrainingPreempted "
        "after saving (docs/clusters.md)"
    ),
    "utilities.parsing:clean_namespace": "Lightning's hyperparameter-collection internals; call self.save_hyperparameters()",
    "utilities.parsing:collect_init_args": "Lightning's hyperparameter-collection internals; call self.save_hyperparameters()",
    "utilities.parsing:get_init_args": "Lightning's hyperparameter-collection internals; call self.save_hyperparameters()",
    "utilities.parsing:lightning_getattr": "Lightning's tuner internals; use getattr on the module or its hparams",
    "utilities.parsing:lightning_hasattr": "Lightning's tuner internals; use hasattr on the module or its hparams",
    "utilities.parsing:lightning_setattr": "Lightning's tuner internals; use setattr on the module or its hparams",
    "utilities.parsing:parse_class_init_keys": "Lightning's hyperparameter-collection internals; call self.save_hyperparameters()",
    "utilities.parsing:save_hyperparameters": "call the module's own self.save_hyperparameters()",
    "utilities.rank_zero:LightningDeprecationWarning": "fullshard's deprecations are plain DeprecationWarnings (rank_zero_deprecation)",
    "utilities.rank_zero:WarningCache": "fullshard warns once per message through Python's warnings filters",
    "utilities.rank_zero:rank_prefixed_message": "not in fullshard: prefix the message with trainer.global_rank yourself",
    "utilities.rank_zero:rank_zero_module": "Lightning's holder of the rank-zero logger; fullshard logs to the 'fullshard' logger",
}  # fmt: skip
