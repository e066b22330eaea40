"""One greedy decode step with a static KV cache: eager, captured in one CUDA graph, or with compiled layers.

Shape legend: B = batch (sequences), C = context (KV positions the static cache holds), P = prompt length.

    Stepper(model, B, C)        the step's static state: input ids [B, 1], the position, StaticCache(C), a mask
    stepper.step()              one token for every sequence: forward, argmax, position + 1 (capture-legal:
                                nothing is read back, every tensor it touches keeps its address)
    stepper.prefill(ids)        eager prefill of a prompt [B, P] through the same cache
    time_eager(stepper)         host wall time per step, the host launching every op (over a static cache, where
                                `generate` compiles the decode forward unless `disable_compile` is set, so not its
                                default mode; `generate`'s own per-step work is not included)
    time_graphed(stepper)       the step captured once in a CUDA graph and replayed: CUDA-event time per step
    compiled_layers(model)      every decoder layer torch.compile'd (inductor), each compiled on its first call
                                (dynamo takes a module's integer attributes as static, and each layer's attention
                                passes its own layer_idx to the cache, so layers need not share a compile; the
                                number of compiles is not recorded)
    greedy(model, prompt, n)    n greedy tokens after a prefill, eager or replayed from one graph

Positions: the cache holds C positions; transformers' attention over a static cache reads the whole buffer (the
mask hides the unwritten part), so what its step reads does not depend on where it writes, while int4_fused2's
attention launch reads only the slots up to the position. Timed steps write within C - HEADROOM .. C - 1 (where in
that window depends on the warm-up and replay counts); the position is reset before each sample.
The mask is built inside the step from the position tensor (a [B, 1, 1, C] boolean, passed as the model's 4-D
attention mask, which transformers uses as it is): no host read-back, so the step can be captured.
"""
from __future__ import annotations

import contextlib
import inspect
import statistics
import time

import torch

HEADROOM = 32           # positions a timing run may write before its position is reset
PREFILL_CYCLES = 400_000    # GPU busy-wait before a timed sample (lab.bench.timing's reason: the host queues ahead)


def _sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


class Stepper:
    """The static state of a greedy decode step of `model` for `batch` sequences and a cache of `context`.
    The `batch` rows are identical: each starts from token 0 over the same cache, so every row routes to the
    same experts as batch 1; a larger batch grows the KV cache and the rows the kernels take, not the experts read."""

    def __init__(self, model, batch: int, context: int, forward=None):
        from transformers import StaticCache
        if context <= HEADROOM:
            raise ValueError(f"context must exceed HEADROOM = {HEADROOM}, got {context}")
        self.model, self.batch, self.context = model, batch, context
        self.forward = forward or model
        dev = model.get_input_embeddings().weight.device
        self.device = dev
        self.cache = StaticCache(config=model.config, max_cache_len=context)
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros((), dtype=torch.long, device=dev)
        self.slots = torch.arange(context, device=dev)
        # transformers before the cache kept its own position took it as the forward's cache_position
        self.pass_cache_position = "cache_position" in inspect.signature(model.model.forward).parameters

    def reset(self, pos: int) -> None:
        """The next step writes position `pos` (of every sequence)."""
        self.pos.fill_(pos)
        for layer in getattr(self.cache, "layers", ()):
            cl = getattr(layer, "cumulative_length", None)
            if isinstance(cl, torch.Tensor):
                cl.fill_(pos)

    def step(self) -> torch.Tensor:
        B, C = self.batch, self.context
        mask = (self.slots <= self.pos).view(1, 1, 1, C).expand(B, 1, 1, C)
        kw = {"cache_position": self.pos.view(1)} if self.pass_cache_position else {}
        out = self.forward(input_ids=self.tok, position_ids=self.pos.view(1, 1).expand(B, 1), attention_mask=mask,
                           past_key_values=self.cache, use_cache=True, **kw)
        self.tok.copy_(out.logits[:, -1:].argmax(-1))
        self.pos.add_(1)
        return self.tok

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Eager prefill of ids [B, P] (P < context) from position 0; the next step writes position P."""
        self.reset(0)
        out = self.model(input_ids=ids.to(self.device), past_key_values=self.cache, use_cache=True)
        self.tok.copy_(out.logits[:, -1:].argmax(-1))
        self.reset(ids.shape[1])
        return self.tok


def time_eager(st: Stepper, steps: int = 8, warmup: int = 2, samples: int = 3) -> dict:
    """Median over `samples` of the host wall time per step, `steps` steps after `warmup` (synchronised at the
    ends only; `generate`'s own per-step work, its stopping checks and logits processing, is not included)."""
    if warmup + steps > HEADROOM:
        raise ValueError(f"warmup + steps must be <= HEADROOM = {HEADROOM}")
    per = []
    with torch.no_grad():
        for _ in range(samples):
            st.reset(st.context - HEADROOM)
            for _ in range(warmup):
                st.step()
            _sync(st.device)
            t0 = time.perf_counter()
            for _ in range(steps):
                st.step()
            _sync(st.device)
            per.append((time.perf_counter() - t0) / steps * 1e6)
    return {"us": statistics.median(per), "samples_us": per, "steps": steps, "warmup": warmup}


class Captured:
    """One CUDA graph of `st.step()`: warmed up eagerly on a side stream first (workspaces, compilation),
    the stepper's tokens and position restored, then captured on that stream."""

    def __init__(self, st: Stepper, warmup: int = 2):
        self.st = st
        tok, pos = st.tok.clone(), int(st.pos)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(warmup):
                st.step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        st.tok.copy_(tok)
        st.reset(pos)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, stream=s):
            st.step()
        torch.cuda.synchronize()

    def replay(self) -> None:
        self.graph.replay()


