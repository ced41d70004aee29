"""Resuming in the middle of an epoch on another number of processes trains on exactly the samples
the epoch had left (see [Note: resuming at another world size] in src/fullshard/trainer/data.py).

The jobs train on a dataset whose samples carry their index, and write which indices every rank
trained on, batch by batch; the expected orders come from torch's own ``DistributedSampler``.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from conftest import SCRIPTS, check_ok, run_script
from fullshard.trainer.data import (
    ResumableDistributedSampler,
    SavedPosition,
    prepare_dataloader,
    shard_indices,
)

sys.path.insert(0, str(SCRIPTS))
from resume_order_job import BATCH, LENGTH, SEED, SHORT, train

# The model's optimizer is SGD with momentum, except in the test of a stateless optimizer.

Seen = list[list[Any]]  # [epoch, batch_idx, is_last_batch, indices] per batch, as the job writes it


# ----------------------------------------------------------------------------- expectations
def distributed_sampler(epoch: int, shuffle: bool, rank: int, world: int, length: int = LENGTH) -> list[int]:
    sampler = DistributedSampler(range(length), num_replicas=world, rank=rank, shuffle=shuffle, seed=SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


def epoch_order(epoch: int, shuffle: bool, length: int = LENGTH) -> list[int]:
    """The whole epoch's order: torch's DistributedSampler on one process."""
    return distributed_sampler(epoch, shuffle, 0, 1, length)


def batches(indices: list[int], drop_last: bool) -> list[list[int]]:
    chunks = [indices[i : i + BATCH] for i in range(0, len(indices), BATCH)]
    return [c for c in chunks if len(c) == BATCH] if drop_last else chunks


def rest_of_epoch(order: list[int], consumed: int, rank: int, world: int, drop_last: bool) -> list[list[int]]:
    """What rank ``rank`` of ``world`` trains on after ``consumed`` positions: the rest of the
    order split by rank, padded with the order's first positions, as DistributedSampler pads."""
    rest = order[consumed:]
    rest += [order[k % len(order)] for k in range(-len(rest) % world)]
    return batches(rest[rank::world], drop_last)


def uninterrupted(
    epoch: int, shuffle: bool, rank: int, world: int, drop_last: bool, length: int = LENGTH
) -> list[list[int]]:
    """What rank ``rank`` of an uninterrupted ``world``-process run trains on in ``epoch``:
    torch's DistributedSampler, batched."""
    return batches(distributed_sampler(epoch, shuffle, rank, world, length), drop_last)


def seen(out: Path, world: int) -> list[Seen]:
    return [json.loads((out / f"seen_rank{rank}.json").read_text()) for rank in range(world)]


def in_epoch(records: Seen, epoch: int) -> Seen:
    return [r for r in records if r[0] == epoch]


def indices_of(*runs: Seen) -> list[int]:
    return [i for records in runs for r in records for i in r[3]]


def loops_of(ckpt: Path) -> dict[str, Any]:
    return dict(torch.load(ckpt, weights_only=True)["loops"])


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The multi-process runs of the tests below, in three jobs rather than one each: the runs of
    one world size share a job (resume_order_job.py --scenarios), and a run that resumes another's
    checkpoint comes in a later job. Each run's --out is ``ROOT/<test>/<run>``."""
    root = tmp_path_factory.mktemp("resume_order")
    shuffled = root / "shuffled"  # test_two_to_three_to_one_processes_shuffled
    fsdp = root / "fsdp"  # test_three_to_two_processes_fsdp_drop_last
    plain = root / "plain"  # test_a_stateless_optimizer_resumes_from_a_full_checkpoint_on_several_processes
    lit = root / "lightning_sampler"  # test_the_default_sampler_shuffles_an_unshuffled_loader_as_lightning
    both = root / "combined"  # test_a_combined_loader_resumes_exactly_under_fsdp
    fsdp2 = ("--strategy", "fsdp", "--combined", "--lightning-sampler")
    common = ("--strategy", "fsdp", "--drop-last")
    sgd = ("--momentum", "0")
    at2 = [
        ["--out", f"{shuffled}/two", "--max-steps", "3", "--shuffle", "--save", f"{shuffled}/two.ckpt"],
        ["--out", f"{plain}/a", "--max-steps", "3", *sgd, "--save", f"{plain}/plain.ckpt"],
        ["--out", f"{lit}/whole", "--max-steps", "9", "--lightning-sampler"],
        ["--out", f"{lit}/a", "--max-steps", "3", "--lightning-sampler", "--save", f"{lit}/a.ckpt"],
        ["--out", f"{both}/whole", "--max-steps", "10", *fsdp2],
        ["--out", f"{both}/a", "--max-steps", "5", *fsdp2, "--save", f"{both}/a.ckpt"],
    ]
    at3 = [
        ["--out", f"{shuffled}/three", "--max-steps", "9", "--shuffle", "--resume", f"{shuffled}/two.ckpt", "--save-every", "4"],
        ["--out", f"{fsdp}/three", "--max-steps", "2", "--save", f"{fsdp}/three.ckpt", *common],
    ]  # fmt: skip
    then_at2 = [
        ["--out", f"{fsdp}/two", "--max-steps", "7", "--resume", f"{fsdp}/three.ckpt", *common],
        ["--out", f"{plain}/b", "--max-steps", "5", *sgd, "--resume", f"{plain}/plain.ckpt"],
        ["--out", f"{lit}/b", "--max-steps", "9", "--lightning-sampler", "--resume", f"{lit}/a.ckpt"],
        ["--out", f"{both}/b", "--max-steps", "10", *fsdp2, "--resume", f"{both}/a.ckpt"],
    ]
    for name, runs, devices in (("at2", at2, 2), ("at3", at3, 3), ("then_at2", then_at2, 2)):
        (root / f"{name}.json").write_text(json.dumps([[*run, "--devices", str(devices)] for run in runs]))
        args = ("--scenarios", str(root / f"{name}.json"), "--devices", str(devices))
        check_ok(run_script("resume_order_job.py", *args, timeout=240))
    return root


