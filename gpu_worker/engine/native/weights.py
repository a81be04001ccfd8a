"""A checkpoint's safetensors read straight into a native network, on its device and dtype.

The network is built on the meta device (no memory), given uninitialised storage on the target
device in the target dtype, and each checkpoint tensor is read from its shard (memory-mapped)
onto that device and copied into its place: an 8B model in bf16 needs about 16 GB of GPU memory
and no fp32 copy in host memory. Every tensor of the network must come from the checkpoint and
every tensor of the checkpoint must have a place, or the load stops with a one-line
:class:`CheckpointError` that names the file and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gpu_worker.engine.checkpoint import CheckpointError

GIB = 1 << 30


@dataclass(frozen=True)
class Target:
    """Where a checkpoint tensor goes: a parameter of the network, or some of its rows (q, k
    and v share one matrix; so do the feed-forward's gate and up)."""

    param: str
    rows: slice | None = None


def check_fits(needed: int, free: int, total: int, *, where: str) -> None:
    """Refuse a model that needs more than ``free`` bytes of device memory, before loading."""
    if needed > free:
        raise CheckpointError(
            f"the model needs about {needed / GIB:.1f} GiB of memory on {where} and "
            f"{free / GIB:.1f} of {total / GIB:.1f} GiB are free: load it in bf16 "
            "(STENCIL_MODEL_DTYPE=bf16), free the device, or use a larger one"
        )


def materialise(
    build: Callable[[], nn.Module], *, device: torch.device, dtype: torch.dtype, n_params: int
) -> nn.Module:
    """The network ``build`` makes, on ``device`` in ``dtype``, its storage uninitialised
    (every tensor is then written by :func:`load_into`)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        check_fits(n_params * dtype.itemsize, free, total, where=str(device))
    with torch.device("meta"):
        network = build()
    return network.to(dtype=dtype).to_empty(device=device)


def load_into(
    network: nn.Module,
    files: list[Path],
    mapping: Mapping[str, Target],
    *,
    ignore: Callable[[str], bool] = lambda _name: False,
) -> None:
    """Copy every checkpoint tensor into its :class:`Target` of ``network`` (cast to the
    network's dtype on its device); check that each parameter was written whole."""
    from safetensors import safe_open

    params = dict(network.named_parameters())
    device = next(iter(params.values())).device
    written = {name: 0 for name in params}
    seen: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            for key in handle.keys():  # noqa: SIM118  (a safetensors handle, not a dict)
                if key in seen:
                    raise CheckpointError(f"{path.name} holds {key} a second time: the shards overlap")
                seen.add(key)
                target = mapping.get(key)
                if target is None:
                    if ignore(key):
                        continue
                    raise CheckpointError(
                        f"{path.name} holds {key}, which this config.json's network does not "
                        "have: config.json does not describe these weights (use the "
                        "checkpoint's own config.json)"
                    )
                _copy(handle.get_tensor(key), params[target.param], target, key, path)
                rows = params[target.param].shape[0] if target.rows is None else (
                    target.rows.stop - target.rows.start)  # fmt: skip
                written[target.param] += rows
    for name, param in params.items():
        if written[name] != param.shape[0]:
            wanted = sorted(k for k, t in mapping.items() if t.param == name and k not in seen)
            raise CheckpointError(
                f"the checkpoint in {files[0].parent} lacks {wanted[0] if wanted else name}: "
                "download the checkpoint again (every shard), with its own config.json"
            )


def _copy(tensor: torch.Tensor, param: torch.Tensor, target: Target, key: str, path: Path) -> None:
    destination = param if target.rows is None else param[target.rows]
    if tuple(tensor.shape) != tuple(destination.shape):
        raise CheckpointError(
            f"{path.name}: {key} has shape {tuple(tensor.shape)} where config.json implies "
            f"{tuple(destination.shape)}: use the checkpoint's own config.json"
        )
    with torch.no_grad():
        destination.copy_(tensor)


__all__ = ["Target", "check_fits", "load_into", "materialise"]
