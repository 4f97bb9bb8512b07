"""leftover: what an earlier deployment left: an EKS cluster or a GPU node group of the fixed name outside
its stack (blocks), retained FSx file systems outside the storage stack (cost), the control-plane log
group (adopted) (cloudformation:ListStackResources, eks:DescribeCluster, DescribeNodegroup,
fsx:DescribeFileSystems, logs:DescribeLogGroups)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from infra.spec import Environment, GpuNodeGroupConfig
from infra.spec.replacement_names import gpu_nodegroup_name
from trainctl.aws import Aws
from trainctl.preflight.results import (
    ENVIRONMENT_TAG,
    Check,
    CheckResult,
    Say,
    Status,
    attempt,
    date_text,
)
from trainctl.preflight.scaled import evaluate_scaled


def platform_stack_name(env: Environment) -> str:
    return f"{env.cluster.name}-platform"


def storage_stack_name(env: Environment) -> str:
    return f"{env.cluster.name}-storage"


def control_plane_log_group(env: Environment) -> str:
    """The name EKS writes control-plane logs to (EKS user guide, control-plane logs); fixed by AWS."""
    return f"/aws/eks/{env.cluster.name}/cluster"


def live_ids(resources: Sequence[Mapping[str, Any]] | None, resource_type: str) -> set[str]:
    """Physical ids of a stack's resources of one type that the stack still holds. A stack rolled back
    after its first create lists them DELETE_COMPLETE, or DELETE_SKIPPED where retained."""
    return {
        str(r.get("PhysicalResourceId"))
        for r in resources or ()
        if r.get("ResourceType") == resource_type and not str(r.get("ResourceStatus", "")).startswith("DELETE_")
    }


def evaluate_cluster_leftover(
    env: Environment, cluster: Mapping[str, Any] | None, stack_resources: Sequence[Mapping[str, Any]] | None
) -> CheckResult:
    name = env.cluster.name
    stack = platform_stack_name(env)
    subject = f"EKS cluster {name}"
    if cluster is None:
        return CheckResult(
            Check.LEFTOVER, subject, Status.PASS, "none of that name in the region: the deploy creates it"
        )
    if name in live_ids(stack_resources, "AWS::EKS::Cluster"):
        return CheckResult(Check.LEFTOVER, subject, Status.PASS, f"belongs to stack {stack}: the deploy updates it")
    owner = "does not exist" if stack_resources is None else "does not hold it"
    return CheckResult(
        Check.LEFTOVER,
        subject,
        Status.FAIL,
        f"a cluster of that name exists ({cluster.get('status', 'status unknown')}, created "
        f"{date_text(cluster.get('createdAt'))}) and stack {stack} {owner}: creating it fails (ResourceInUseException) "
        "and rolls the stack back",
        f"if it is a leftover, delete its node groups and then it (aws eks delete-cluster --name {name} "
        f"--region {env.region}); or change cluster.name in infra/spec/environments.py",
    )


def evaluate_log_group(env: Environment, group: Mapping[str, Any] | None) -> CheckResult:
    """The stack adopts the control-plane log group (infra/cluster.py: a LogRetention on the fixed
    name, which creates it when missing and sets retention on one that exists) instead of creating
    it, so one left by an earlier deployment, or written by EKS itself, does not block a create."""
    name = control_plane_log_group(env)
    days = env.cluster.control_plane_log_retention_days
    if group is None:
        return CheckResult(
            Check.LEFTOVER, f"log group {name}", Status.PASS, f"does not exist: the deploy creates it ({days} days)"
        )
    kept = group.get("retentionInDays")
    now = f"{kept} days" if kept is not None else "never expires"
    return CheckResult(
        Check.LEFTOVER,
        f"log group {name}",
        Status.PASS,
        f"exists ({now}, {group.get('storedBytes', 0)} bytes): the deploy adopts it and sets {days} days",
    )


def evaluate_file_systems(
    env: Environment,
    file_systems: Sequence[Mapping[str, Any]],
    storage: Sequence[Mapping[str, Any]] | None,
    platform: Sequence[Mapping[str, Any]] | None,
) -> list[CheckResult]:
    """A retained FSx file system (RemovalPolicy.RETAIN) outlives its stack and keeps costing; a new
    deploy does not fail on it but creates a second one beside it."""
    tag = f"{ENVIRONMENT_TAG}={env.name}"
    stack = storage_stack_name(env)
    owned = live_ids(storage, "AWS::FSx::FileSystem")
    in_platform = live_ids(platform, "AWS::FSx::FileSystem")
    results = []
    for fs in file_systems:
        fs_id = str(fs.get("FileSystemId"))
        size = f"{fs.get('StorageCapacity')} GiB, {fs.get('Lifecycle', 'lifecycle unknown')}"
        subject = f"FSx {fs_id}"
        if fs_id in owned:
            results.append(CheckResult(Check.LEFTOVER, subject, Status.PASS, f"belongs to stack {stack} ({size})"))
            continue
        keep = (
            f"import it into {stack} (cdk import) to keep its data, or copy what you need and delete it "
            f"(aws fsx delete-file-system --file-system-id {fs_id} --region {env.region})"
        )
        if fs_id in in_platform:
            results.append(
                CheckResult(
                    Check.LEFTOVER,
                    subject,
                    Status.WARN,
                    f"belongs to stack {platform_stack_name(env)} (the layout before the storage stack, {size}): "
                    f"the deploy leaves it behind (retained) and {stack} creates a new one",
                    keep,
                )
            )
            continue
        owner = "does not exist" if storage is None else "does not hold it"
        results.append(
            CheckResult(
                Check.LEFTOVER,
                subject,
                Status.WARN,
                f"tagged {tag} ({size}), but stack {stack} {owner}: a retained leftover that keeps costing; "
                "the deploy creates a second file system beside it",
                keep,
            )
        )
    if not results:
        results.append(CheckResult(Check.LEFTOVER, "FSx file systems", Status.PASS, f"no file system tagged {tag}"))
    return results


def gpu_stack_name(env: Environment, group: GpuNodeGroupConfig) -> str:
    return f"{env.cluster.name}-gpu-{group.name}"


def evaluate_nodegroup_leftover(
    env: Environment,
    group: GpuNodeGroupConfig,
    nodegroup: Mapping[str, Any] | None,
    stack_resources: Sequence[Mapping[str, Any]] | None,
    platform_resources: Sequence[Mapping[str, Any]] | None,
) -> CheckResult:
    """GPU node groups have fixed names (<cluster>-<group>-<zone>-<od|cb>, infra/spec/replacement_names.py)
    and live in their own stack.
    One that outlived its stack (a delete that failed, a hand-made one) makes the stack's create fail:
    node group names are unique within a cluster (CreateNodegroup: ResourceInUseException)."""
    name = gpu_nodegroup_name(env, group)
    stack = gpu_stack_name(env, group)
    subject = f"node group {name}"
    if nodegroup is None:
        return CheckResult(Check.LEFTOVER, subject, Status.PASS, f"none in cluster {env.cluster.name}")
    # CloudFormation's physical id (Ref) of an AWS::EKS::Nodegroup is "<cluster>/<nodegroup>" (aws/aws-cdk#22442).
    physical = f"{env.cluster.name}/{name}"
    if physical in live_ids(stack_resources, "AWS::EKS::Nodegroup"):
        return CheckResult(Check.LEFTOVER, subject, Status.PASS, f"belongs to stack {stack}: the deploy updates it")
    if physical in live_ids(platform_resources, "AWS::EKS::Nodegroup"):
        return CheckResult(
            Check.LEFTOVER,
            subject,
            Status.WARN,
            f"belongs to stack {platform_stack_name(env)} (the layout before the GPU stacks): updating that stack "
            f"deletes it and its instances, then {stack} creates it again",
            "drain the group's jobs before the deploy",
        )
    owner = "does not exist" if stack_resources is None else "does not hold it"
    return CheckResult(
        Check.LEFTOVER,
        subject,
        Status.FAIL,
        f"exists ({nodegroup.get('status', 'status unknown')}) and stack {stack} {owner}: creating it fails "
        "(ResourceInUseException) and rolls the stack back",
        f"delete it (aws eks delete-nodegroup --cluster-name {env.cluster.name} --nodegroup-name {name} "
        f"--region {env.region}), or rename the group in infra/spec/environments.py",
    )


def leftover_checks(env: Environment, aws: Aws, *, region: str, say: Callable[[str], None]) -> list[CheckResult]:
    results: list[CheckResult] = []
    stacks: dict[str, list[dict[str, Any]] | None] = {}

    def resources(stack: str) -> list[dict[str, Any]] | None:
        if stack not in stacks:
            stacks[stack] = aws.stack_resources(stack)
        return stacks[stack]

    say(f"leftovers of earlier deployments of {env.cluster.name}")
    cluster: list[dict[str, Any] | None] = []

    def cluster_check() -> list[CheckResult]:
        cluster.append(aws.eks_cluster(env.cluster.name))
        return [evaluate_cluster_leftover(env, cluster[0], resources(platform_stack_name(env)))]

    results += attempt(Check.LEFTOVER, [f"EKS cluster {env.cluster.name}"], region, cluster_check)
    if cluster and cluster[0] is not None:  # node groups exist only inside a cluster
        for group in env.gpu_node_groups:

            def nodegroup_check(group: GpuNodeGroupConfig = group) -> list[CheckResult]:
                name = gpu_nodegroup_name(env, group)
                found = aws.eks_nodegroup(env.cluster.name, name)
                if found is None:
                    return [evaluate_nodegroup_leftover(env, group, None, None, None)]
                own, platform = resources(gpu_stack_name(env, group)), resources(platform_stack_name(env))
                leftover = evaluate_nodegroup_leftover(env, group, found, own, platform)
                return [leftover, evaluate_scaled(env, group, found)]  # its size beside the spec's

            name = f"node group {gpu_nodegroup_name(env, group)}"
            results += attempt(Check.LEFTOVER, [name], region, nodegroup_check)
    results += attempt(
        Check.LEFTOVER,
        [f"log group {control_plane_log_group(env)}"],
        region,
        lambda: [evaluate_log_group(env, aws.log_group(control_plane_log_group(env)))],
    )
    results += attempt(
        Check.LEFTOVER,
        ["FSx file systems"],
        region,
        lambda: evaluate_file_systems(
            env,
            aws.file_systems_tagged(ENVIRONMENT_TAG, env.name),
            resources(storage_stack_name(env)),
            resources(platform_stack_name(env)),
        ),
    )
    return results


def gather(env: Environment, aws: Aws, say: Say) -> list[CheckResult]:
    return leftover_checks(env, aws, region=aws.region, say=say)
