"""The pod runtime: start, watch and kill pods, each an isolated process tree (see podinit.py).

What a pod gets here, and what stands in for the cluster:
- volumes: emptyDir = a directory private to the pod under the run's output directory (a tmpfs for
  `medium: Memory`); persistentVolumeClaim = one directory per (namespace, claim name), shared by
  every pod that mounts it; configMap = the ConfigMap's keys as files (`items` and `subPath`
  honoured, read-only) from an object of the same files; missing mount points are created on the
  host as empty directories (they are left there: removing one that is a mount point in another
  rehearsal's namespace would detach that mount);
- DNS: a per-pod /etc/hosts rewritten in place (same inode, which is what the bind mount follows)
  whenever pods come or go, with the names the cluster DNS would answer (pod A records through a
  headless Service: `<hostname>.<subdomain>.<ns>.svc.cluster.local`; Services:
  `<svc>.<ns>.svc.cluster.local`, `<svc>.<ns>.svc`, `<svc>.<ns>` and, in the same namespace, `<svc>`);
  a Service's name maps straight to its pods' addresses (no virtual ClusterIP, no kube-proxy);
- the image is not pulled: containers run with this machine's Python environment (its bin first on
  PATH), or, for an image in Options.image_python, with the environment built for that image (its
  Python and package versions: scripts/image_envs.py); the image is reported beside the pod; GPU and
  EFA requests are reported, not satisfied.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.spec.namespaces import KUBERAY
from infra.spec.network_policies import KUBERAY_OPERATOR_PODS, RAY_DASHBOARD_PORT
from rehearse import policy_routes
from rehearse.errors import RehearsalError
from rehearse.network import Network
from rehearse.network_policy import Endpoint, Policies, endpoint_of
from rehearse.policy_routes import rules_toward
from rehearse.seams import ApiServer, Clock, MonotonicClock
from training.rehearsal import REHEARSAL_CPU, REHEARSAL_ENV

# The repository (the parent of rehearse/): pods import rehearse.podinit from here, not from an installed copy.
REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_DOMAIN = "cluster.local"
ACCELERATORS = ("nvidia.com/gpu", "vpc.amazonaws.com/efa")
# Each pod mounts its own tmpfs on these (podinit.py).
POD_PRIVATE_DIRS = (Path("/tmp"), Path("/dev/shm"), Path("/root"))
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's generateName alphabet


def _tag_reference(image: str) -> str:
    """repository:tag of an image reference, without its digest."""
    return image.split("@", 1)[0]


def _prefixes(python: Path) -> set[Path]:
    """The environment a Python interpreter runs in and the installation under it (a virtualenv's base Python)."""
    done = subprocess.run(
        [str(python), "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return {Path(line).resolve() for line in done.stdout.splitlines() if line}


class PodSetupError(RuntimeError):
    """A pod that could not be created (bad volume, missing ConfigMap, no command)."""


def random_suffix() -> str:
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(5))


def object_uid(kind: str, namespace: str, name: str) -> str:
    """A stable uid for an object of the rehearsal (the API server's are random; these repeat per name)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"rehearsal:{kind}/{namespace}/{name}"))


@dataclass
class PodPlan:
    """A pod to create: metadata chosen by its controller and the pod spec from the manifest."""

    name: str
    namespace: str
    spec: dict[str, Any]
    workload: str
    hostname: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    # Containers the controller adds to the pod that the rehearsal does not run (KubeRay's autoscaler
    # sidecar): a cluster's scheduler counts their requests.
    unrun_containers: list[dict[str, Any]] = field(default_factory=list)
    # The node the pod is launched on (set by `Runtime.launch`; the Downward API's spec.nodeName).
    node: str | None = None
    # metadata.ownerReferences as its controller sets them (the rehearsal's API server serves them).
    owner_references: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pod_hostname(self) -> str:
        return self.spec.get("hostname") or self.hostname or self.name[:63]


def sidecar_names(spec: Mapping[str, Any]) -> set[str]:
    """Init containers with `restartPolicy: Always`: native sidecars (Kubernetes 1.36, GA since 1.33)."""
    return {c["name"] for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"}


@dataclass
class Pod:
    """A pod record: created Pending (not yet placed or started), Running once launched, then ended."""

    plan: PodPlan
    directory: Path
    started: float
    images: list[str]
    address: str = ""
    process: subprocess.Popen[bytes] | None = None
    hosts_file: Path | None = None
    launched: float | None = None
    ended: float | None = None
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    # Per container: the terminated (or waiting) reason and the termination message, as kubectl shows them.
    reasons: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    phase: str = "Pending"
    conditions: list[dict[str, str]] = field(default_factory=list)
    deleted_by_controller: bool = False
    # The node the Placement seam bound the pod to (None: unconstrained), and why it is still Pending.
    node: str | None = None
    pending_reason: str = ""
    # The pod's node was lost: its processes are dead, the API still shows it until it is evicted.
    node_lost: bool = False

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def running(self) -> bool:
        """Active for its controller: Pending or Running (a Pending pod counts as active on a cluster too)."""
        return self.ended is None

    @property
    def pending(self) -> bool:
        return self.ended is None and self.launched is None

    def main_failed(self) -> bool:
        """Failed as the kubelet decides the phase: a main or (non-sidecar) init container ended non-zero."""
        sidecars = sidecar_names(self.plan.spec)
        names = [c["name"] for c in [*self.plan.spec.get("initContainers", []), *self.plan.spec["containers"]]]
        return any(self.exit_codes.get(n) for n in names if n not in sidecars)

    def read_status(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.directory / "status.json").read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            return {}
        return data

    def refresh(self) -> None:
        status = self.read_status()
        if not status:
            # A torn read: podinit rewrites the file in place (truncate, then write), so a read between the two, or
            # during the write, finds nothing whole; the last whole status stands (a fresh clone's make test once
            # reported a pod restarted three times as never restarted).
            return
        containers = status.get("containers", {})
        self.restarts = sum(int(c.get("restarts", 0)) for c in containers.values())
        for name, c in {**status.get("init", {}), **containers}.items():
            self.exit_codes[name] = c.get("exit_code")
            if c.get("reason"):
                self.reasons[name] = str(c["reason"])
            if c.get("message"):
                self.messages[name] = str(c["message"])

    def log(self, container: str | None = None) -> str:
        names = [container] if container else [c["name"] for c in self.plan.spec["containers"]]
        return "".join(
            (self.directory / f"{n}.log").read_text(errors="replace")
            for n in names
            if (self.directory / f"{n}.log").exists()
        )


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in env values, command and args ($$ escapes; unknown stays)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, text)


_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


# The KubeRay operator's pod, as NetworkPolicies see it: KubeRay reads each head's dashboard from there (through
# the head's Service; the rehearsal reads it from inside the head's network namespace and asks the policies first).
KUBERAY_OPERATOR = Endpoint("kuberay-operator", KUBERAY.name, dict(KUBERAY_OPERATOR_PODS))


class PolicyDeniedError(RehearsalError):
    """The run's NetworkPolicies stop a controller the rehearsal plays from reaching a pod it must reach."""


class Runtime:
    """Pods of one rehearsal run; `poll()` returns the pods that ended since the last call."""

    def __init__(
        self,
        *,
        output_dir: Path,
        network: Network,
        configmaps: Mapping[tuple[str, str], Mapping[str, str]],
        services: list[dict[str, Any]],
        host_paths: Iterable[Path] = (),
        log: Callable[[str], None] = lambda _: None,
        clock: Clock | None = None,
        node_addresses: Mapping[str, str] | None = None,
        api: ApiServer | None = None,
        image_python: Mapping[str, Path] | None = None,
        container_backoff_s: float = 10.0,
        policies: Policies | None = None,
    ) -> None:
        self.clock: Clock = clock or MonotonicClock()
        # The run's NetworkPolicies: enforced on the bridge network (policy_routes.py); run.py refuses them elsewhere.
        self.policies = policies or Policies()
        # The kubelet's first container-restart delay, in wall seconds (10 s on a node; podinit doubles it).
        self.container_backoff_s = container_backoff_s
        self.api = api
        # Per pod: what the API server gives its containers (address, token), before their own env.
        self._api_env: dict[str, dict[str, str]] = {}
        # Node name -> its address (status.hostIP), for pods a cluster placement bound to a node.
        self.node_addresses = dict(node_addresses or {})
        self.output_dir = output_dir
        self.network = network
        self.configmaps = configmaps
        self.services = services
        # Image reference -> the bin directory of the environment its containers run with (default: this one's).
        self.image_bins = {
            _tag_reference(image): str(Path(python).parent) for image, python in (image_python or {}).items()
        }
        # The Python environments the containers run with, where a pod's own /tmp or /root would hide them.
        runtime_paths = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
        for python in (image_python or {}).values():
            runtime_paths |= _prefixes(Path(python))
        hidden = [p for p in runtime_paths if any(p.is_relative_to(d) for d in POD_PRIVATE_DIRS)]
        self.host_paths = tuple(dict.fromkeys([*(Path(p).resolve() for p in host_paths), *sorted(hidden)]))
        self.pods: dict[str, Pod] = {}
        self.log = log
        self.venv_bin = str(Path(sys.executable).parent)

    # -- DNS -------------------------------------------------------------------------------
    def _endpoints(self, service: dict[str, Any]) -> list[Pod]:
        selector = service.get("spec", {}).get("selector") or {}
        namespace = service["metadata"].get("namespace", "default")
        return [
            p
            for p in self.pods.values()
            if p.running
            and p.launched is not None
            and not p.node_lost
            and p.plan.namespace == namespace
            and selector
            and all(p.plan.labels.get(k) == v for k, v in selector.items())
        ]

    def hosts_for(self, pod: Pod) -> str:
        ns = pod.plan.namespace
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        own = [pod.plan.pod_hostname]
        subdomain = pod.plan.spec.get("subdomain")
        if subdomain:
            own.insert(0, f"{pod.plan.pod_hostname}.{subdomain}.{ns}.svc.{CLUSTER_DOMAIN}")
        lines.append(f"{pod.address}\t{' '.join(own)}")
        for service in self.services:
            svc = service["metadata"]["name"]
            svc_ns = service["metadata"].get("namespace", "default")
            names = [f"{svc}.{svc_ns}.svc.{CLUSTER_DOMAIN}", f"{svc}.{svc_ns}.svc", f"{svc}.{svc_ns}"]
            if svc_ns == ns:
                names.append(svc)
            headless = service.get("spec", {}).get("clusterIP") == "None"
            for endpoint in self._endpoints(service):
                lines.append(f"{endpoint.address}\t{' '.join(names)}")
                # A pod resolves its own headless name too (DNS answers for every pod, itself included).
                if headless and endpoint.plan.spec.get("subdomain") == svc:
                    h = endpoint.plan.pod_hostname
                    pod_names = [f"{h}.{svc}.{svc_ns}.svc.{CLUSTER_DOMAIN}", f"{h}.{svc}.{svc_ns}.svc"]
                    if svc_ns == ns:
                        pod_names.append(f"{h}.{svc}")
                    lines.append(f"{endpoint.address}\t{' '.join(pod_names)}")
        return "\n".join(lines) + "\n"

    def refresh_hosts(self) -> None:
        for pod in self.pods.values():
            if pod.running and pod.hosts_file is not None:
                # In place: the pod's /etc/hosts is a bind mount of this inode.
                with pod.hosts_file.open("r+") as f:
                    f.truncate(0)
                    f.write(self.hosts_for(pod))

    # -- pod creation ----------------------------------------------------------------------
    def _field(self, plan: PodPlan, address: str, path: str) -> str:
        simple = {
            "metadata.name": plan.name,
            "metadata.uid": plan.uid,
            "metadata.namespace": plan.namespace,
            "status.podIP": address,
            "status.podIPs": address,
            "status.hostIP": self.node_addresses.get(plan.node or "", address),
            "spec.nodeName": plan.node or "rehearsal",
            "spec.serviceAccountName": str(plan.spec.get("serviceAccountName", "default")),
        }
        if path in simple:
            return simple[path]
        m = _FIELD_LABEL.match(path)
        if m:
            source = plan.labels if m.group(1) == "labels" else plan.annotations
            return source.get(m.group(2), "")
        raise PodSetupError(f"pod {plan.name}: env fieldRef {path!r} is not supported by the rehearsal")

    def _env(self, plan: PodPlan, container: dict[str, Any], address: str) -> dict[str, str]:
        bin_dir = self.image_bins.get(_tag_reference(str(container.get("image", ""))), self.venv_bin)
        env = {
            "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "HOSTNAME": plan.pod_hostname,
            "LANG": "C.UTF-8",
            **self._api_env.get(plan.name, {}),
        }
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref is None:
                raise PodSetupError(f"pod {plan.name}: envFrom {source} is not supported by the rehearsal")
            data = self.configmaps.get((plan.namespace, ref["name"]))
            if data is None:
                raise PodSetupError(f"pod {plan.name}: ConfigMap {ref['name']!r} is not in the files")
            env.update({f"{source.get('prefix', '')}{k}": v for k, v in data.items()})
        for item in container.get("env", []):
            name = item["name"]
            if "value" in item:
                env[name] = expand(str(item["value"]), env)
            elif "valueFrom" in item:
                source = item["valueFrom"]
                if "fieldRef" in source:
                    env[name] = self._field(plan, address, source["fieldRef"]["fieldPath"])
                elif "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    env[name] = self.configmaps.get((plan.namespace, ref["name"]), {}).get(ref["key"], "")
                else:
                    raise PodSetupError(f"pod {plan.name}: env {name} valueFrom {sorted(source)} is not supported")
            else:
                env[name] = ""
        env.update(plan.extra_env)
        # CPU rehearsal is explicit: training/rehearsal.py documents what the training code does with it.
        env[REHEARSAL_ENV] = REHEARSAL_CPU
        return env

    def _container(self, plan: PodPlan, container: dict[str, Any], address: str, directory: Path) -> dict[str, Any]:
        env = self._env(plan, container, address)
        argv = [expand(str(a), env) for a in [*container.get("command", []), *container.get("args", [])]]
        if not container.get("command"):
            raise PodSetupError(
                f"pod {plan.name}: container {container['name']!r} has no command; the rehearsal cannot know "
                f"the entrypoint of image {container.get('image')!r}"
            )
        return {
            "name": container["name"],
            "argv": argv,
            "env": env,
            "cwd": container.get("workingDir", "/"),
            "log": str(directory / f"{container['name']}.log"),
            "sidecar": container.get("restartPolicy") == "Always",
            # The kubelet's defaults (pkg/apis/core/v1/defaults.go): /dev/termination-log, policy File.
            "termination_message_path": container.get("terminationMessagePath", "/dev/termination-log"),
            "termination_message_policy": container.get("terminationMessagePolicy", "File"),
            "termination_file": str(directory / f"{container['name']}.termination-log"),
        }

    def _volumes(self, plan: PodPlan, directory: Path) -> dict[str, dict[str, Any]]:
        sources: dict[str, dict[str, Any]] = {}
        for volume in plan.spec.get("volumes", []):
            name = volume["name"]
            if "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    size = empty.get("sizeLimit")
                    sources[name] = {"kind": "tmpfs", "options": f"size={_tmpfs_size(size)}" if size else None}
                else:
                    path = directory / "volumes" / name
                    path.mkdir(parents=True, exist_ok=True)
                    sources[name] = {"kind": "bind", "source": str(path)}
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                path = self.output_dir / "claims" / plan.namespace / claim
                path.mkdir(parents=True, exist_ok=True)
                sources[name] = {"kind": "bind", "source": str(path)}
            elif "configMap" in volume or "projected" in volume:
                # A projected volume of ConfigMaps: each source's keys into the one directory, as the kubelet does.
                refs = [volume["configMap"]] if "configMap" in volume else []
                for source in volume.get("projected", {}).get("sources", []):
                    if set(source) != {"configMap"}:
                        raise PodSetupError(
                            f"pod {plan.name}: projected volume {name!r} source {sorted(source)} is not supported"
                        )
                    refs.append(source["configMap"])
                path = directory / "configmaps" / name
                for ref in refs:
                    self._write_configmap(plan, name, ref, path)
                path.mkdir(parents=True, exist_ok=True)
                sources[name] = {"kind": "bind", "source": str(path), "read_only": True}
            else:
                raise PodSetupError(
                    f"pod {plan.name}: volume {name!r} ({sorted(set(volume) - {'name'})}) is not supported"
                )
        return sources

    def _write_configmap(self, plan: PodPlan, volume: str, ref: dict[str, Any], path: Path) -> None:
        data = self.configmaps.get((plan.namespace, ref["name"]))
        if data is None:
            if not ref.get("optional"):
                raise PodSetupError(
                    f"pod {plan.name}: volume {volume!r} needs ConfigMap {plan.namespace}/{ref['name']}, "
                    "which is not in the files given"
                )
            data = {}
        items = ref.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] not in data:
                raise PodSetupError(f"pod {plan.name}: ConfigMap {ref['name']!r} has no key {item['key']!r}")
            target = path / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data[item["key"]])

    def _mounts(self, plan: PodPlan, directory: Path, files: dict[str, Path]) -> list[dict[str, Any]]:
        volumes = self._volumes(plan, directory)
        mounts: dict[str, dict[str, Any]] = {}
        for container in [*plan.spec.get("initContainers", []), *plan.spec["containers"]]:
            for vm in container.get("volumeMounts", []):
                if vm["name"] not in volumes:
                    raise PodSetupError(f"pod {plan.name}: volumeMount {vm['name']!r} names no volume of the pod")
                volume = dict(volumes[vm["name"]])
                if vm.get("subPath"):
                    if volume["kind"] != "bind":
                        raise PodSetupError(f"pod {plan.name}: subPath on a memory-backed volume is not supported")
                    source = Path(volume["source"]) / vm["subPath"]
                    if not source.exists():
                        source.mkdir(parents=True)
                    volume["source"] = str(source)
                volume["target"] = vm["mountPath"]
                volume["read_only"] = bool(volume.get("read_only") or vm.get("readOnly"))
                mounts[vm["mountPath"]] = volume
        for path in self.host_paths:
            mounts.setdefault(str(path), {"kind": "bind", "source": str(path), "target": str(path), "read_only": True})
        for target, source in files.items():
            mounts[target] = {"kind": "bind", "source": str(source), "target": target, "read_only": False}
        return list(mounts.values())

    def create(self, plan: PodPlan) -> Pod:
        """The pod record, Pending: nothing runs until `launch`."""
        if plan.name in self.pods:
            raise PodSetupError(f"pod {plan.name} exists already")
        directory = self.output_dir / "pods" / plan.name
        directory.mkdir(parents=True)
        images = [str(c.get("image", "?")) for c in plan.spec["containers"]]
        pod = Pod(plan=plan, directory=directory, started=self.clock.now(), images=images)
        self.pods[plan.name] = pod
        return pod

    def start(self, plan: PodPlan) -> Pod:
        pod = self.create(plan)
        self.launch(pod)
        return pod

    def launch(self, pod: Pod, node: str | None = None) -> None:
        """Starts the pod's processes (its podinit in new namespaces) on `node` (None: unconstrained)."""
        plan, directory = pod.plan, pod.directory
        plan.node = node
        address = self.network.allocate()
        files = {
            "/etc/hosts": directory / "hosts",
            "/etc/hostname": directory / "hostname",
            "/etc/resolv.conf": directory / "resolv.conf",
        }
        files["/etc/hostname"].write_text(plan.pod_hostname + "\n")
        ns = plan.namespace
        files["/etc/resolv.conf"].write_text(
            f"# rehearsal: names resolve from /etc/hosts only\nsearch {ns}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} "
            f"{CLUSTER_DOMAIN}\n"
        )
        files["/etc/hosts"].write_text("")
        if self.api is not None:
            self._api_env[plan.name] = self.api.pod_env(plan)
        spec = plan.spec
        try:
            init = [self._container(plan, c, address, directory) for c in spec.get("initContainers", [])]
            containers = [self._container(plan, c, address, directory) for c in spec["containers"]]
            mounts = self._mounts(plan, directory, files)
        except PodSetupError:
            pod.ended = self.clock.now()
            pod.phase = "Failed"
            raise
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pod_spec = {
            "hostname": plan.pod_hostname,
            "mounts": mounts,
            "init_containers": init,
            "containers": containers,
            "restart_policy": spec.get("restartPolicy", "Always"),
            "restart_backoff_s": self.container_backoff_s,
            "grace_s": spec.get("terminationGracePeriodSeconds", 30),
            "status_file": str(directory / "status.json"),
            "ready_fd": ready_w,
            "go_fd": go_r,
            "network": self.network.pod_config(address),
        }
        spec_file = directory / "pod.json"
        spec_file.write_text(json.dumps(pod_spec, indent=1))
        namespaces = ["--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc"]
        if self.network.isolated:
            namespaces.append("--net")
        init_log = (directory / "pod-init.log").open("ab")
        process = subprocess.Popen(
            ["unshare", *namespaces, "--", sys.executable, "-m", "rehearse.podinit", str(spec_file)],
            pass_fds=(ready_w, go_r),
            stdin=subprocess.DEVNULL,
            stdout=init_log,
            stderr=init_log,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO_ROOT)},
            cwd="/",
            # If the rehearsal itself dies, unshare gets SIGKILL and (--kill-child) so does the pod.
            preexec_fn=_die_with_parent,
        )
        init_log.close()
        os.close(ready_w)
        os.close(go_r)
        pod.address, pod.process, pod.hosts_file, pod.node = address, process, files["/etc/hosts"], node
        pod.launched, pod.phase, pod.pending_reason = self.clock.now(), "Running", ""
        try:
            ready, _, _ = select.select([ready_r], [], [], 60)
            line = os.read(ready_r, 64) if ready else b""
            if line.strip() != b"ready":
                init_output = (directory / "pod-init.log").read_text(errors="replace")[-2000:]
                raise PodSetupError(f"pod {plan.name} did not come up: {init_output}")
            self.network.attach(process.pid)
            self._restrict(pod)
            self.refresh_hosts()
            os.write(go_w, b"go\n")
        except Exception:
            process.kill()
            process.wait()
            pod.ended = self.clock.now()
            pod.phase = "Failed"
            raise
        finally:
            os.close(ready_r)
            os.close(go_w)
        self.log(f"pod {plan.name} started ({address}, image {', '.join(pod.images)})")

    def endpoint(self, pod: Pod) -> Endpoint:
        return endpoint_of(pod.plan.name, pod.plan.namespace, pod.plan.labels, pod.plan.spec, pod.address)

    def _restrict(self, new: Pod) -> None:
        """The NetworkPolicy routing rules between a pod that is starting and every running pod, both ways,
        before its containers run."""
        if not self.policies or not self.network.isolated:
            return
        assert new.process is not None
        arriving = self.endpoint(new)
        mine: list[str] = []
        for other in self.pods.values():
            if other is new or other.process is None or not other.running or other.node_lost:
                continue
            there = self.endpoint(other)
            mine += rules_toward(self.policies, arriving, there)
            policy_routes.apply(other.process.pid, rules_toward(self.policies, there, arriving))
        policy_routes.apply(new.process.pid, mine)

    # -- watching and killing ----------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def refresh(self, pod: Pod) -> None:
        pod.refresh()

    def poll(self) -> list[Pod]:
        ended = []
        for pod in self.pods.values():
            if pod.running and not pod.node_lost and pod.process is not None and pod.process.poll() is not None:
                self._finish(pod)
                ended.append(pod)
        if ended:
            self.refresh_hosts()
        return ended

    def _finish(self, pod: Pod) -> None:
        pod.ended = self.clock.now()
        pod.refresh()
        code = pod.process.returncode if pod.process is not None else 0
        # Killed (a negative returncode), or the pod's PID 1 itself failed (non-zero with no failed container).
        killed = code < 0 or (code != 0 and not pod.main_failed())
        if code > 0 and killed:
            pod.messages["pod"] = f"the pod's init process failed (exit {code}); see {pod.directory}/pod-init.log"
        finish_statuses(pod, killed=killed)

    def kill(self, pod: Pod, *, disruption: str | None = None) -> None:
        """SIGKILL the pod's namespace init: every process of the pod dies at once (node loss).

        `disruption`: the DisruptionTarget reason the pod gets (Kubernetes adds that condition to pods
        deleted for node loss, preemption or eviction; podFailurePolicy can match it)."""
        if not pod.running:
            return
        if disruption:
            pod.conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
        if pod.process is None:
            # Never started (Pending): deleted before it ran.
            pod.ended = self.clock.now()
            pod.phase = "Failed" if disruption else "Pending"
            return
        pod.process.send_signal(signal.SIGKILL)
        pod.process.wait()
        self._finish(pod)
        pod.phase = "Failed"
        self.refresh_hosts()

    def lose(self, pod: Pod) -> None:
        """The pod's node is gone: every process of the pod dies now; the pod itself stays (Running in the
        API, out of the Services' endpoints) until its eviction deletes it (`kill`)."""
        if pod.process is None or pod.node_lost or not pod.running:
            return
        pod.process.send_signal(signal.SIGKILL)
        pod.process.wait()
        pod.node_lost = True
        self.refresh_hosts()

    def close(self) -> None:
        for pod in self.pods.values():
            if pod.running:
                pod.deleted_by_controller = True
                self.kill(pod)

    def dashboard_get(self, head: Pod, path: str) -> dict[str, Any] | None:
        """GET the Ray head's dashboard API from inside the head pod's network namespace."""
        if head.process is None or not head.running:
            return None
        if self.policies and not self.policies.reaches(KUBERAY_OPERATOR, self.endpoint(head), RAY_DASHBOARD_PORT):
            raise PolicyDeniedError(
                f"NetworkPolicy: no policy of namespace {head.plan.namespace} admits the KubeRay operator "
                f"({KUBERAY.name}, labels {dict(KUBERAY_OPERATOR_PODS)}) to the Ray head {head.name} on TCP "
                f"{RAY_DASHBOARD_PORT}: KubeRay reads job status and node health from the dashboard, so the cluster "
                "would never be ready and the RayJob never start; fix: admit it (infra/spec/network_policies.py "
                "ray_workload)"
            )
        url = f"http://{'127.0.0.1' if self.network.isolated else head.address}:{RAY_DASHBOARD_PORT}/{path}"
        code = (
            f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
        )
        argv = [sys.executable, "-c", code]
        if self.network.isolated:
            argv = ["nsenter", f"--net=/proc/{head.process.pid}/ns/net", *argv]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        except subprocess.TimeoutExpired:
            return None
        if result.returncode != 0:
            return None
        try:
            data: dict[str, Any] = json.loads(result.stdout)
        except json.JSONDecodeError:
            return None
        return data


