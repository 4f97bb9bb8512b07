"""Instance-type facts: the one place that knows what each EC2 type has.

Values come from the EC2 documentation:
- "Accelerated computing instance specifications" (GPUs, GPU memory, vCPU, memory,
  instance storage, network cards, EFA): docs.aws.amazon.com/ec2/latest/instancetypes/ac.html
- "General purpose instance specifications": docs.aws.amazon.com/ec2/latest/instancetypes/gp.html
- "Maximum IP addresses per network interface" (ENIs, IPv4 per ENI):
  docs.aws.amazon.com/AWSEC2/latest/UserGuide/AvailableIpPerENI.html
- EFA-only interfaces and their instance support: docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html

Everything downstream (interface layouts, pod requests, address budgets,
validation) derives from these records; nobody re-types a number kept here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from infra.spec.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    model: str
    count: int
    memory_gib_each: int
    # Dense bf16 tensor-core peak of one GPU, TFLOPS (NVIDIA's datasheets list it "with sparsity", twice this): the
    # fastest a training step can run (infra/spec/checkpoint_throughput.py step_floor_s).
    bf16_dense_tflops: float

    @property
    def total_memory_gib(self) -> int:
        return self.count * self.memory_gib_each


@dataclass(frozen=True, kw_only=True)
class EfaSpec:
    max_interfaces: int
    # EFA-only interfaces carry no IP address (they need vpc-cni >= 1.18.5).
    efa_only_supported: bool
    gpudirect_rdma: bool


@dataclass(frozen=True, kw_only=True)
class NvmeSpec:
    disks: int
    size_gb_each: int


@dataclass(frozen=True, kw_only=True)
class InstanceType:
    name: str
    vcpus: int
    memory_gib: int
    network_cards: int
    max_network_interfaces: int
    # Interfaces of the default network card (card 0): what nodeadm's max-pods formula counts
    # (amazon-eks-ami nodeadm/internal/kubelet/instance-info.jsonl "defaultMaxENIs", from EC2
    # DescribeInstanceTypes NetworkInfo.NetworkCards[DefaultNetworkCardIndex].MaximumNetworkInterfaces).
    default_card_interfaces: int
    ipv4_per_interface: int
    network_bandwidth_gbps: int
    gpu: GpuSpec | None = None
    efa: EfaSpec | None = None
    nvme: NvmeSpec | None = None

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]


_TYPES = (
    # gp.html, M7i row; AvailableIpPerENI: 4 interfaces x 15 addresses.
    InstanceType(
        name="m7i.xlarge",
        vcpus=4,
        memory_gib=16,
        network_cards=1,
        max_network_interfaces=4,
        default_card_interfaces=4,
        ipv4_per_interface=15,
        network_bandwidth_gbps=12,  # "up to 12.5"; the burst figure, not a floor
    ),
    # ac.html, G6 row (4 L4 24 GB, 40 Gbps, 4 x 940 GB NVMe, EFA on the 12xlarge and up);
    # AvailableIpPerENI: 8 x 30.
    InstanceType(
        name="g6.12xlarge",
        vcpus=48,
        memory_gib=192,
        network_cards=1,
        max_network_interfaces=8,
        default_card_interfaces=8,
        ipv4_per_interface=30,
        network_bandwidth_gbps=40,
        gpu=GpuSpec(
            # NVIDIA L4 datasheet: BF16 Tensor Core 242 TFLOPS with sparsity.
            model="NVIDIA L4",
            count=4,
            memory_gib_each=24,
            bf16_dense_tflops=121,
        ),
        # g6 has EFA (network RDMA) but no GPUDirect RDMA.
        efa=EfaSpec(max_interfaces=1, efa_only_supported=False, gpudirect_rdma=False),
        nvme=NvmeSpec(disks=4, size_gb_each=940),
    ),
    # ac.html, P4d row (8 A100 40 GB, 4 network cards, 400 Gbps EFA, 8 x 1000 GB NVMe);
    # AvailableIpPerENI: 60 x 50.
    InstanceType(
        name="p4d.24xlarge",
        vcpus=96,
        memory_gib=1152,
        network_cards=4,
        max_network_interfaces=60,
        default_card_interfaces=15,
        ipv4_per_interface=50,
        network_bandwidth_gbps=400,
        gpu=GpuSpec(
            # NVIDIA A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity).
            model="NVIDIA A100",
            count=8,
            memory_gib_each=40,
            bf16_dense_tflops=312,
        ),
        # Four EFA (ENA + EFA) interfaces, one per card: the classic p4d layout.
        efa=EfaSpec(max_interfaces=4, efa_only_supported=False, gpudirect_rdma=True),
        nvme=NvmeSpec(disks=8, size_gb_each=1000),
    ),
    # ac.html, P5 row (8 H100 80 GB, 32 network cards, 3200 Gbps EFA, 8 x 3.84 TB NVMe);
    # efa.html lists P5 for EFA-only interfaces; AvailableIpPerENI: 64 x 50.
    InstanceType(
        name="p5.48xlarge",
        vcpus=192,
        memory_gib=2048,
        network_cards=32,
        max_network_interfaces=64,
        default_card_interfaces=2,
        ipv4_per_interface=50,
        network_bandwidth_gbps=3200,
        gpu=GpuSpec(
            # NVIDIA H100 datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity.
            model="NVIDIA H100",
            count=8,
            memory_gib_each=80,
            bf16_dense_tflops=989.5,
        ),
        efa=EfaSpec(max_interfaces=32, efa_only_supported=True, gpudirect_rdma=True),
        nvme=NvmeSpec(disks=8, size_gb_each=3800),
    ),
    # ac.html, P5e row (8 H200 141 GB, otherwise as P5); AvailableIpPerENI: 64 x 50.
    InstanceType(
        name="p5e.48xlarge",
        vcpus=192,
        memory_gib=2048,
        network_cards=32,
        max_network_interfaces=64,
        default_card_interfaces=2,
        ipv4_per_interface=50,
        network_bandwidth_gbps=3200,
        gpu=GpuSpec(
            # NVIDIA H200 datasheet, SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity (the H100's compute).
            model="NVIDIA H200",
            count=8,
            memory_gib_each=141,
            bf16_dense_tflops=989.5,
        ),
        efa=EfaSpec(max_interfaces=32, efa_only_supported=True, gpudirect_rdma=True),
        nvme=NvmeSpec(disks=8, size_gb_each=3800),
    ),
)

INSTANCE_TYPES: MappingProxyType[str, InstanceType] = MappingProxyType({t.name: t for t in _TYPES})


def instance_type(name: str, *, field: str = "instance_type") -> InstanceType:
    """Look an instance type up; an unknown name is a ConfigError naming the known ones."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise ConfigError(
            field,
            name,
            INSTANCE_TYPES,
            "add its facts to infra/spec/instances.py (with the AWS source) or pick a listed type",
        ) from None
