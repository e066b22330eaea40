"""The decode instrument, kept as a kernel-parity check: teacher-forced decode through the KV cache.

Shape legend: W = windows, P = prompt tokens, S = scored decode steps, V = vocabulary.

A prompt of P tokens, then S steps of one token each through the cache. On the CPU `kernels=True` sends the
steps through the int4 kernels in Triton's interpreter (slow: a short window) while `full_forward_logprobs`
takes the torch reference path, so `parity` compares the kernels with the reference. On CUDA both run the
same decode kernels (a full forward is chunked through moe_decode_step's kernels), so there `parity` checks
cached decode against the full forward only, not the kernels. `parity` asserts that the two log-probabilities
agree within PARITY_TOL, or within PARITY_REF_FACTOR times the unquantised model's own cached-vs-full gap on the same
windows where that is larger: same quantisation points, same bf16 roundings. They still part where float32
arithmetic is done in another order or form: cached one-token decode against the full causal forward leaves a
small float32 residual at every step, and a kernel sum or SwiGLU that rounds to another bf16 value or
int8 code than torch's matmul or silu can add a larger jump.
"""
from __future__ import annotations

import contextlib

import torch

from ..quantize import kernels_on_cpu

PARITY_TOL = 0.05          # nats, max |log p| difference; a flipped bf16 rounding of a logit near 2 moves ~1e-2
# Times the unquantised model's own cached-vs-full gap: at the published widths a logit of 4-8 has a bf16 spacing
# of 0.031, so one flipped rounding there is most of PARITY_TOL, and the flips add up with depth (module doc).
PARITY_REF_FACTOR = 2.0


def _input_device(model):
    from ..quantize import input_device
    return input_device(model)


def decode_windows(tok, text: str, windows: int, prompt: int, steps: int) -> torch.Tensor:
    """int64 [W, P + S + 1]: W windows spread evenly over the tokenised text."""
    for name, v in (("windows", windows), ("prompt", prompt), ("steps", steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    ids = torch.tensor(tok(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.int64)
    L = prompt + steps + 1
    if ids.numel() < L * windows:
        raise ValueError(f"text has {ids.numel()} tokens, fewer than windows * (prompt + steps + 1) = {L * windows}")
    starts = torch.linspace(0, ids.numel() - L, windows).long()
    return torch.stack([ids[s:s + L] for s in starts.tolist()])


@torch.no_grad()
def decode_logprobs(model, windows: torch.Tensor, prompt: int, kernels: bool = False) -> torch.Tensor:
    """float32 [W, S, V] log-probabilities: prefill windows[:, :P], then one token per forward with the cache.

    Step i feeds token P + i and scores the prediction of token P + i + 1. kernels=True sends the scored
    steps of a CPU model's int4 modules through int4lab.kernels (on CUDA they run there regardless, and so
    does a full forward).
    """
    dev = _input_device(model)
    W, L = windows.shape
    out = []
    for w in range(W):
        ids = windows[w:w + 1].to(dev)
        past = model(input_ids=ids[:, :prompt], use_cache=True).past_key_values
        steps = []
        for i in range(L - prompt - 1):
            with kernels_on_cpu(model, True) if kernels else contextlib.nullcontext():
                o = model(input_ids=ids[:, prompt + i:prompt + i + 1], past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(torch.log_softmax(o.logits[0, -1].float(), -1).cpu())
        out.append(torch.stack(steps))
    return torch.stack(out)


@torch.no_grad()
def full_forward_logprobs(model, windows: torch.Tensor, prompt: int) -> torch.Tensor:
    """The same [W, S, V] log-probabilities as `decode_logprobs` from one full forward (no cache)."""
    L = windows.shape[1]
    logits = model(input_ids=windows[:, :L - 1].to(_input_device(model)), use_cache=False).logits
    return torch.log_softmax(logits[:, prompt:].float(), -1).cpu()


def parity(model, windows: torch.Tensor, prompt: int, kernels: bool = True, tol: float = PARITY_TOL,
           reference=None) -> dict:
    """Decode through the kernels vs the full forward of the same model (on the CPU: the kernels against the
    reference path; on CUDA both run the kernels): max |Δ log p| over every step and vocabulary entry, top-1
    agreement. reference (the unquantised source, same device): its own cached-vs-full gap on the same windows,
    the arithmetic's floor at this width and depth; the limit is then max(tol, PARITY_REF_FACTOR x that gap).
    Raises AssertionError past the limit (the instrument and the statistical forward would disagree)."""
    d, top1, steps = _gap(model, windows, prompt, kernels)
    out = {"steps": steps, "max_abs_logprob": d, "tol": tol, "kernels": bool(kernels), "top1_agreement": top1}
    limit = tol
    if reference is not None:
        r, r_top1, _ = _gap(reference, windows, prompt, False)
        limit = max(tol, PARITY_REF_FACTOR * r)
        out.update({"reference_max_abs_logprob": r, "reference_top1_agreement": r_top1,
                    "ref_factor": PARITY_REF_FACTOR})
    out["limit"] = limit
    if not d <= limit:
        ref = "" if reference is None else f" (the unquantised model's own gap: {out['reference_max_abs_logprob']:.3g})"
        raise AssertionError(f"decode through the kernels differs from the full forward by {d:.3g} nats > "
                             f"{limit:.3g}{ref}")
    return out


def _gap(model, windows, prompt, kernels) -> tuple[float, float, int]:
    """(max |Δ log p|, top-1 agreement, steps) of cached decode against the full forward."""
    dec = decode_logprobs(model, windows, prompt, kernels=kernels)
    full = full_forward_logprobs(model, windows, prompt)
    return ((dec - full).abs().max().item(), (dec.argmax(-1) == full.argmax(-1)).float().mean().item(),
            int(dec.shape[0] * dec.shape[1]))
