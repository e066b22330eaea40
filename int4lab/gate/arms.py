"""The gate's arms and how many of them are held at once.

An arm is a quantised copy of the source: round-to-nearest (`rtn/...`), a dithered round-to-nearest re-pack
(`rtn/... lottery#s`, a lottery ticket) or a GPTQ pack from calibration draw s (`gptq/... draw#s`).

Arms are scored in groups: a group's arms are built (a copy of the source, quantised), scored together with
the source on every window, then freed. The source runs once per group, so the memory held is the source
plus one group of int4 models plus the activations, whatever the arm count. `GroupSizer` closes a group
when the device's free memory would not hold the build of one more arm and the scoring after it, or at a
fixed size.
"""
from __future__ import annotations

import copy
import gc
from dataclasses import dataclass

import torch

from ..quantize import Scheme

DITHER = 0.1               # the lottery's dither amplitude, in units of the block scale
LOTTERY = 16              # tickets per round-to-nearest arm: the calibration test's minimum (stats.MIN_TICKETS)
SCORE_RESERVE = 1 << 30    # bytes kept free for scoring besides the logits (forward activations, chunks)


@dataclass(frozen=True)
class Arm:
    scheme: Scheme
    dither: float = 0.0     # > 0: a lottery ticket (dithered round-to-nearest)
    seed: int = 0           # the dither's seed, or the calibration draw's

    @property
    def kind(self) -> str:
        return "gptq" if self.scheme.scheme == "gptq" else "lottery" if self.dither else "rtn"

    @property
    def name(self) -> str:
        return self.scheme.name + {"gptq": f" draw#{self.seed}", "lottery": f" lottery#{self.seed}",
                                   "rtn": ""}[self.kind]

    @property
    def twin(self) -> str:
        """The round-to-nearest arm this one is compared with (itself for round-to-nearest)."""
        return Scheme("rtn", self.scheme.targets, self.scheme.act).name


def plan_arms(schemes=("rtn",), targets=("experts",), acts=("int8",), lottery: int = LOTTERY,
              calib_draws: int = 3, dither: float = DITHER) -> list[Arm]:
    """For each (targets, act): round-to-nearest, `lottery` dithered re-packs, and `calib_draws` GPTQ packs
    when "gptq" is among schemes (each calibrated on its own draw of the train split)."""
    for name, v, lo in (("lottery", lottery, 0), ("calib_draws", calib_draws, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    out = []
    for tg in targets:
        for a in acts:
            out.append(Arm(Scheme("rtn", tg, a)))
            out += [Arm(Scheme("rtn", tg, a), dither, s) for s in range(1, lottery + 1)]
            if "gptq" in schemes:
                out += [Arm(Scheme("gptq", tg, a), 0.0, s) for s in range(calib_draws)]
    return out


def copy_source(src):
    """A copy of the source to quantise: on its own device(s), no reload from disk. A model dispatched by
    accelerate (device_map offload) cannot be deep-copied safely: callers load those from disk instead."""
    return copy.deepcopy(src)


def model_bytes(model) -> dict:
    """{device type: bytes} of a model's parameters and buffers (each storage once), e.g. {"cuda": ..., "cpu": ...};
    weights accelerate keeps off the device ("meta") count under "meta"."""
    out, seen = {}, set()
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.device, t.untyped_storage().data_ptr()) if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        out[t.device.type] = out.get(t.device.type, 0) + t.numel() * t.element_size()
    return out


def cuda_free_bytes(dev=None) -> int:
    """Free bytes on the CUDA device: what the driver reports plus what torch's allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(dev)
    return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def logits_bytes(batch_tokens: int, vocab: int, itemsize: int) -> int:
    """Scoring's largest tensors: the source's and one arm's logits of a forward, [tokens, V] each."""
    return 2 * batch_tokens * vocab * itemsize


class CudaPeak:
    """The peak of allocated GPU bytes over a whole run, though phases inside it reset torch's peak counter
    to measure their own: `reset` folds the counter into the running maximum first."""

    def __init__(self, dev):
        self.dev = torch.device(dev) if torch.device(dev).type == "cuda" and torch.cuda.is_available() else None
        self.peak = torch.cuda.max_memory_allocated(self.dev) if self.dev else 0

    def reset(self) -> int:
        """Reset torch's peak counter; returns the bytes allocated now (0 without CUDA)."""
        if not self.dev:
            return 0
        self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.dev))
        torch.cuda.reset_peak_memory_stats(self.dev)
        return torch.cuda.memory_allocated(self.dev)

    def since(self, base: int) -> int:
        """Peak bytes above base since the last reset."""
        return torch.cuda.max_memory_allocated(self.dev) - base if self.dev else 0

    def total(self) -> int | None:
        return max(self.peak, torch.cuda.max_memory_allocated(self.dev)) if self.dev else None


class GroupSizer:
    """When to stop building arms and score the group held so far.

    fixed: at most `fixed` arms per group (an int), or None for automatic: on CUDA a group closes when the
    free memory would not hold the peak of the last arm's build (a source copy and its quantisation scratch,
    measured) plus the scoring reserve (`logits_bytes` + SCORE_RESERVE, or the peak the last group's scoring
    measured, whichever is larger); on a CPU (no device memory to watch) every arm joins one group.
    """

    def __init__(self, fixed: int | None, device, score_estimate: int):
        if fixed is not None and (not isinstance(fixed, int) or isinstance(fixed, bool) or fixed < 1):
            raise ValueError(f"arms_per_group must be a positive int or None (automatic), got {fixed!r}")
        self.fixed = fixed
        self.cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
        self.dev = torch.device(device) if self.cuda else None
        self.peaks = CudaPeak(device)
        self.score_need = score_estimate + SCORE_RESERVE
        self.build_peak = 0
        self._base = 0

    @property
    def rule(self) -> str:
        if self.fixed:
            return f"at most {self.fixed} arms per group (fixed)"
        if self.cuda:
            return ("automatic: a group closes when the free GPU memory is under the last arm's build peak "
                    "plus the scoring reserve")
        return "automatic on a CPU: every arm in one group"

    def start_build(self) -> None:
        if self.cuda:
            free_memory()
            self._base = self.peaks.reset()

    def end_build(self) -> dict:
        """After an arm is built: its bytes on the GPU and its build's peak (None on a CPU)."""
        if not self.cuda:
            return {}
        free_memory()
        peak = self.peaks.since(self._base)
        self.build_peak = max(self.build_peak, peak)
        return {"gpu_bytes": torch.cuda.memory_allocated(self.dev) - self._base, "gpu_build_peak_bytes": peak}

    def scored(self, peak_bytes: int) -> None:
        """Record the scoring peak a group measured (bytes above what was allocated before it)."""
        self.score_need = max(self.score_need, int(peak_bytes) + SCORE_RESERVE // 4)

    def full(self, held: int) -> tuple[bool, str]:
        """(close the group now?, why) with `held` arms built and not yet scored."""
        if self.fixed:
            return held >= self.fixed, f"{held} arms (fixed size {self.fixed})"
        if not self.cuda:
            return False, "CPU: one group"
        free = cuda_free_bytes(self.dev)
        need = self.build_peak + self.score_need
        return free < need, (f"free {free / 2 ** 30:.1f} GiB against build peak {self.build_peak / 2 ** 30:.1f} "
                             f"+ scoring {self.score_need / 2 ** 30:.1f} GiB")
