"""Porting script: ``ModelParallelStrategy`` with tensor parallelism over both processes (a 1 x 2
mesh) and ``fully_shard`` over the data-parallel dimension, applied in ``configure_model``.

Covers: ``ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)``,
``self.device_mesh`` in ``configure_model``, ``parallelize_module`` (column- and row-wise) and
``fully_shard`` of the layers and the root, a ``training_step`` that computes through
``self(...)`` (Lightning runs the step itself outside FSDP's forward: docs/fsdp/2d-parallel.md,
"Porting a Lightning script"), ``gradient_clip_val`` on ``DTensor`` gradients, ``sync_dist``
mean logging, both processes of the tensor-parallel group reading the same samples; the losses
and final weights checked against the same training in one plain-PyTorch process.

    PORT_FRAMEWORK=fullshard python tests/porting/model_parallel_tp.py --strategy model_parallel --out /tmp/p12
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from recording import RecordCallbackHooks, RecordModuleHooks, check, close, mark, run, snapshot, value
from reference import global_batches, state_close
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, TensorDataset

FRAMEWORK = os.environ.get("PORT_FRAMEWORK", "fullshard")
if FRAMEWORK == "lightning":
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import ModelParallelStrategy
else:
    import fullshard as L
    from fullshard.callbacks import Callback
    from fullshard.strategies import ModelParallelStrategy

SEED, VOCAB, DIM, N, BATCH, EPOCHS, CLIP, LR = 11, 16, 8, 12, 4, 2, 0.5, 0.5


def make_data() -> TensorDataset:
    """(sample index, tokens): the index first, so the recorded ``x0`` names the first sample."""
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.arange(N), torch.randint(0, VOCAB, (N, 9), generator=g))


class TinyLM(RecordModuleHooks, L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.w1 = nn.Linear(DIM, 4 * DIM)
        self.w2 = nn.Linear(4 * DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.losses: list[float] = []

    def configure_model(self):
        tp_mesh, dp_mesh = self.device_mesh["tensor_parallel"], self.device_mesh["data_parallel"]
        parallelize_module(
            self,
            tp_mesh,
            {
                "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
                "w1": ColwiseParallel(),
                "w2": RowwiseParallel(),
                "head": ColwiseParallel(output_layouts=Replicate()),
            },
        )
        fully_shard(self, mesh=dp_mesh)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.w2(F.gelu(self.w1(h)))
        return self.head(h)

    def training_step(self, batch, batch_idx):
        _, tokens = batch
        logits = self(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        self.log("train_loss", loss, sync_dist=True)
        self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


class Recorder(RecordCallbackHooks, Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        snapshot("on_train_epoch_end", trainer)


def plain_model() -> nn.Module:
    """TinyLM's layers as a plain module (the same parameter names), for the reference."""
    model = nn.Module()
    model.embed, model.w1, model.w2 = (
        nn.Embedding(VOCAB, DIM),
        nn.Linear(DIM, 4 * DIM),
        nn.Linear(4 * DIM, DIM),
    )
    model.head = nn.Linear(DIM, VOCAB, bias=False)
    return model


def reference(
    data: TensorDataset, init: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[float], list[float]]:
    """One process: the same batches (one data replica: each step reads BATCH samples), clip, step."""
    model = plain_model()
    model.load_state_dict(init)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    tokens = data.tensors[1]
    losses, norms = [], []
    for epoch in range(EPOCHS):
        for idx in global_batches(N, BATCH, 1, shuffle=True, seed=SEED, epoch=epoch):
            t = tokens[idx]
            h = model.embed(t[:, :-1])
            h = h + model.w2(F.gelu(model.w1(h)))
            loss = F.cross_entropy(model.head(h).reshape(-1, VOCAB), t[:, 1:].reshape(-1))
            loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss))
    return model.state_dict(), losses, norms


def main(args):
    L.seed_everything(SEED)
    data = make_data()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
        max_epochs=EPOCHS,
        gradient_clip_val=CLIP,
        log_every_n_steps=1,
        logger=False,
        callbacks=[Recorder()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = TinyLM()
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    mark("fit")
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True))
    mark("after fit")
    snapshot("after fit", trainer)
    value("global_step", trainer.global_step)
    value("losses", model.losses)
    value("sampler", {k: int(v) for k, v in trainer.strategy.distributed_sampler_kwargs.items()})
    final = {k: v.full_tensor() for k, v in model.state_dict().items()}
    weights, losses, norms = reference(data, init)
    check("every step was clipped (gradient norm above the limit)", min(norms) > CLIP, norms)
    check("losses equal one-process training", close(model.losses, losses), (model.losses, losses))
    check("final weights equal one-process training", *state_close(final, weights))
    logged = float(trainer.callback_metrics["train_loss"])
    check(
        "train_loss (sync_dist mean) is the last step's loss", close(logged, losses[-1]), (logged, losses[-1])
    )


if __name__ == "__main__":
    run(main)
