"""Pure data: environments, instance facts and versions. Importable without CDK or cdk8s."""

from infra.spec.environments import (
    ENVIRONMENTS,
    AcknowledgedReplacement,
    AddOnsConfig,
    Capacity,
    CapacityKind,
    CheckpointStorageConfig,
    ClusterConfig,
    EndpointAccess,
    Environment,
    GpuNodeGroupConfig,
    LustreDeployment,
    NetworkConfig,
    Scaling,
    SystemNodeGroupConfig,
    get_environment,
)
from infra.spec.errors import ConfigError
from infra.spec.instances import INSTANCE_TYPES, InstanceType, instance_type

__all__ = [
    "ENVIRONMENTS",
    "INSTANCE_TYPES",
    "AcknowledgedReplacement",
    "AddOnsConfig",
    "Capacity",
    "CapacityKind",
    "CheckpointStorageConfig",
    "ClusterConfig",
    "ConfigError",
    "EndpointAccess",
    "Environment",
    "GpuNodeGroupConfig",
    "InstanceType",
    "LustreDeployment",
    "NetworkConfig",
    "Scaling",
    "SystemNodeGroupConfig",
    "get_environment",
    "instance_type",
]
