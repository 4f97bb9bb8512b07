"""The architecture picture of each environment, drawn from infra/spec alone: `make docs`.

    python scripts/architecture.py                  write docs/architecture-<env>.dot for every environment
    python scripts/architecture.py --png            ... and render each to docs/architecture-<env>.png (Graphviz `dot`)
    python scripts/architecture.py --check          exit 1 when a committed .dot differs from the spec

The DOT text is the tested artefact (tests/test_architecture.py regenerates it and compares); the
PNG is rendered from it. Everything shown comes from infra/spec: the VPC and its subnets per AZ
(infra/spec/addressing.py `subnet_plan`, the CIDRs aws-cdk-lib allocates), NAT gateways, VPC
endpoints (infra/spec/endpoints.py), the cluster, the system node group, each GPU node group with
its EFA interface count, FSx checkpoint storage, the add-ons and their pinned versions, the
CloudFormation stacks (infra/stage.py: Images, Platform, Storage, Gpu-<group>) as fill colours, and where
the Ray head, Ray workers and NVRx pods run (infra/spec/scheduling.py selectors, k8s/ray_spec.py).
Output is deterministic: no clock, no lookups, spec order or sorted.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python scripts/architecture.py`
    sys.path.insert(0, str(ROOT))

from infra.spec import ENVIRONMENTS, Environment, GpuNodeGroupConfig, Scaling  # noqa: E402
from infra.spec.addressing import subnet_plan  # noqa: E402
from infra.spec.endpoints import GATEWAY_ENDPOINTS, INTERFACE_ENDPOINTS  # noqa: E402
from infra.spec.namespaces import KUBERAY, RAY, TRAINING  # noqa: E402
from infra.spec.versions import CORE_ADDONS, HELM_CHARTS, KUBERNETES_VERSION, MANAGED_ADDONS  # noqa: E402

DOCS = ROOT / "docs"
REFRESH = "make docs  (or: python scripts/architecture.py --png)"

# Fill colours: one per CloudFormation stack kind, and one for what cdk8s emits.
PLATFORM_COLOUR = "#dbe9f6"
STORAGE_COLOUR = "#fde0c5"
IMAGES_COLOUR = "#e8e8e8"
GPU_COLOURS = ("#d5efcf", "#fff3b0", "#f3d1e6", "#d9d2f0")
WORKLOAD_COLOUR = "#ffffff"


def dot_path(env_name: str, directory: Path = DOCS) -> Path:
    return directory / f"architecture-{env_name}.dot"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _node(node_id: str, lines: Sequence[str], colour: str, **attrs: str) -> str:
    text = "\\l".join(line.replace('"', '\\"') for line in lines) + "\\l"
    extra = "".join(f", {key}={_quote(value)}" for key, value in sorted(attrs.items()))
    return f'{_quote(node_id)} [label="{text}", fillcolor={_quote(colour)}{extra}];'


def _cluster_id(*parts: str) -> str:
    return "cluster_" + "_".join(p.replace("-", "_").replace(".", "_") for p in parts)


def stacks(env: Environment) -> dict[str, str]:
    """Stack construct id -> CloudFormation stack name, in deploy order (infra/stage.py PlatformStage)."""
    name = env.cluster.name
    found = {"Images": f"{name}-images"} if env.gpu_node_groups else {}
    found["Platform"] = f"{name}-platform"
    if env.add_ons.checkpoint_storage is not None:
        found["Storage"] = f"{name}-storage"
    for group in env.gpu_node_groups:
        found[f"Gpu-{group.name}"] = f"{name}-gpu-{group.name}"
    return found


def _gpu_colour(env: Environment, group: GpuNodeGroupConfig) -> str:
    return GPU_COLOURS[env.gpu_node_groups.index(group) % len(GPU_COLOURS)]


def _scaling(s: Scaling) -> str:
    return f"min {s.min_size} / desired {s.desired_size} / max {s.max_size}"


def _gpu_group_lines(env: Environment, group: GpuNodeGroupConfig) -> list[str]:
    spec = group.instance
    assert spec.gpu is not None  # GpuNodeGroupConfig validates it
    interfaces = group.efa_interface_count
    return [
        f"GPU node group {env.cluster.name}-{group.name}",
        f"{group.instance_type}: {spec.gpu.count} x {spec.gpu.model} {spec.gpu.memory_gib_each} GB",
        _scaling(group.scaling),
        f"EFA: {interfaces} interface{'s' if interfaces != 1 else ''} per node",
        f"capacity: {group.capacity.kind.value}",
        "cluster placement group" if not group.capacity.brings_own_placement else "placed by its reservation",
        "taint nvidia.com/gpu:NoSchedule",
    ]


# AddOnsConfig switch -> (EKS managed add-on, versions.py MANAGED_ADDONS) or (Helm chart, HELM_CHARTS).
# tests/test_architecture.py fails when AddOnsConfig gains a switch that is not listed here.
ADDON_SWITCHES: dict[str, tuple[str, str]] = {
    "node_monitoring_agent": ("managed", "eks-node-monitoring-agent"),
    "observability": ("managed", "amazon-cloudwatch-observability"),
    "nvidia_device_plugin": ("helm", "nvidia-device-plugin"),
    "efa_device_plugin": ("helm", "aws-efa-k8s-device-plugin"),
    "kuberay_operator": ("helm", "kuberay-operator"),
    "kueue": ("helm", "kueue"),
}


def _addon_lines(env: Environment) -> list[str]:
    enabled = [switch for switch in ADDON_SWITCHES if getattr(env.add_ons, switch, False) is True]
    managed = [*CORE_ADDONS, *(ADDON_SWITCHES[s][1] for s in enabled if ADDON_SWITCHES[s][0] == "managed")]
    charts = [ADDON_SWITCHES[s][1] for s in enabled if ADDON_SWITCHES[s][0] == "helm"]
    return [
        "Cluster add-ons (Platform)",
        "EKS managed:",
        *(f"  {name} {MANAGED_ADDONS[name]}" for name in managed),
        "Helm charts:",
        *(f"  {name} {HELM_CHARTS[name].version}" for name in charts),
    ]


def architecture_dot(env: Environment) -> str:
    """The DOT source of one environment's picture."""
    plan = subnet_plan(env.network)
    stack_names = stacks(env)
    cluster = env.cluster.name
    # aws-cdk-lib's Vpc puts its NAT gateways in the first `nat_gateways` public subnets, in AZ order.
    nat_zones = env.network.availability_zones[: env.network.nat_gateways]
    gpu_zone = env.gpu_availability_zone
    lines: list[str] = [
        f"digraph {_quote('architecture-' + env.name)} {{",
        "  graph [fontname=Helvetica, fontsize=13, compound=true, newrank=true, rankdir=TB, nodesep=0.35,"
        ' ranksep=0.45, labelloc=t, labeljust=l, style="rounded", pad=0.3,',
        "    label="
        + _quote(
            f"Environment {env.name}: region {env.region}, EKS {cluster} (Kubernetes {KUBERNETES_VERSION}). "
            f"Generated from infra/spec by {REFRESH.split('  ')[0]}"
        )
        + "];",
        '  node [fontname=Helvetica, fontsize=10, shape=box, style="rounded,filled", margin="0.12,0.06"];',
        '  edge [fontname=Helvetica, fontsize=9, color="#555555"];',
        "",
        f"  subgraph {_cluster_id('region')} {{",
        f'    label={_quote(f"AWS region {env.region}")}; color="#999999";',
        "    "
        + _node(
            "eks",
            [
                f"EKS control plane {cluster}",
                f"Kubernetes {KUBERNETES_VERSION}",
                f"API endpoint: {env.cluster.endpoint_access.value}",
                f"admins: {', '.join(sorted(env.cluster.admin_principals))}",
                f"control-plane logs: {env.cluster.control_plane_log_retention_days} days",
            ],
            PLATFORM_COLOUR,
        ),
        "    " + _node("addons", _addon_lines(env), PLATFORM_COLOUR),
        "",
        f"    subgraph {_cluster_id('vpc')} {{",
        f"      label={_quote(f'VPC {env.network.cidr}, flow logs {env.network.flow_log_retention_days} days')};"
        ' color="#1f77b4"; penwidth=1.5;',
        "      "
        + _node(
            "endpoints",
            [
                "VPC endpoints (private subnets)",
                "interface: " + ", ".join(sorted(INTERFACE_ENDPOINTS.values())),
                "gateway: " + ", ".join(sorted(GATEWAY_ENDPOINTS.values())),
            ],
            PLATFORM_COLOUR,
        ),
        "      "
        + _node(
            "system",
            [
                f"System node group {cluster}-system",
                f"{env.system_nodes.instance_type}, {_scaling(env.system_nodes.scaling)}",
                f"spread over the private subnets of {', '.join(env.network.availability_zones)}",
                "CoreDNS, add-on controllers",
            ],
            PLATFORM_COLOUR,
        ),
    ]
    # Emitted last zone first: Graphviz then draws them left to right in spec order.
    for az in reversed(env.network.availability_zones):
        public, private = plan[az]
        nat = ["NAT gateway"] if az in nat_zones else ["no NAT gateway (egress via " + nat_zones[0] + ")"]
        title = f"{az} (GPU zone: every GPU group and FSx; EFA does not cross AZs)" if az == gpu_zone else az
        lines += [
            "",
            f"      subgraph {_cluster_id('az', az)} {{",
            f'        label={_quote(title)}; color="#7f7f7f"; style="rounded,dashed";',
            "        " + _node(f"public-{az}", [f"public subnet {public}", *nat], PLATFORM_COLOUR),
            f"        subgraph {_cluster_id('private', az)} {{",
            f'          label={_quote(f"private subnet {private}")}; color="#7f7f7f"; style="rounded";',
        ]
        members = [f"private-{az}"]
        lines.append(
            "          "
            + _node(f"private-{az}", ["nodes, pods, endpoint and", "control-plane ENIs"], "#f4f4f4", shape="note")
        )
        if az == gpu_zone:
            for group in env.gpu_node_groups:
                members.append(f"gpu-{group.name}")
                lines.append(
                    "          " + _node(f"gpu-{group.name}", _gpu_group_lines(env, group), _gpu_colour(env, group))
                )
            storage = env.add_ons.checkpoint_storage
            if storage is not None:
                throughput = (
                    f", {storage.throughput_per_tib} MB/s/TiB" if storage.throughput_per_tib is not None else ""
                )
                lines.append(
                    "          "
                    + _node(
                        "fsx",
                        [
                            "FSx for Lustre (checkpoints)",
                            f"{storage.deployment.value}, {storage.storage_capacity_gib} GiB{throughput}",
                            f"aws-fsx-csi-driver {MANAGED_ADDONS['aws-fsx-csi-driver']}",
                            f"PVC {TRAINING.name}/{storage.claim_name}",
                        ],
                        STORAGE_COLOUR,
                        shape="cylinder",
                    )
                )
        lines += ["        }", "      }"]
    lines += ["    }", "  }", ""]

    # Kubernetes workloads (cdk8s, dist/<env>/) and where they are scheduled.
    lines += [
        f"  subgraph {_cluster_id('workloads')} {{",
        f"    label={_quote(f'Kubernetes workloads (cdk8s: dist/{env.name}/)')};"
        ' color="#9467bd"; style="rounded,dashed";',
    ]
    workload_edges: list[str] = []
    if env.add_ons.kuberay_operator:
        lines.append("    " + _node("kuberay", [f"KubeRay operator ({KUBERAY.name})"], WORKLOAD_COLOUR))
        workload_edges.append('  "kuberay" -> "system" [label="runs on"];')
    if env.gpu_node_groups:
        lines.append(
            "    " + _node("ray-head", [f"Ray head ({RAY.name})", "RayCluster head pod, no GPU"], WORKLOAD_COLOUR)
        )
        workload_edges.append('  "ray-head" -> "system" [label="runs on"];')
        for group in env.gpu_node_groups:
            lines.append(
                "    "
                + _node(
                    f"ray-workers-{group.name}",
                    [f"Ray workers ({RAY.name}), group {group.name}", f"{group.workload_nodes} pods, 1 per node"],
                    WORKLOAD_COLOUR,
                )
            )
            workload_edges.append(f'  "ray-workers-{group.name}" -> "gpu-{group.name}" [label="runs on"];')
        # The NVRx job defaults to the first GPU group (k8s/ray_spec.py gpu_group, NvrxFsdpJob.gpu_group=None).
        first = env.gpu_node_groups[0]
        lines.append(
            "    "
            + _node(
                "nvrx",
                [f"NVRx FSDP job ({TRAINING.name})", f"{first.workload_nodes} pods, 1 per node"],
                WORKLOAD_COLOUR,
            )
        )
        workload_edges.append(f'  "nvrx" -> "gpu-{first.name}" [label="runs on (default group)"];')
    lines += ["  }", ""]

    nat_of = {az: az if az in nat_zones else nat_zones[0] for az in env.network.availability_zones}
    zones = env.network.availability_zones
    private_ids = [f"private-{az}" for az in zones]
    edges = [
        *(f'  "eks" -> "{target}" [label="schedules"];' for target in ("system", *gpu_ids(env))),
        *(
            f'  "private-{az}" -> "public-{az}" [label="egress", style=dashed];'
            if nat_of[az] == az
            else f'  "private-{az}" -> "public-{az}" [style=invis];\n'
            f'  "private-{az}" -> "public-{nat_of[az]}" [label="egress", style=dashed, constraint=false];'
            for az in zones
        ),
        *workload_edges,
        # Layout only: rows of pods, control plane, nodes, then NAT and FSx; zones left to right in spec order.
        *(f'  "{w}" -> "eks" [style=invis];' for w in workload_ids(env)),
        _same_rank(["eks", "addons"]),
        _same_rank(["endpoints", "system", *private_ids, *gpu_ids(env)]),
        _same_rank([f"public-{az}" for az in zones] + (["fsx"] if env.add_ons.checkpoint_storage else [])),
        *(f'  "{a}" -> "{b}" [style=invis];' for a, b in itertools.pairwise(["addons", "eks"])),
        *(f'  "{a}" -> "{b}" [style=invis];' for a, b in itertools.pairwise(["endpoints", "system", *private_ids])),
    ]
    if env.add_ons.checkpoint_storage is not None:
        edges += [f'  "gpu-{g.name}" -> "fsx" [label="Lustre mount", style=dashed];' for g in env.gpu_node_groups]
    lines += edges
    lines += ["", *_legend(env, stack_names), "}"]
    return "\n".join(lines) + "\n"


