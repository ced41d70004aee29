"""Where processes come from: cluster environments (local, torchrun, SLURM) and the launchers
that start one process per device and end the whole job when any of them fails."""

from fullshard.launch.environments import (
    ClusterEnvironment,
    LocalEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    expand_slurm_hostlist,
    select_cluster_environment,
)
from fullshard.launch.launchers import Launcher, SubprocessScriptLauncher, wait_for_local_children
from fullshard.launch.spawn import SpawnLauncher

__all__ = [
    "ClusterEnvironment",
    "Launcher",
    "LocalEnvironment",
    "SLURMEnvironment",
    "SpawnLauncher",
    "SubprocessScriptLauncher",
    "TorchElasticEnvironment",
    "expand_slurm_hostlist",
    "select_cluster_environment",
    "wait_for_local_children",
]