def _check_resumed_epoch(
    records: Seen, order: list[int], consumed: int, rank: int, world: int, drop_last: bool
) -> None:
    """The resumed epoch's batches are the rest of the order, and end at the epoch's last batch."""
    expected = rest_of_epoch(order, consumed, rank, world, drop_last)
    assert [r[3] for r in records] == expected, f"rank {rank} of {world}"
    full = len(uninterrupted(0, False, rank, world, drop_last))  # batches in a whole epoch
    assert [r[1] for r in records] == list(range(full - len(expected), full))
    assert [r[2] for r in records] == [False] * (len(expected) - 1) + [True]


# ------------------------------------------------------------------------ sampler arithmetic
@pytest.mark.parametrize("length", [1, 2, 7, 13])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_from_the_start_are_distributed_samplers(length: int, world: int) -> None:
    for shuffle, rank in itertools.product((False, True), range(world)):
        expected = distributed_sampler(2, shuffle, rank, world, length)
        order = epoch_order(2, shuffle, length)
        assert shard_indices(order, 0, rank, world) == expected, (shuffle, rank)
        ours = ResumableDistributedSampler(
            range(length), num_replicas=world, rank=rank, shuffle=shuffle, seed=SEED
        )
        ours.set_epoch(2)
        assert ours.epoch_order() == order and list(ours) == expected and len(ours) == len(expected)


def _loaders(length: int, world: int, shuffle: bool, drop_last: bool) -> list[Any]:
    data = list(range(length))
    return [
        prepare_dataloader(
            DataLoader(data, batch_size=BATCH, shuffle=shuffle, drop_last=drop_last),
            shuffle_default=True,
            num_replicas=world,
            rank=rank,
            seed=SEED,
            name="The train dataloader",
        )
        for rank in range(world)
    ]


def _epoch(loaders: list[Any], start: tuple[int, int]) -> list[list[list[int]]]:
    return [[batch.tolist() for batch in loader.iterate(1, start)] for loader in loaders]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_point_at_any_world_size(shuffle: bool, drop_last: bool) -> None:
    """Saved after b batches on N processes, resumed on M: the M processes train on exactly the
    positions left, from the batch index that ends the epoch where a whole epoch ends; for M == N
    it is the uninterrupted run, batch for batch, also for checkpoints without samples_in_epoch."""
    for length, written, now in itertools.product((13, 22), (1, 2, 3), (1, 2, 3)):
        before_loaders = _loaders(length, written, shuffle, drop_last)
        after_loaders = _loaders(length, now, shuffle, drop_last)
        order = epoch_order(1, shuffle, length)
        padded = order + [order[j % length] for j in range(-length % written)]
        whole = _epoch(before_loaders, (0, 0))
        assert whole == [uninterrupted(1, shuffle, r, written, drop_last, length) for r in range(written)]
        for b in range(len(before_loaders[0]) + 1):
            consumed = before_loaders[0].samples_consumed((0, 0), b)
            assert consumed == min(b * BATCH * written, length)
            trained = sorted(i for rank in whole for batch in rank[:b] for i in batch)
            assert trained == sorted(padded[: b * BATCH * written])  # a prefix of the order
            start = after_loaders[0].resume_start(SavedPosition(b, consumed, written), epoch=1)
            assert start[1] == consumed
            rest = _epoch(after_loaders, start)
            assert rest == [rest_of_epoch(order, consumed, r, now, drop_last) for r in range(now)]
            assert len(after_loaders[0]) - start[0] == len(rest[0])
            if now == written:
                assert start == (b, consumed)
                assert rest == [rank[b:] for rank in whole]
                for old in (SavedPosition(b, None, written), SavedPosition(b, None, None)):
                    assert after_loaders[0].resume_start(old, epoch=1) == start
            # after k more batches the processes have read a longer prefix: a second resume composes
            left = order[consumed:] + [order[j % length] for j in range(-(length - consumed) % now)]
            for k in range(len(rest[0]) + 1):
                again = after_loaders[0].samples_consumed(start, start[0] + k)
                assert again == min(consumed + k * BATCH * now, length)
                trained = sorted(i for rank in rest for batch in rank[:k] for i in batch)
                assert trained == sorted(left[: k * BATCH * now])