def time_graphed(st: Stepper, replays: int = 16, samples: int = 15) -> dict:
    """Median over `samples` of CUDA-event time per replay of one captured step, `replays` back to back."""
    if replays + 3 > HEADROOM:
        raise ValueError(f"replays + 3 must be <= HEADROOM = {HEADROOM}")
    st.reset(st.context - HEADROOM)
    cap = Captured(st)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    for i in range(samples + 1):
        st.reset(st.context - HEADROOM)
        torch.cuda._sleep(PREFILL_CYCLES)
        start.record()
        for _ in range(replays):
            cap.replay()
        end.record()
        end.synchronize()
        if i:                                               # the first sample warms the replay path
            per.append(start.elapsed_time(end) * 1e3 / replays)
    del cap
    return {"us": statistics.median(per), "p10_us": min(per) if len(per) < 10 else statistics.quantiles(per, n=10)[0],
            "samples_us": per, "replays": replays}


@contextlib.contextmanager
def compiled_layers(model, backend: str = "inductor"):
    """Inside this block every decoder layer runs torch.compile'd (`backend`, static shapes); restored on exit."""
    import torch._dynamo
    from int4lab.quantize import decoder_layers
    # room for a compile per layer: the layers share one forward code object, and dynamo guards on each layer_idx
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    layers = list(decoder_layers(model))
    for lay in layers:
        lay.compile(backend=backend, dynamic=False)
    try:
        yield model
    finally:
        for lay in layers:
            lay._compiled_call_impl = None


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, steps: int, graphed: bool) -> list:
    """Tokens [steps][B] chosen greedily after an eager prefill of prompt [B, P]: every step eager, or every step a
    replay of one captured graph."""
    st = Stepper(model, prompt.shape[0], prompt.shape[1] + steps + HEADROOM)
    st.prefill(prompt)
    toks = []
    if graphed:
        cap = Captured(st)
        for _ in range(steps):
            cap.replay()
            toks.append(st.tok.clone())
        del cap
    else:
        for _ in range(steps):
            toks.append(st.step().clone())
    return [t.view(-1).tolist() for t in toks]
