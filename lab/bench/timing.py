"""The one timer of the bench, the read floor and the launch-plan sweep: CUDA-graph replay over weight copies
rotated past L2.

Method (what one `us` means):
  * the caller builds `copies` calls, each on its own copy of the weights, with copies x bytes > 4 x L2
    (`copies_for`; L2 is 60 MB on the H200): every call reads its weights from HBM, as in a real decode step
    where each layer's weights were last touched a whole forward pass ago;
  * one CUDA graph makes every call once, in sequence; one sample is the CUDA-event time of enough replays
    back to back to make at least `MIN_CALLS` calls, divided by the calls made; `us` is the median over
    `replays` samples after `warmup` replays, `p10_us`/`p90_us` the spread (`summarise`). Why several replays
    per sample: the start event fires at once on an idle stream, then the GPU waits for the host to launch
    the graph; with one replay of a graph of 1-2 big calls that host latency lands on every call (rows over
    60 MB have 1-2 copies). Back to back, the next replay is launched while the GPU runs the previous one;
  * before each sample's start event the stream runs a one-thread busy-wait of `PREFILL_CYCLES` GPU cycles
    (`torch.cuda._sleep`, ~0.2 ms), so the host has queued the start event and the first replay before the
    GPU reaches them (the "blocking kernel" of NVIDIA's nvbench): a host stall in that window (a thread
    switch, the GIL) no longer lands inside the sample. A sample whose start event had already fired when
    its first replay was queued is counted in `late` (`summarise`); the bench records it per row;
  * before the first sample the graph replays for at least `WARMUP_MS` of GPU time. Why: after the host has
    been busy (preparing a row's weights, its reference, the graph capture) the H200 streams bytes 8-13 %
    slower for its first ~10 ms of load, then steps up and stays up (raw samples recorded at commit
    ce284a7); with only a few warm-up replays that
    step fell inside a row's 20 samples, and the median of a big row could land on either side of it.
"""
from __future__ import annotations

import math
import statistics

import torch


def l2_bytes() -> int:
    """The device's L2 size in bytes (60 MB on the H200 if the property is missing)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 60 * 2**20)


def copies_for(bytes_per_call: int, l2: int, factor: int = 4, cap: int = 1024) -> int:
    """How many weight copies make one rotation touch more than `factor` x L2 (at least 1, at most `cap`)."""
    if bytes_per_call <= 0:
        raise ValueError(f"bytes_per_call must be positive, got {bytes_per_call}")
    return max(1, min(cap, factor * l2 // bytes_per_call + 1))


MIN_CALLS = 16          # calls per timed sample (module doc)
PREFILL_CYCLES = 400_000        # GPU busy-wait before a sample: ~0.2 ms at the H200's 1.98 GHz (module doc)
WARMUP_MS = 50.0                # replays before the first sample: 4x the longest slow start seen (module doc)


class Samples(list):
    """Per-call us of each sample, plus `late`: samples whose start event fired before their first replay
    was queued (the host fell behind the prefill, so a launch gap may be inside the sample)."""
    late: int = 0


def time_calls(calls, replays: int = 20, warmup: int = 3, min_calls: int = MIN_CALLS,
               prefill_cycles: int = PREFILL_CYCLES, warmup_ms: float = WARMUP_MS) -> Samples:
    """Capture one CUDA graph making every call in `calls` once, in order; return per-call us of each sample
    (ceil(min_calls / len(calls)) replays back to back, after a prefill of `prefill_cycles`; 0 = none).
    Before the samples: `warmup` replays, then replays for at least `warmup_ms` of GPU time."""
    if not calls:
        raise ValueError("calls must hold at least one callable")
    if not isinstance(min_calls, int) or isinstance(min_calls, bool) or min_calls < 1:
        raise ValueError(f"min_calls must be a positive int, got {min_calls!r}")
    if not isinstance(prefill_cycles, int) or isinstance(prefill_cycles, bool) or prefill_cycles < 0:
        raise ValueError(f"prefill_cycles must be an int >= 0, got {prefill_cycles!r}")
    if not isinstance(warmup_ms, (int, float)) or isinstance(warmup_ms, bool) or not 0 <= warmup_ms < 1e4:
        raise ValueError(f"warmup_ms must be a number in [0, 1e4), got {warmup_ms!r}")
    per = -(-min_calls // len(calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):          # eager warm-up (and compilation) on a side stream, as capture requires
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if warmup_ms:
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        for _ in range(math.ceil(warmup_ms / max(start.elapsed_time(end), 1e-3))):
            graph.replay()          # queued without a sync: the first sample follows on a GPU that never paused
    out = Samples()
    for _ in range(replays):
        if prefill_cycles:
            torch.cuda._sleep(prefill_cycles)
        start.record()
        graph.replay()
        out.late += bool(prefill_cycles) and start.query()      # the GPU got here before the host did
        for _ in range(per - 1):
            graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / (per * len(calls)))
    del graph
    return out


def summarise(samples: list[float]) -> dict:
    """Median and 10th / 90th percentiles of per-call microseconds (and `late`, when the samples carry it)."""
    q = statistics.quantiles(samples, n=10)
    out = {"us": statistics.median(samples), "p10_us": q[0], "p90_us": q[-1], "replays": len(samples)}
    if isinstance(samples, Samples):
        out["late"] = samples.late
    return out


def copy_bandwidth(nbytes: int = 2 * 2**30, replays: int = 20) -> dict:
    """Device-to-device copy of `nbytes`: GBps counts bytes read + written. A device fact recorded beside the
    rows, not a floor (a copy writes what it reads; a GEMV almost only reads)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    s = summarise(time_calls([lambda: dst.copy_(src)], replays=replays))
    del src, dst
    return {"bytes": 2 * nbytes, **s, "GBps": 2 * nbytes / (s["us"] * 1e3)}