# ------------------------------------------------------------------- real multi-process runs
@pytest.fixture
def in_process_ddp(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One-process DDP runs in this process: they set the process group's address and leave the
    group alive after ``fit`` (as Lightning's); both are undone after the test."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # so that monkeypatch records them, and removes them after
        monkeypatch.delenv(name)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.multiprocess
def test_two_to_three_to_one_processes_shuffled(jobs: Path, tmp_path: Path, in_process_ddp: None) -> None:
    """Saved on 2 processes after 3 steps (24 samples), resumed on 3, and both that and a run of
    the 3-process job saved one step later resumed on 1 process: every sample of the epoch is
    trained on, once, but for the padding of the last batch; the next epoch is the 3-process
    (1-process) run's own. The 1-process runs use DDP, whose sampler orders every epoch by the
    seed (without a distributed strategy a shuffling loader's order is drawn from the global
    generator, as Lightning's RandomSampler: tests/test_seeding.py)."""
    order, next_order = epoch_order(0, True), epoch_order(1, True)
    runs = jobs / "shuffled"
    ckpt = runs / "two.ckpt"
    two = seen(runs / "two", 2)  # --devices 2 --max-steps 3 --shuffle --save two.ckpt
    assert [[r[3] for r in records] for records in two] == [
        uninterrupted(0, True, rank, 2, False)[:3] for rank in range(2)
    ]
    assert loops_of(ckpt)["samples_in_epoch"] == 24 and loops_of(ckpt)["batches_in_epoch"] == 3

    three = seen(runs / "three", 3)  # --devices 3 --max-steps 9 --shuffle --resume two.ckpt --save-every 4
    for rank, records in enumerate(three):
        _check_resumed_epoch(in_epoch(records, 0), order, 24, rank, 3, drop_last=False)
        assert [r[3] for r in in_epoch(records, 1)] == uninterrupted(1, True, rank, 3, False)[:3]
    counts = Counter(indices_of(*two, *(in_epoch(r, 0) for r in three)))
    assert set(counts) == set(range(LENGTH))
    assert [i for i, n in counts.items() if n > 1] == [order[0]] and counts[order[0]] == 2  # the padding

    # 2 -> 1, stopped after two more steps (an epoch cut short), then 1 -> 1: the counts compose
    cut = tmp_path / "one_cut.ckpt"
    _, first = train(
        tmp_path / "one_a", max_steps=5, shuffle=True, strategy="ddp", resume=str(ckpt), save=str(cut)
    )
    assert loops_of(cut)["samples_in_epoch"] == 24 + 2 * BATCH
    _, second = train(tmp_path / "one_b", max_steps=12, shuffle=True, strategy="ddp", resume=str(cut))
    _check_resumed_epoch(in_epoch(first.seen, 0) + in_epoch(second.seen, 0), order, 24, 0, 1, drop_last=False)
    next_epoch = [r[3] for r in in_epoch(second.seen, 1)]
    assert next_epoch == uninterrupted(1, True, 0, 1, False)[:2] == [next_order[:4], next_order[4:8]]

    # 2 -> 3 -> 1: the 3-process run's checkpoint one step after its resume
    step4 = runs / "three" / "ckpts" / "epoch=0-step=4.ckpt"
    assert loops_of(step4)["samples_in_epoch"] == 24 + BATCH * 3
    _, last = train(tmp_path / "one_c", max_steps=8, shuffle=True, strategy="ddp", resume=str(step4))
    _check_resumed_epoch(in_epoch(last.seen, 0), order, 36, 0, 1, drop_last=False)
    first_of_three = [r for records in three for r in records if r[:2] == [0, 2]]
    assert sorted(indices_of(*two, first_of_three, last.seen)) == list(range(LENGTH))


@pytest.mark.multiprocess
def test_three_to_two_processes_fsdp_drop_last(jobs: Path) -> None:
    """Saved under FSDP on 3 processes after 2 steps, resumed on 2, in order and with
    ``drop_last=True``: the epoch trains on what an uninterrupted 2-process epoch would."""
    order = epoch_order(0, False)
    runs = jobs / "fsdp"  # both with --strategy fsdp --drop-last
    ckpt = runs / "three.ckpt"
    three = seen(runs / "three", 3)  # --devices 3 --max-steps 2 --save three.ckpt
    assert loops_of(ckpt)["samples_in_epoch"] == 24
    two = seen(runs / "two", 2)  # --devices 2 --max-steps 7 --resume three.ckpt
    for rank, records in enumerate(two):
        _check_resumed_epoch(in_epoch(records, 0), order, 24, rank, 2, drop_last=True)
        assert [r[3] for r in in_epoch(records, 1)] == uninterrupted(1, False, rank, 2, True)[:2]
    epoch = indices_of(*three, *(in_epoch(r, 0) for r in two))
    whole_two = [i for rank in range(2) for batch in uninterrupted(0, False, rank, 2, True) for i in batch]
    assert sorted(epoch) == sorted(whole_two) == list(range(48))  # 48 and 49 end in no full batch


@pytest.mark.multiprocess
def test_the_default_sampler_shuffles_an_unshuffled_loader_as_lightning(jobs: Path) -> None:
    """Under DDP on 2 processes a ``shuffle=False`` training loader is shuffled, as Lightning's
    sampler does (``DistributedSampler(shuffle=True)`` with the seed of ``seed_everything``; see
    [Note: the training sampler's order]): every rank trains on the batches torch's own sampler
    gives it, epoch after epoch; and a run resumed in the middle of the epoch trains on the
    very batches of the uninterrupted run."""
    runs = jobs / "lightning_sampler"
    whole = seen(runs / "whole", 2)  # --max-steps 9: the 7 batches of epoch 0, 2 of epoch 1
    for rank, records in enumerate(whole):
        expected = uninterrupted(0, True, rank, 2, False) + uninterrupted(1, True, rank, 2, False)[:2]
        assert [r[3] for r in records] == expected
        assert [r[:3] for r in records] == [[0, i, i == 6] for i in range(7)] + [[1, 0, False], [1, 1, False]]
    resumed = [a + b for a, b in zip(seen(runs / "a", 2), seen(runs / "b", 2), strict=True)]
    assert resumed == whole


@pytest.mark.multiprocess
def test_a_combined_loader_resumes_exactly_under_fsdp(jobs: Path) -> None:
    """A dict of two training loaders (``max_size_cycle``: the short one starts over) under FSDP
    on 2 processes, saved after 5 steps (the short loader 2 batches into its second pass) and
    resumed: each rank trains on the very batches of the uninterrupted run; the checkpoint
    records each loader's position ([Note: resuming combined loaders])."""
    runs = jobs / "combined"
    whole = seen(runs / "whole", 2)  # 7 batches per epoch (the long loader's), 3 epochs of the short one
    for rank, records in enumerate(whole):
        long = uninterrupted(0, True, rank, 2, False) + uninterrupted(1, True, rank, 2, False)
        short = [uninterrupted(epoch, True, rank, 2, False, SHORT) for epoch in (0, 1)]
        assert [r[3]["long"] for r in records] == long[:10]
        assert [r[3]["short"] for r in records] == (short[0] * 3)[:7] + short[1][:3]  # each epoch its order
    assert [a + b for a, b in zip(seen(runs / "a", 2), seen(runs / "b", 2), strict=True)] == whole
    positions = loops_of(runs / "a.ckpt")["loader_positions"]
    assert positions == [
        {"batches": 5, "cycles": 0, "samples": 40},
        {"batches": 2, "cycles": 1, "samples": 16},
    ]


def test_a_combined_loader_resumes_exactly_in_one_process(tmp_path: Path) -> None:
    """The same in one process, cut in the short loader's third pass and resumed twice."""
    run = dict(shuffle=True, combined=True)
    _, whole = train(tmp_path / "whole", max_steps=20, **run)  # type: ignore[arg-type]
    _, a = train(tmp_path / "a", max_steps=12, save=str(tmp_path / "a.ckpt"), **run)  # type: ignore[arg-type]
    _, b = train(
        tmp_path / "b", max_steps=15, resume=str(tmp_path / "a.ckpt"), save=str(tmp_path / "b.ckpt"), **run
    )  # type: ignore[arg-type]
    _, c = train(tmp_path / "c", max_steps=20, resume=str(tmp_path / "b.ckpt"), **run)  # type: ignore[arg-type]
    assert a.seen + b.seen + c.seen == whole.seen
    assert [r[:2] for r in whole.seen] == [[0, i] for i in range(13)] + [[1, i] for i in range(7)]
    assert loops_of(tmp_path / "a.ckpt")["loader_positions"][1] == {"batches": 2, "cycles": 2, "samples": 8}


# ------------------------------------------------------------------- loaders replayed as given
class Forward(Sampler[int]):
    """A sampler of the user's own: the Trainer keeps it, and cannot start it at an index."""

    def __iter__(self) -> Any:
        return iter(range(LENGTH))

    def __len__(self) -> int:
        return LENGTH


def test_custom_sampler_warns_when_the_world_size_changed(tmp_path: Path) -> None:
    ckpt = tmp_path / "one.ckpt"
    train(tmp_path / "a", max_steps=3, sampler=Forward(), save=str(ckpt))
    assert loops_of(ckpt)["samples_in_epoch"] is None  # it has no epoch order we know of

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, same = train(tmp_path / "b", max_steps=5, sampler=Forward(), resume=str(ckpt))
    assert not [w for w in caught if "Resuming epoch" in str(w.message)]
    assert [r[3] for r in same.seen] == [[12, 13, 14, 15], [16, 17, 18, 19]]  # replayed exactly

    checkpoint = torch.load(ckpt, weights_only=False)
    checkpoint["world_size"] = checkpoint["data_parallel_size"] = 2  # as if 2 processes had written it
    torch.save(checkpoint, tmp_path / "two.ckpt")
    message = (
        r"Resuming epoch 0 in its middle on 1 process\(es\) from a checkpoint written by 2: the training "
        r"dataloader cannot start at a sample index \(it has its own sampler, Forward\).* about 12 samples "
        r"of epoch 0 may be trained on twice\. To resume exactly, resume on 2 process\(es\)"
    )
    with pytest.warns(UserWarning, match=message):
        train(tmp_path / "c", max_steps=5, sampler=Forward(), resume=str(tmp_path / "two.ckpt"))
    del checkpoint["data_parallel_size"]  # written before it was recorded: the processes are the replicas
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with pytest.warns(UserWarning, match=message):
        train(tmp_path / "d", max_steps=5, sampler=Forward(), resume=str(tmp_path / "old.ckpt"))


def test_resume_under_another_seed_keeps_the_checkpoints_order(tmp_path: Path, in_process_ddp: None) -> None:
    """A script that seeds differently when it resumes still trains on the rest of the order the
    checkpoint was written in, and on the uninterrupted run's later epochs; it says so once (under
    DDP, whose sampler orders every epoch by the seed)."""
    ckpt = tmp_path / "cut.ckpt"
    steps_per_epoch = -(-LENGTH // BATCH)
    train(tmp_path / "a", max_steps=5, shuffle=True, strategy="ddp", save=str(ckpt))
    assert loops_of(ckpt)["data_seed"] == SEED
    with pytest.warns(
        UserWarning, match=rf"data order of the checkpoint \(seed {SEED}\), not of this run's seed \(99\)"
    ):
        _, resumed = train(
            tmp_path / "b",
            max_steps=steps_per_epoch + 3,
            shuffle=True,
            strategy="ddp",
            resume=str(ckpt),
            seed=99,
        )
    order = epoch_order(0, shuffle=True)
    assert [r[3] for r in in_epoch(resumed.seen, 0)] == rest_of_epoch(order, 5 * BATCH, 0, 1, drop_last=False)
    assert [r[3] for r in in_epoch(resumed.seen, 1)] == uninterrupted(1, True, 0, 1, drop_last=False)[:3]


@pytest.mark.multiprocess
def test_a_stateless_optimizer_resumes_from_a_full_checkpoint_on_several_processes(jobs: Path) -> None:
    """Plain SGD has no per-parameter state; torch's loader, broadcasting from rank 0, failed on it
    ("Expected device to be set"): only its groups' settings are restored, on every rank."""
    ckpt = jobs / "plain" / "plain.ckpt"  # a: --devices 2 --max-steps 3 --momentum 0 --save plain.ckpt
    assert not torch.load(ckpt, weights_only=True)["optimizer_states"][0]["state"]
    resumed = seen(jobs / "plain" / "b", 2)  # --devices 2 --max-steps 5 --momentum 0 --resume plain.ckpt
    assert [len(records) for records in resumed] == [2, 2]
