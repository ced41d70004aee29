"""Tensor parallelism over two gloo processes by a resolved plan: forward loss and two SGD steps.

python tests/scripts/tp_plan_job.py --out DIR [--hf]

Per case, on a TP-only mesh of size 2 (every rank gets the same batch), rank 0 writes
``DIR/<case>.pt``: the losses of three forwards (before, after one and after two SGD steps), the
full parameters at the end (``full_tensor()``), the local shape of one split weight and the head
counts the attention modules hold. tests/test_tp_plan.py compares them with one process
training the same model unsplit. Cases: ``auto`` (tests/hf_llama.py's model, ``tp_plan="auto"``),
``user`` (its legacy attention, which reshapes by ``num_heads``, with a user's plan of style
strings and ParallelStyles, the embedding split by vocabulary), ``tied`` (embedding and head one
weight, ``"auto"`` splits both by vocabulary); ``--hf``: ``hf_auto``, a real
transformers ``LlamaForCausalLM`` with ``tp_plan="auto"``.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fullshard.launch import LocalEnvironment, SubprocessScriptLauncher
from fullshard.strategies.tp_plan import apply_tp_plan, resolve_tp_plan
from hf_llama import lm_loss, token_batch
from tp_cases import CASES, build


def join(env: LocalEnvironment) -> int:
    rank = env.local_rank()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{env.main_address}:{env.main_port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    return rank


def full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def local_shape(t: torch.Tensor) -> list[int]:
    from torch.distributed.tensor import DTensor

    return list((t.to_local() if isinstance(t, DTensor) else t).shape)


def run_case(name: str, mesh: Any) -> dict[str, Any]:
    model, plan_arg, split_weight = build(name)
    plan = resolve_tp_plan(model, plan_arg)
    apply_tp_plan(model, mesh, plan)
    ids = token_batch(model.config.vocab_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(3):
        loss = lm_loss(_logits(model(ids[:, :-1])), ids)
        losses.append(loss.item())
        if step < 2:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    heads = {
        n: {a: getattr(m, a) for a in ("num_heads", "num_key_value_heads") if a in vars(m)}
        for n, m in model.named_modules()
        if n.endswith("self_attn")
    }
    return {
        "losses": losses,
        "params": {n: full(p) for n, p in model.named_parameters()},
        "split_shape": local_shape(model.get_parameter(split_weight)),
        "plan": sorted(plan),
        "heads": heads,
        "tied": model.get_parameter("lm_head.weight") is model.get_parameter("model.embed_tokens.weight"),
    }


def _logits(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--hf", action="store_true")
    args = parser.parse_args()
    env = LocalEnvironment()
    rank = SubprocessScriptLauncher(env, num_processes=2, num_nodes=1).launch(join, env)
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tensor_parallel",))
    names = ["hf_auto"] if args.hf else [n for n in CASES if n != "hf_auto"]
    for name in names:
        result = run_case(name, mesh)
        if rank == 0:
            torch.save(result, Path(args.out) / f"{name}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