def finish_statuses(pod: Pod, *, killed: bool) -> None:
    """Exit codes and reasons of an ended pod's containers, and its phase, as the kubelet reports them.

    A container that was running when the pod was killed: 137 (SIGKILL), reason Error. One that never
    started (its init containers had not finished): no exit code, waiting reason PodInitializing. The
    phase is Failed when a main or regular init container failed; sidecars never count."""
    spec = pod.plan.spec
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        name = c["name"]
        if name in pod.exit_codes and pod.exit_codes[name] is None:
            pod.exit_codes[name] = 137 if killed else None
            if killed:
                pod.reasons[name] = "Error"
        elif name not in pod.exit_codes:
            pod.exit_codes[name] = None
            pod.reasons[name] = "PodInitializing"
    pod.phase = "Failed" if killed or pod.main_failed() else "Succeeded"


def _die_with_parent() -> None:
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _tmpfs_size(quantity: str) -> str:
    """A Kubernetes quantity (Gi, Mi, G, M, plain bytes) as a tmpfs size= option."""
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "Ti": "t", "k": "k", "M": "m", "G": "g", "T": "t"}
    for suffix, tmpfs in units.items():
        if quantity.endswith(suffix) and quantity[: -len(suffix)].isdigit():
            return f"{quantity[: -len(suffix)]}{tmpfs}"
    if quantity.isdigit():
        return quantity
    raise PodSetupError(f"sizeLimit {quantity!r} is not a quantity the rehearsal understands")


def accelerator_requests(spec: Mapping[str, Any]) -> dict[str, str]:
    """GPU and EFA limits of a pod's containers: reported, not satisfied."""
    found: dict[str, str] = {}
    for container in spec.get("containers", []):
        limits = container.get("resources", {}).get("limits", {})
        for key in ACCELERATORS:
            if key in limits:
                found[key] = str(limits[key])
    return found
