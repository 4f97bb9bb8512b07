"""The Pod Security Standards Baseline level (Kubernetes 1.36) as facts, for the admission policy that holds the
workload namespaces to Baseline plus the one capability their pods need (k8s/charts/pod_security.py).

Why a policy and not a Pod Security level: the EFA pods add IPC_LOCK (libfabric pins the buffers it registers with
the device; k8s/ray_spec.py), which Baseline forbids. Pod Security Admission takes one level per namespace and has
no per-capability exception; its exemptions are API server configuration, which EKS does not expose; and a
ValidatingAdmissionPolicy can only deny, never admit what Pod Security Admission denies. So `ray` and `training`
enforce Privileged (infra/spec/namespaces.py), and a ValidatingAdmissionPolicy re-imposes every Baseline check on
their pods, with the namespace's capabilities added to Baseline's list and nothing else relaxed.

Source: kubernetes/pod-security-admission v0.36.2 (the library the 1.36 API server runs), policy/check_*.go, each
check's newest version at or below 1.36, and the "Pod Security Standards" page of the Kubernetes 1.36 docs
(concepts/security/pod-security-standards, the Baseline table). Every Baseline check there is in BASELINE_CHECKS;
visitContainers (policy/visitor.go) applies a container check to containers, initContainers and
ephemeralContainers alike.
"""

from __future__ import annotations

from types import MappingProxyType

# The Kubernetes minor whose checks these are; a new minor can add a check or widen a list (tests/k8s/
# test_pod_security.py fails until this module is read against its pod-security-admission tag).
CHECKED_FOR = "1.36"
PSA_SOURCE = "kubernetes/pod-security-admission v0.36.2"

# The Baseline checks (policy/registry.go registers them with Level: api.LevelBaseline), by their check ID, with
# the file that defines each. The policy's validations cover each one by ID (k8s/charts/pod_security.py).
BASELINE_CHECKS: MappingProxyType[str, str] = MappingProxyType(
    {
        "windowsHostProcess": "policy/check_windowsHostProcess.go",
        "hostNamespaces": "policy/check_hostNamespaces.go",
        "privileged": "policy/check_privileged.go",
        "capabilities_baseline": "policy/check_capabilities_baseline.go",
        "hostPathVolumes": "policy/check_hostPathVolumes.go",
        "hostPorts": "policy/check_hostPorts.go",
        "appArmorProfile": "policy/check_appArmorProfile.go",
        "seLinuxOptions": "policy/check_seLinuxOptions.go",
        "procMount": "policy/check_procMount_baseline.go",
        "seccompProfile_baseline": "policy/check_seccompProfile_baseline.go",
        "sysctls": "policy/check_sysctls.go",
        "hostProbesAndHostLifecycle": "policy/check_hostProbesAndhostLifecycle.go",
    }
)

# check_capabilities_baseline.go capabilities_allowed_1_0: what capabilities.add may hold (NET_RAW is not here:
# "Adding NET_RAW or capabilities beyond the default set must be disallowed").
BASELINE_CAPABILITIES = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)

# check_sysctls.go sysctlsAllowedV1Dot32 (1.0's five, 1.27's ip_local_reserved_ports, 1.29's keepalive and
# fin_timeout, 1.32's tcp_rmem and tcp_wmem): spec.securityContext.sysctls[*].name.
SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
)

# check_seLinuxOptions.go selinuxAllowedTypes1_31 (type; user and role must be empty).
SELINUX_TYPES = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")

# check_seccompProfile_baseline.go validSeccomp (1.19+: the fields; the alpha annotations are no longer read).
SECCOMP_TYPES = ("RuntimeDefault", "Localhost")

# check_appArmorProfile.go allowedProfileType, and the deprecated per-container annotations' allowed values
# (allowedAnnotationValue: empty, runtime/default, or a localhost/ profile).
APPARMOR_TYPES = ("RuntimeDefault", "Localhost")
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
APPARMOR_ANNOTATION_VALUES = ("", "runtime/default")
APPARMOR_LOCALHOST_PREFIX = "localhost/"

# check_procMount_baseline.go: procMount unset or Default, any value when the pod has its own user namespace
# (procMount1_35baseline: spec.hostUsers false).
PROC_MOUNT_DEFAULT = "Default"

# check_hostProbesAndhostLifecycle.go (1.34+): `host` must be unset or empty in each probe's and lifecycle
# handler's httpGet and tcpSocket.
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
LIFECYCLE_HANDLERS = ("postStart", "preStop")
HOST_HANDLERS = ("httpGet", "tcpSocket")

# The capability the EFA pods add (k8s/job_parts.py, k8s/ray_spec.py), the one exception the workload namespaces
# take to Baseline.
IPC_LOCK = "IPC_LOCK"
