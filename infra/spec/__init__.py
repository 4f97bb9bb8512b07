"""Pure data: environments, instance facts and versions. Importable without CDK or cdk8s."""

from infra.spec.environments import (
    ENVIRONMENTS,
    Capacity,
    CapacityKind,
    ClusterConfig,
    EndpointAccess,
    Environment,
    GpuNodeGroupConfig,
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
    "Capacity",
    "CapacityKind",
    "ClusterConfig",
    "ConfigError",
    "EndpointAccess",
    "Environment",
    "GpuNodeGroupConfig",
    "InstanceType",
    "NetworkConfig",
    "Scaling",
    "SystemNodeGroupConfig",
    "get_environment",
    "instance_type",
]
