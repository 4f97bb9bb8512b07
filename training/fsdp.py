"""Loading a Hugging Face causal LM and sharding it with FSDP2: shared by the Ray Train fine-tune
and the NVRx job (this module imports neither Ray nor NVRx)."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM, PreTrainedModel


def load_model(name_or_path: str) -> PreTrainedModel:
    """float32 master weights on the CPU; FSDP moves the shards to the device."""
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch.float32)
    model.config.use_cache = False
    return model


def shard_model(model: PreTrainedModel, *, device_type: str, compute_dtype: torch.dtype, world_size: int) -> None:
    """FSDP2: each decoder layer is its own unit, the root unit holds the rest (embeddings, norm, head).

    fully_shard also moves the shards from CPU to the mesh's device. Gradients are reduced in float32.
    """
    mesh = init_device_mesh(device_type, (world_size,))
    mp_policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    layer_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"found no decoder layers ({sorted(layer_classes)}) to shard in {type(model).__name__}")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy)
