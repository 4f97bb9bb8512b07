"""Training pods say which job and instance type they are (issue 15): the throughput-under-baseline alarm groups by
JobName and InstanceType, so a pod without them reports 'unknown'. Their EMF lines reach CloudWatch from the container's
own log (issue 38: the add-on's Fluent Bit reads the workload namespaces' container logs, and nothing listens for EMF
on the nodes), so no pod names an agent endpoint; a Ray worker, whose training processes write to Ray's log files,
also writes each line to the container's stdout."""

from __future__ import annotations

from pathlib import Path

from gates import outputs
from infra.spec import ENVIRONMENTS
from training.emf import CONTAINER_LOG_ENV, CONTAINER_STDOUT, INSTANCE_TYPE_ENV, JOB_NAME_ENV


def _training_containers(dist: Path) -> list[tuple[str, str, str, dict[str, str]]]:
    """(environment, kind, workload name, env) of the containers that run training code on GPUs."""
    found = []
    for where, obj in outputs.manifests(dist):
        env_name = where.split("/", 1)[0]
        kind, name = obj.get("kind"), obj.get("metadata", {}).get("name", "")
        if kind == "Job" and name.startswith("nvrx"):
            containers = obj["spec"]["template"]["spec"]["containers"]
        elif kind in ("RayJob", "RayCluster"):
            spec = obj["spec"].get("rayClusterSpec", obj["spec"])
            containers = [c for g in spec["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]]
        else:
            continue
        for container in containers:
            env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
            found.append((env_name, str(kind), name, env))
    return found


def test_training_pods_name_their_job_and_instance_type_and_no_agent(dist: Path) -> None:
    found = _training_containers(dist)
    assert {(e, n) for e, _, n, _ in found} == {
        (env, name) for env in ("dev", "prod") for name in ("nvrx-fsdp", "qwen-finetune", "training")
    }
    for env_name, kind, name, env in found:
        environment = ENVIRONMENTS[env_name]
        assert env[JOB_NAME_ENV] == name
        assert env[INSTANCE_TYPE_ENV] in {g.instance_type for g in environment.gpu_node_groups}
        assert not any(key.startswith("AWS_EMF_") for key in env), (env_name, name, env)
        # NVRx workers inherit the container's stdout from ft_launcher; a second copy would count every step twice.
        expected = CONTAINER_STDOUT if kind in ("RayJob", "RayCluster") else None
        assert env.get(CONTAINER_LOG_ENV) == expected, (env_name, name)
