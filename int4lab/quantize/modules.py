"""The quantised modules: `Int4Linear` (attention projections) and `Int4Experts` (a layer's routed experts).

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens), H = hidden size,
I = expert intermediate size, k = experts per token.

Numerics of one quantised projection y = x W^T (W decoded as (nib - 8) * scale):
    act="int8"  W4A8: x quantised per row per 32 exactly as the kernel does (`quant_x_rows_ref`),
                products summed in fp32, the output rounded to bf16.
    act="bf16"  W4A16: x rounded to bf16, products summed in fp32, the output rounded to bf16.
On CPU the reference decode computes this (`dequant_int4_ref`); on CUDA the Triton kernels of
`int4lab.kernels` do (`moe_decode_step` for routed SwiGLU experts under W4A8, `int4_linear` otherwise).
Each module's `kernels` attribute chooses: None (default) = kernels for CUDA tensors only, True = kernels
for CPU tensors too (Triton's interpreter: slow, for short windows), False = the reference everywhere.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._checks import check_ids
from ..format import BLOCK, dequant_int4_ref, pack_int4_b32, quant_x_rows_ref
from .layout import ACTS
from .prefill import PREFILL_MIN_ROWS, prefill_experts, prefill_linear


def int4_matmul_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, act: str,
                    w: torch.Tensor | None = None) -> torch.Tensor:
    """Reference y [R, N] bf16 = x [R, K] @ W^T with W int4-b32 (packed [N, K/2], scales [N, K/32]).

    w: the float32 [N, K] `dequant_int4_ref(packed, scales)` when the caller keeps it decoded (a cache).
    """
    N, K = packed.shape[0], packed.shape[1] * 2
    if w is None:
        w = dequant_int4_ref(packed, scales, N, K)                  # fp32 [N, K]
    if act == "int8":
        q, s = quant_x_rows_ref(x)                                  # int8 [R, K], fp32 [R, K/32]
        xf = (q.float().view(-1, K // BLOCK, BLOCK) * s.unsqueeze(-1)).view(-1, K)
    else:
        xf = x.to(torch.bfloat16).float()
    return (xf @ w.t()).to(torch.bfloat16)


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, act: str,
                w: torch.Tensor | None = None, kernels: bool = False) -> torch.Tensor:
    """y [R, N] bf16; `int4lab.kernels.int4_linear` when kernels, else `int4_matmul_ref` (w: decoded cache)."""
    if x.shape[0] == 0:
        return x.new_zeros(0, packed.shape[0], dtype=torch.bfloat16)
    if kernels:
        from ..kernels import int4_linear
        # W4A8 quantises x as it comes (as the reference does); W4A16 means bf16 activations
        xk = x.to(torch.bfloat16) if act == "bf16" else x
        return int4_linear(xk.contiguous(), packed, scales, act=act)
    return int4_matmul_ref(x, packed, scales, act, w)


def _computes_silu(act_fn) -> bool:
    """Whether act_fn is SiLU, judged by what it computes (the fused SwiGLU kernel assumes it)."""
    probe = torch.linspace(-6, 6, 97)
    try:
        return bool(torch.allclose(act_fn(probe), F.silu(probe), rtol=1e-6, atol=1e-7))
    except Exception:                                           # an activation that cannot take a CPU vector
        return False


def check_experts_k(experts: nn.Module) -> None:
    """ValueError unless both fused expert weights have K a multiple of 32."""
    for name in ("gate_up_proj", "down_proj"):
        k = getattr(experts, name).shape[-1]
        if k % BLOCK:
            raise ValueError(f"experts.{name} has K = {k}, not a multiple of {BLOCK}: int4-b32 cannot hold it")


class _Int4Module(nn.Module):
    """Shared by both modules: the kernels switch and a cache of the CPU reference's decoded weights
    (decoded once, not on every call; a changed buffer changes its version or storage and is decoded again)."""

    kernels: bool | None = None
    prefill_min_rows: int | None = PREFILL_MIN_ROWS   # rows per decoded weight from which kernels take the prefill path (None: never)

    def _kernels_for(self, t: torch.Tensor) -> bool:
        return t.is_cuda if self.kernels is None else bool(self.kernels)

    def _decoded(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        key = (packed.data_ptr(), packed._version, scales.data_ptr(), scales._version, packed.device)
        cache = self.__dict__.setdefault("_w_cache", {})
        hit = cache.get(id(packed))
        if hit is None or hit[0] != key:
            N, K = packed.shape[-2], packed.shape[-1] * 2
            hit = (key, dequant_int4_ref(packed, scales, N, K))
            cache[id(packed)] = hit
        return hit[1]


@contextlib.contextmanager
def kernels_on_cpu(model: nn.Module, on: bool = True):
    """Inside this block the int4 modules of `model` send CPU tensors through int4lab.kernels too (on=True)
    or never use them (on=False); their previous setting is restored on exit."""
    mods = [m for m in model.modules() if isinstance(m, _Int4Module)]
    old = [m.kernels for m in mods]
    for m in mods:
        m.kernels = bool(on)
    try:
        yield model
    finally:
        for m, k in zip(mods, old):
            m.kernels = k


class Int4Linear(_Int4Module):
    """Drop-in for a bias-free or biased nn.Linear whose weight is int4-b32 (packed [N, K/2], scales [N, K/32])."""

    def __init__(self, packed: torch.Tensor, scales: torch.Tensor, act: str = "int8", bias: torch.Tensor | None = None):
        super().__init__()
        if act not in ACTS:
            raise ValueError(f"act must be one of {ACTS}, got {act!r}")
        self.out_features, self.in_features = packed.shape[0], packed.shape[1] * 2
        self.act = act
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, lin: nn.Linear, act: str, packer=None) -> "Int4Linear":
        packed, scales = (packer or pack_int4_b32)(lin.weight.detach().float())
        dev = lin.weight.device
        return cls(packed.to(dev), scales.to(dev), act, lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prefill_min_rows is not None and self._kernels_for(x) and \
                x.numel() >= self.prefill_min_rows * self.in_features:
            return prefill_linear(self, x)                          # many rows: quantize/prefill.py
        x2 = x.reshape(-1, self.in_features)
        if self._kernels_for(x2):
            y = self._forward_kernels(x2).to(x.dtype)
        else:
            y = int4_matmul(x2, self.packed, self.scales, self.act, self._decoded(self.packed, self.scales)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def _forward_kernels(self, x2: torch.Tensor) -> torch.Tensor:
        # The decode path: kernels.ops checks once per argument signature and keeps the plan (no per-call checks,
        # no device sync); one custom op under torch.compile. W4A16 means bf16 activations; W4A8 quantises x as
        # it comes (as the reference does).
        from ..kernels import ops
        xk = x2.to(torch.bfloat16) if self.act == "bf16" else x2
        return ops.linear(xk.contiguous(), self.packed, self.scales, self.act)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, act={self.act}, int4-b32"


class Int4Experts(_Int4Module):
    """Drop-in for transformers 5 `<Arch>Experts` with int4-b32 weights.

    gate_up_packed uint8 [E, 2I, H/2], gate_up_scales fp16 [E, 2I, H/32] (gate rows first),
    down_packed uint8 [E, H, I/2], down_scales fp16 [E, H, I/32].
    forward(hidden [R, H], top_k_index [R, k], top_k_weights [R, k]) -> [R, H]: for each routed expert,
    act_fn(gate) * up, down, times the routing weight, summed over the k slots in slot order (the HF experts
    math), the sum rounded to bf16 once (as the kernels' combine does) and returned in hidden's dtype.
    """

    def __init__(self, gate_up: tuple, down: tuple, act_fn, act: str = "int8"):
        super().__init__()
        if act not in ACTS:
            raise ValueError(f"act must be one of {ACTS}, got {act!r}")
        self.num_experts = gate_up[0].shape[0]
        self.intermediate_dim = gate_up[0].shape[1] // 2
        self.hidden_dim = down[0].shape[1]
        self.act, self.act_fn = act, act_fn
        self.swiglu = _computes_silu(act_fn)        # moe_decode_step fuses SwiGLU; others take the loop
        self.register_buffer("gate_up_packed", gate_up[0])
        self.register_buffer("gate_up_scales", gate_up[1])
        self.register_buffer("down_packed", down[0])
        self.register_buffer("down_scales", down[1])

    @classmethod
    def from_experts(cls, experts: nn.Module, act: str, gate_up=None, down=None) -> "Int4Experts":
        """Round-to-nearest pack of experts.gate_up_proj / down_proj unless packs are given."""
        dev = experts.gate_up_proj.device
        check_experts_k(experts)
        gate_up = gate_up or pack_int4_b32(experts.gate_up_proj.detach().float())
        down = down or pack_int4_b32(experts.down_proj.detach().float())
        return cls(tuple(t.to(dev) for t in gate_up), tuple(t.to(dev) for t in down), experts.act_fn, act)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        # Expert ids outside [0, E), one rule on every path: refused (ValueError) where the ids are on the host
        # and the check costs nothing; on a GPU or inside a torch.compile trace, where reading them back would stall
        # the queue or break the capture / trace, the token's row comes out NaN (the kernels' guard; the reference
        # path below does the same).
        if not top_k_index.is_cuda and not torch.compiler.is_compiling():
            check_ids("top_k_index", top_k_index, self.num_experts)
        if self.prefill_min_rows is not None and self._kernels_for(hidden_states) and \
                top_k_index.numel() >= self.prefill_min_rows * self.num_experts:
            return prefill_experts(self, hidden_states, top_k_index, top_k_weights)   # quantize/prefill.py
        ker = self._kernels_for(hidden_states)
        if ker and self.act == "int8" and self.swiglu:
            return self._forward_gemv(hidden_states, top_k_index, top_k_weights)
        R, k = top_k_index.shape
        E = self.num_experts
        # Sort the (token, slot) pairs by expert: each expert reads one contiguous slice, and the results
        # go back by one inverse permutation (no scatter-add, which is slow on the CPU).
        flat = top_k_index.reshape(-1)
        valid = (flat >= 0) & (flat < E)                            # all true on the host (checked above)
        order = torch.argsort(torch.where(valid, flat, E), stable=True)
        counts = torch.bincount(torch.where(valid, flat, E), minlength=E + 1).tolist()
        x = hidden_states.index_select(0, order // k)              # [R*k, H], grouped by expert
        ys = torch.zeros_like(x)
        wgu = None if ker else self._decoded(self.gate_up_packed, self.gate_up_scales)   # fp32 [E, 2I, H]
        wdn = None if ker else self._decoded(self.down_packed, self.down_scales)         # fp32 [E, H, I]
        start = 0
        for e in range(E):
            n = counts[e]
            if n == 0:
                continue
            xe = x[start:start + n]
            gu = int4_matmul(xe, self.gate_up_packed[e], self.gate_up_scales[e], self.act,
                             None if wgu is None else wgu[e], ker).to(xe.dtype)
            gate, up = gu.chunk(2, dim=-1)                          # [n, I] each
            ys[start:start + n] = int4_matmul(self.act_fn(gate) * up, self.down_packed[e], self.down_scales[e],
                                              self.act, None if wdn is None else wdn[e], ker).to(xe.dtype)
            start += n
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        y = ys.index_select(0, inv)                                 # back to (token, slot) order
        w = torch.where(valid, top_k_weights.reshape(-1).to(y.dtype), torch.nan).view(R, k, 1)   # NaN row
        out = (y.view(R, k, -1) * w).sum(1)
        # the block's output is bf16, as moe_decode_step's combine emits it, whatever the model's dtype
        return out.to(torch.bfloat16).to(hidden_states.dtype)

    def _forward_gemv(self, hidden_states, top_k_index, top_k_weights):
        # The MoE decode step of int4lab.kernels (moe_decode_step's bits): one routed GEMV row per (token, slot),
        # SwiGLU fused with the re-quantisation of h, the k slots combined with the routing weights in float32
        # (read in their own dtype). kernels.ops checks once per argument signature, keeps the plans, never reads
        # the ids back (an id outside [0, E) gives a NaN row, the kernels' guard), and chunks a full forward
        # (scoring, calibration) into calls of at most MAX_ROUTED_ROWS routed rows.
        from ..kernels import ops
        y = ops.moe(hidden_states.contiguous(), top_k_index.contiguous(), top_k_weights.contiguous(),
                    self.gate_up_packed, self.gate_up_scales, self.down_packed, self.down_scales)
        return y.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden={self.hidden_dim}, intermediate={self.intermediate_dim}, "
                f"act={self.act}, int4-b32")


@contextlib.contextmanager
def restored_on_failure(model):
    """On an exception inside the block (KeyboardInterrupt included), put back every submodule the modules of
    `model` held when it began and drop an int4_scheme set inside: a failed or refused conversion (quantize_model,
    load_quantized) leaves the model as it was. The replaced float modules are never modified, only unhooked."""
    saved = [(m, dict(m._modules)) for m in model.modules()]
    try:
        yield model
    except BaseException:
        for m, mods in saved:
            m._modules.clear()
            m._modules.update(mods)
        model.__dict__.pop("int4_scheme", None)
        raise
