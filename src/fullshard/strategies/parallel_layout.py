"""How a job's processes are laid out over data and tensor parallelism: one object, worked out
and checked once, that also builds the device mesh.

[Note: one parallel layout]
A job's processes form ``replicas x shards x tensor_parallel``: ``tensor_parallel`` processes
split each layer between them (tensor parallelism), ``shards`` such groups shard each
parameter between them (FSDP), and ``replicas`` groups of those each hold the whole model
(HYBRID_SHARD's replication; every process under DDP or NO_SHARD). The processes that hold
parts of one model replica see the same batch, so the data is split over
``replicas x shards`` (:attr:`ParallelLayout.data_parallel_size`). Ranks fill the layout row by
row, tensor parallelism innermost ([Note: the 2-D mesh layout] in
fullshard.strategies.model_parallel). A strategy works its layout out once, when the host
configures it, after checking its arguments against the job's size (with messages in the
strategy's own terms); from then on the device mesh, FSDP1's hybrid process groups, the
sampler's split, ``sync_dist`` reductions, the checkpoint's ``data_parallel_size`` and the wrap
plan read it, and no other code multiplies or divides the sizes (torchtitan's ``ParallelDims``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

MeshDim = Literal["replicate", "shard", "data_parallel", "tensor_parallel"]
_DIM_NAMES: tuple[str, ...] = get_args(MeshDim)
#: the 2-D mesh of tensor parallelism under FSDP2: ``ModelParallelStrategy``'s (Lightning's
#: names) and ``FSDP2Strategy(tensor_parallel_size=N)``'s
MESH_DIM_NAMES: tuple[MeshDim, MeshDim] = ("data_parallel", "tensor_parallel")


@dataclass(frozen=True)
class ParallelLayout:
    """The layout of a job's processes (see [Note: one parallel layout]).

    Args:
        replicas: groups that each hold the whole model (sharded within the group).
        shards: processes one parameter is sharded over, within a replica and a tensor-parallel slice.
        tensor_parallel: processes each layer is split over (1: none).
        mesh_dims: the dimensions of the device mesh :meth:`build_mesh` makes, outermost first:
            ``"replicate"`` (size ``replicas``), ``"shard"`` (``shards``), ``"data_parallel"``
            (``replicas x shards``), ``"tensor_parallel"`` (``tensor_parallel``). Together they
            must cover every process.
    """

    replicas: int
    shards: int
    tensor_parallel: int = 1
    mesh_dims: tuple[MeshDim, ...] = ("shard",)

    def __post_init__(self) -> None:
        for name in ("replicas", "shards", "tensor_parallel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ParallelLayout({name}={value!r}): a size must be a positive int (processes)."
                )
        unknown = [d for d in self.mesh_dims if d not in _DIM_NAMES]
        if unknown or not self.mesh_dims:
            raise ValueError(
                f"ParallelLayout(mesh_dims={self.mesh_dims!r}): name one or more of {', '.join(map(repr, _DIM_NAMES))}."
            )
        if math.prod(self.mesh_shape) != self.world_size:
            raise ValueError(
                f"ParallelLayout(mesh_dims={self.mesh_dims!r}) makes a mesh of {self.mesh_shape}, which does not "
                f"cover the layout's {self.world_size} processes ({self.replicas} replicas x {self.shards} shards x "
                f"{self.tensor_parallel} tensor parallel). Choose dimensions whose sizes multiply to {self.world_size}."
            )

    @classmethod
    def split(
        cls,
        world_size: int,
        *,
        replicas: int = 1,
        tensor_parallel: int = 1,
        mesh_dims: tuple[MeshDim, ...] = ("shard",),
    ) -> ParallelLayout:
        """``world_size`` processes as ``replicas`` x shards x ``tensor_parallel``, the shards being
        what is left. A strategy checks its own arguments first, to say what to change in its
        terms; this refuses what no layout can be (for a plan made ahead for another job).

        Raises:
            ValueError: ``replicas x tensor_parallel`` does not divide ``world_size``.
        """
        shards, rest = divmod(world_size, replicas * tensor_parallel)
        if rest or not shards:
            raise ValueError(
                f"{world_size} processes cannot be split into {replicas} replica(s) x {tensor_parallel} tensor "
                f"parallel: use a number of processes that {replicas * tensor_parallel} divides."
            )
        return cls(replicas, shards, tensor_parallel, mesh_dims)

    @property
    def world_size(self) -> int:
        """Processes in the job."""
        return self.replicas * self.shards * self.tensor_parallel

    @property
    def data_parallel_size(self) -> int:
        """Data replicas: the parts each global batch is split into (see [Note: data-parallel ranks])."""
        return self.replicas * self.shards

    def data_parallel_rank(self, global_rank: int) -> int:
        """Which data replica the process of ``global_rank`` is (ranks fill the layout row by row)."""
        return global_rank // self.tensor_parallel

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The size of each of :attr:`mesh_dims`."""
        sizes = {
            "replicate": self.replicas,
            "shard": self.shards,
            "data_parallel": self.data_parallel_size,
            "tensor_parallel": self.tensor_parallel,
        }
        return tuple(sizes[dim] for dim in self.mesh_dims)

    def build_mesh(self, device_type: str) -> DeviceMesh:
        """The device mesh of :attr:`mesh_dims` over every process (collective: the process group
        must be initialised)."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=self.mesh_dims)

    def data_parallel_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The part of ``mesh`` FSDP shards over: its ``"data_parallel"`` dimension under tensor
        parallelism, otherwise all of it."""
        return mesh["data_parallel"] if "tensor_parallel" in self.mesh_dims else mesh