def _legend(env: Environment, stack_names: dict[str, str]) -> list[str]:
    """One table node at the bottom: fill colour = CloudFormation stack."""
    entries: list[tuple[str, str, str]] = []
    if "Images" in stack_names:
        entries.append(("Images", f"{stack_names['Images']}: ECR + CodeBuild (NVRx image)", IMAGES_COLOUR))
    entries.append(("Platform", stack_names["Platform"], PLATFORM_COLOUR))
    if "Storage" in stack_names:
        entries.append(("Storage", stack_names["Storage"], STORAGE_COLOUR))
    for group in env.gpu_node_groups:
        stack_id = f"Gpu-{group.name}"
        entries.append((stack_id, stack_names[stack_id], _gpu_colour(env, group)))
    entries.append(("cdk8s", "Kubernetes objects, not a stack", WORKLOAD_COLOUR))
    cells = "".join(
        f'<TD BGCOLOR="{colour}">{env.name + "/" + stack_id if stack_id != "cdk8s" else "cdk8s"}<BR/>{name}</TD>'
        for stack_id, name, colour in entries
    )
    return [
        '  "legend" [shape=plain, style="", label=<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="4" CELLPADDING="4">'
        '<TR><TD BORDER="0">Fill colour = CloudFormation stack<BR/>'
        f"(cdk deploy '&lt;env&gt;/&lt;stack&gt;')</TD>{cells}</TR>"
        "</TABLE>>];",
        # Below everything: tied under the first zone's public subnet.
        f'  "public-{env.network.availability_zones[0]}" -> "legend" [style=invis];',
    ]


