"""Where a layer's tensors live while it is quantised: accelerate's offloaded layers brought onto their execution
device, the scratch memory a batch of experts may use, device moves of nested inputs."""
from __future__ import annotations

import torch


def sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


def budget_bytes(dev) -> int:
    """Scratch memory one batch of experts may use: a quarter of the free GPU memory, at most 16 GiB (a
    layer's experts at once on an H200, a few at a time on a small card); 2 GiB on the host."""
    dev = torch.device(dev)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(min(free // 4, 16 << 30))
    return 2 << 30


def expert_chunk(per_expert_bytes: int, dev) -> int:
    return max(1, budget_bytes(dev) // max(1, per_expert_bytes))


def onload(layer) -> None:
    """Put an accelerate-offloaded layer (device_map with "cpu"/"disk": weights on the meta device, fetched
    by a hook for each forward) on its execution device for good. Packing reads the weights outside any
    forward, and what stays on the GPU is the int4 layer, ~3.5x smaller than the bf16 one offloading kept
    on the host. Layers accelerate placed on a GPU are left as they are."""
    from accelerate.hooks import AlignDevicesHook, SequentialHook, remove_hook_from_module
    from accelerate.utils import set_module_tensor_to_device
    for mod in list(layer.modules()):
        hook = getattr(mod, "_hf_hook", None)
        hooks = hook.hooks if isinstance(hook, SequentialHook) else [hook]
        off = [h for h in hooks if isinstance(h, AlignDevicesHook) and h.offload]
        if not off:
            continue
        h = off[0]
        names = [n for n, _ in mod.named_parameters(recurse=False)]
        if h.offload_buffers:
            names += [n for n, _ in mod.named_buffers(recurse=False)]
        # The hook goes first: detaching it puts each tensor back on the device it had before dispatch
        # (the host, where transformers loads "cpu" entries), which would undo the placement below.
        remove_hook_from_module(mod)
        for n in names:
            set_module_tensor_to_device(mod, n, h.execution_device, value=h.weights_map[n])


def layer_device(layer):
    return next(layer.parameters(), next(layer.buffers(), torch.empty(0))).device


def to_device(obj, dev):
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(o, dev) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, dev) for k, v in obj.items()}
    return obj
