"""Chapter 04: where the decode instrument's kernel path first parts from the torch reference path, stage by stage.

Shape legend: L = layers, S = scored decode steps, A = top-k (routed rows of one token), H = hidden, I = expert width.

`int4lab.gate.parity` compares teacher-forced decode through the int4 kernels with a full forward of the same
quantised model (on the CPU the full forward takes the torch reference path). Both quantise the same way and
round each projection's output to bf16; they part wherever float32 arithmetic is done in another order or form:
cached one-token decode against the full causal forward, with no kernel involved (attention, norms, router, and
the reference experts' float32 matmul over one routed row instead of many; a residual near 1e-5 at most steps, but
on chapter 04's traced windows also the step that carries the whole jump), and the kernels' sums and SwiGLU
against torch's matmul and silu, which can round to other bf16 values or int8 codes. `localise` looks at the second
only (the first is not traced below the logits): it replays the decode on the reference path, captures every
experts block's input at every step, and sends the same input through the kernels stage by stage
(one stage emulated in torch):
  * gate_up: the routed GEMV's bf16 output h [A, 2I] against `int4_matmul_ref` per routed expert;
  * the down projection's int8 activation codes and float32 scales of silu(gate) * up, each side from its own h,
    both computed in torch: the kernel side emulates the kernel's prologue (its SwiGLU form g / (1 + exp(-g)) * u,
    then `quant_x_rows_ref`), it is not read from the kernel;
  * down: the routed down call (its SwiGLU-and-re-quantise prologue, then the GEMV) from the *reference* h
    against the reference's silu(g) * u, re-quantised and multiplied; a difference here comes from that call (its
    prologue's SwiGLU form or its GEMV arithmetic, not separated), not from h;
  * the whole block (`Int4Experts` with the kernels on) against the reference block output.
"""
from __future__ import annotations

import torch

from int4lab.format import quant_x_rows_ref
from int4lab.kernels.launch import X_FLOAT, X_SWIGLU, launch_gemv
from int4lab.quantize import kernels_on_cpu
from int4lab.quantize.modules import Int4Experts, int4_matmul_ref


def _swiglu_codes(h: torch.Tensor):
    g, u = h.float().chunk(2, dim=-1)
    return quant_x_rows_ref(g / (1.0 + torch.exp(-g)) * u)


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in bf16 units in the last place between two bf16 tensors of one sign pattern."""
    return int((a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max()) if a.numel() else 0


@torch.no_grad()
def localise(model, windows: torch.Tensor, prompt: int) -> list[dict]:
    """One row per (window, step, experts layer) of a quantised CPU model: where the kernel path differs.

    windows int64 [W, P + S + 1] (`gate.decode_windows`). Row keys: "window", "step", "layer", "h_differ"
    (bf16 values of gate_up's output that differ), "h_ulps", "h_values", "codes_differ" (int8 codes of the down
    projection's input that differ, each side from its own h, the kernel side emulated in torch), "scales_differ"
    (their float32 activation scales, likewise), "down_differ" (down's bf16 outputs from the same h, prologue
    included),
    "block_differ" (the whole experts block's outputs), "block_values".
    """
    exps = [m for m in model.modules() if isinstance(m, Int4Experts)]
    if not exps:
        raise ValueError("model has no Int4Experts module: quantise its experts first (int4lab.quantize_model)")
    cap = []
    hooks = [m.register_forward_hook(lambda mod, a, o: cap.append((mod, tuple(t.detach().clone() for t in a),
                                                                     o.detach().clone()))) for m in exps]
    rows = []
    try:
        for w in range(windows.shape[0]):
            ids = windows[w:w + 1]
            past = model(input_ids=ids[:, :prompt], use_cache=True).past_key_values
            for step in range(ids.shape[1] - prompt - 1):
                cap.clear()
                o = model(input_ids=ids[:, prompt + step:prompt + step + 1], past_key_values=past, use_cache=True)
                past = o.past_key_values
                for layer, (mod, (hid, idx, wts), out) in enumerate(list(cap)):
                    rows.append(_stages(model, mod, hid, idx, wts, out) | {"window": w, "step": step, "layer": layer})
    finally:
        for h in hooks:
            h.remove()
    return rows


def _stages(model, mod, hid, idx, wts, out) -> dict:
    A = idx.shape[1]
    eids = idx.reshape(-1).int().contiguous()
    H, I = hid.shape[1], mod.intermediate_dim
    h_ker = launch_gemv(hid.contiguous(), None, mod.gate_up_packed, mod.gate_up_scales, eids, 2 * I, H, A,
                         x_mode=X_FLOAT, rows_per_x=A)
    h_ref = torch.cat([int4_matmul_ref(hid, mod.gate_up_packed[e], mod.gate_up_scales[e], "int8")
                       for e in eids.tolist()])
    # what each path feeds the down projection: the kernel's prologue SwiGLU g / (1 + exp(-g)) * u of its own h,
    # the reference's act_fn(g) * u of its own (Int4Experts' loop)
    qk, sk = _swiglu_codes(h_ker)
    g, u = h_ref.float().chunk(2, dim=-1)
    a_ref = mod.act_fn(g) * u
    qr, sr = quant_x_rows_ref(a_ref)
    y_ker = launch_gemv(h_ref.contiguous(), None, mod.down_packed, mod.down_scales, eids, H, I, A, x_mode=X_SWIGLU)
    y_ref = torch.cat([int4_matmul_ref(a_ref[j:j + 1], mod.down_packed[e], mod.down_scales[e], "int8")
                       for j, e in enumerate(eids.tolist())])
    with kernels_on_cpu(model, True):
        blk = mod(hid, idx, wts)
    return {"h_differ": int((h_ker != h_ref).sum()), "h_ulps": _bf16_ulps(h_ker, h_ref), "h_values": h_ref.numel(),
            "codes_differ": int((qk != qr).sum()), "scales_differ": int((sk != sr).sum()),
            "down_differ": int((y_ker != y_ref).sum()), "block_differ": int((blk != out).sum()),
            "block_values": out.numel()}