def _same_rank(node_ids: Sequence[str]) -> str:
    return "  { rank=same; " + "; ".join(_quote(n) for n in node_ids) + " }"


def gpu_ids(env: Environment) -> list[str]:
    return [f"gpu-{g.name}" for g in env.gpu_node_groups]


def workload_ids(env: Environment) -> list[str]:
    found = ["kuberay"] if env.add_ons.kuberay_operator else []
    if env.gpu_node_groups:
        found += ["ray-head", *(f"ray-workers-{g.name}" for g in env.gpu_node_groups), "nvrx"]
    return found


def write(directory: Path, *, png: bool) -> list[Path]:
    written = []
    for env in ENVIRONMENTS.values():
        path = dot_path(env.name, directory)
        path.write_text(architecture_dot(env))
        written.append(path)
        if png:
            render(path)
    return written


def render(dot_file: Path) -> Path:
    dot = shutil.which("dot")
    if dot is None:
        raise SystemExit(
            "error: Graphviz `dot` not found; install it (Debian: apt-get install -y graphviz) or run make docs"
        )
    png = dot_file.with_suffix(".png")
    subprocess.run([dot, "-Tpng", "-Gdpi=96", "-o", str(png), str(dot_file)], check=True)
    return png


def stale(directory: Path) -> list[str]:
    """Environments whose committed DOT file differs from what the spec gives now."""
    return [
        env.name
        for env in ENVIRONMENTS.values()
        if not dot_path(env.name, directory).is_file()
        or dot_path(env.name, directory).read_text() != architecture_dot(env)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DOCS, help="directory for the .dot (and .png) files")
    parser.add_argument("--png", action="store_true", help="render each .dot to .png with Graphviz dot")
    parser.add_argument("--check", action="store_true", help="exit 1 when a .dot file differs from the spec")
    args = parser.parse_args(argv)
    if args.check:
        differ = stale(args.out)
        if differ:
            print(f"stale architecture pictures: {', '.join(differ)}; refresh with {REFRESH}", file=sys.stderr)
            return 1
        return 0
    for path in write(args.out, png=args.png):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
