"""The model's part of each ``fit``/``validate``/``test``/``predict`` call: ``configure_model``
inside the strategy's contexts, the layers it built initialised, the strategy's setup, and the
gradients left from before cleared."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fullshard.errors import MisconfigurationError
from fullshard.strategies.meta_init import init_user_layers

if TYPE_CHECKING:
    from fullshard.module import Module
    from fullshard.strategies import Strategy


def set_up_model(model: Module, strategy: Strategy, stage: str) -> None:
    """Run ``model.configure_model()`` under ``strategy``'s init and sharding contexts, initialise
    the layers it built (:func:`~fullshard.strategies.meta_init.init_user_layers`), and let the
    strategy set the model up.

    As in Lightning, ``configure_model`` runs at the start of every call, also when an earlier one
    (``fit`` before ``validate``) has parallelised the model already. Code that parallelises
    layers fails the second time (torch: "distribute_module should only be called once"); that
    failure is raised as a :class:`~fullshard.errors.MisconfigurationError` that says how to make
    the hook idempotent.
    """
    again = strategy.module is model
    existing = {id(p) for p in model.parameters()}
    try:
        with strategy.tensor_init_context(), strategy.model_sharded_context():
            model.configure_model()
    except Exception as err:
        if not (again or _parallelised(model)):
            raise
        name = type(model).__name__
        raise MisconfigurationError(
            f"{name}.configure_model() failed when {stage}() ran it again on a model an earlier call "
            f"had set up ({type(err).__name__}: {err}). As in Lightning, configure_model runs at the start "
            "of every fit/validate/test/predict call: make it do nothing when the model is set up already, "
            "e.g. `if isinstance(self, FSDPModule): return` at its top (torch.distributed.fsdp.FSDPModule, "
            "when it applies fully_shard to the module itself), or build and parallelise the layers only "
            "while they are not yet there."
        ) from err
    init_user_layers(model, existing)
    strategy.setup_module(model)
    # As Lightning (zero_grad as each call starts), no step and no hook of the call sees the
    # gradients of an earlier call or of a backward pass the user ran. (Lightning clears them after
    # the ckpt_path's load and on_fit_start; a load clears the optimizers' again: [Note: gradients
    # cleared before optimizer states load] in fullshard/checkpoint/loose_gradients.py.)
    model.zero_grad()


def _parallelised(model: Module) -> bool:
    """Whether ``model`` holds layers sharded or split by torch (FSDP1, FSDP2, tensor parallel)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    return any(isinstance(m, FSDPModule | FullyShardedDataParallel) for m in model.modules()) or any(
        isinstance(p, DTensor) for p in model.parameters()
    )
