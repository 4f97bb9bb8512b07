"""Training pods say where their EMF throughput lines go and which job and instance type they are (issue 15):
the throughput-under-baseline alarm groups by JobName and InstanceType, so a pod without them reports 'unknown'."""

from __future__ import annotations

from pathlib import Path

from gates import outputs
from infra.spec import ENVIRONMENTS
from infra.spec.metrics import EMF_AGENT_ENDPOINT
from training.emf import AGENT_ENDPOINT_ENV, INSTANCE_TYPE_ENV, JOB_NAME_ENV


def _training_containers(dist: Path) -> list[tuple[str, str, dict[str, str]]]:
    """(environment, workload name, env) of the containers that run training code on GPUs."""
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
            found.append((env_name, name, env))
    return found


def test_training_pods_name_their_job_instance_type_and_the_agent(dist: Path) -> None:
    found = _training_containers(dist)
    assert {(e, n) for e, n, _ in found} == {
        (env, name) for env in ("dev", "prod") for name in ("nvrx-fsdp", "qwen-finetune", "training")
    }
    for env_name, name, env in found:
        environment = ENVIRONMENTS[env_name]
        assert env[JOB_NAME_ENV] == name
        assert env[INSTANCE_TYPE_ENV] in {g.instance_type for g in environment.gpu_node_groups}
        expected = EMF_AGENT_ENDPOINT if environment.add_ons.observability else None
        assert env.get(AGENT_ENDPOINT_ENV) == expected, (env_name, name)
