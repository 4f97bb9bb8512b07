"""Names of what CloudFormation or Kubernetes must be able to replace: each name carries the inputs whose
change replaces the object, so a replacement comes with a new name.

CloudFormation cannot replace a resource that keeps a literal name ("cannot update a stack when a
custom-named resource requires replacing"): it creates the replacement before it deletes the original, and
two node groups of one name cannot exist in a cluster. `AWS::EKS::Nodegroup` replaces on a change of
Subnets, CapacityType, NodegroupName, AmiType, InstanceTypes, DiskSize, NodeRole, RemoteAccess or ClusterName
(createOnlyProperties of its resource schema, as cfn-lint ships it). Of these the environment config moves
two: the subnet (`gpu_availability_zone`) and the capacity type (a Capacity Block group is CAPACITY_BLOCK,
On-Demand and reservation groups are ON_DEMAND); the GPU group's name carries both. The system group's name
stays literal: nothing in the config replaces it short of a new VPC (`trainctl plan` refuses a replacement
that keeps a literal name).

A PersistentVolume's source is immutable after creation (`spec.persistentvolumesource is immutable after
creation`). The FSx file system is replaced when its subnet changes (`AWS::FSx::FileSystem` createOnly:
SubnetIds, SecurityGroupIds, FileSystemType, KmsKeyId, BackupId; only the subnet follows the config), so its
volumes are named after the zone too: a new file system gets new volumes, and the old volumes are pruned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.spec.environments import CheckpointStorageConfig, Environment, GpuNodeGroupConfig

# CreateNodegroup: nodegroupName, 1-63 characters, a letter or digit first, then letters, digits, - and _.
NODEGROUP_NAME_MAX = 63


def capacity_code(group: GpuNodeGroupConfig) -> str:
    """The node group's CloudFormation CapacityType, short: `cb` for a Capacity Block, `od` otherwise
    (a reservation group launches On-Demand instances into its ODCR: same capacity type, no replacement)."""
    from infra.spec.environments import CapacityKind

    return "cb" if group.capacity.kind is CapacityKind.CAPACITY_BLOCK else "od"


def gpu_nodegroup_name(env: Environment, group: GpuNodeGroupConfig) -> str:
    """`<cluster>-<group>-<zone>-<od|cb>`, e.g. ml-prod-p5-us-east-2a-od: what infra/stage.py creates and
    trainctl (scale, preflight) looks up."""
    return f"{env.cluster.name}-{group.name}-{env.gpu_availability_zone}-{capacity_code(group)}"


def system_nodegroup_name(env: Environment) -> str:
    return f"{env.cluster.name}-system"


def checkpoint_volume_names(
    env: Environment, storage: CheckpointStorageConfig, namespaces: tuple[str, ...]
) -> dict[str, str]:
    """One static PersistentVolume per claim namespace, named after the file system's zone:
    `<env>-<claim>-<zone>` for the first namespace, `-<namespace>` appended for the others."""
    base = f"{env.name}-{storage.claim_name}-{env.gpu_availability_zone}"
    return {ns: base if i == 0 else f"{base}-{ns}" for i, ns in enumerate(namespaces)}
