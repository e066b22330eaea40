"""Quantise a transformers-5 MoE model onto int4-b32: module swap, calibration driver, save/load.

Shape legend: E = experts, N = out features, K = in features, R = rows (tokens, or token x expert slots),
H = hidden size, I = expert intermediate size, T = tokens per sequence, B = calibration sequences.

transformers 5 stores each MoE layer's experts as fused 3-D parameters (`<Arch>Experts`):
    gate_up_proj [E, 2I, H]  (gate rows first, then up rows)      down_proj [E, H, I]
and calls `experts(hidden [R, H], top_k_index [R, k], top_k_weights [R, k])`. The router (`mlp.gate`)
is a plain module holding a weight, not an `nn.Linear`; attention q/k/v/o are `nn.Linear`.
`quantize_model` swaps the experts for `Int4Experts` and (optionally) the attention projections for
`Int4Linear`; the router, norms, embeddings and lm_head stay as they are.

Numerics of one quantised projection y = x W^T (W decoded as (nib - 8) * scale):
    act="int8"  W4A8: x quantised per row per 32 exactly as the kernel does (`quant_x_rows_ref`),
                products summed in fp32, the output rounded to bf16.
    act="bf16"  W4A16: x rounded to bf16, products summed in fp32, the output rounded to bf16.
On CPU the reference decode computes this (`dequant_int4_ref`); on CUDA the Triton kernels of
`int4lab.kernels` do (`moe_decode_step` for routed SwiGLU experts under W4A8, `int4_linear` otherwise).

Calibration (scheme="gptq") follows IST-DASLab/gptq's sequential driver: capture the inputs of decoder
layer 0; for each layer, hook every projection, run the layer, pack with GPTQ, swap the quantised modules
in, then run the layer again so the next layer is calibrated on quantised outputs. The Hessian of expert e
in layer L comes only from the rows the router sends to e (top-k); an expert with fewer than `min_rows`
rows is packed round-to-nearest instead, and the report lists it with its row count.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._checks import check_tensor
from .format import BLOCK, dequant_int4_ref, pack_int4_b32, quant_x_rows_ref

FORMAT_VERSION = 1
SCHEMES = ("rtn", "gptq")
TARGETS = ("experts", "experts+attn")
ACTS = ("int8", "bf16")

# Where each architecture keeps its pieces. transformers 5 happens to use the same names for all three;
# a new architecture is one more row here, not a new driver.
LAYOUT = {
    "mixtral": dict(layers="model.layers", attn="self_attn", moe="mlp", router="gate", experts="experts"),
    "olmoe": dict(layers="model.layers", attn="self_attn", moe="mlp", router="gate", experts="experts"),
    "qwen3_moe": dict(layers="model.layers", attn="self_attn", moe="mlp", router="gate", experts="experts"),
}
ATTN_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Scheme:
    """What was quantised and how; recorded in every saved checkpoint."""
    scheme: str = "rtn"            # "rtn" | "gptq": how codes are chosen
    targets: str = "experts"       # "experts" | "experts+attn"
    act: str = "int8"              # "int8" (W4A8) | "bf16" (W4A16)
    lm_head: bool = False          # round-to-nearest lm_head too (off by default: the seed keeps it high precision)

    def __post_init__(self):
        for name, val, allowed in (("scheme", self.scheme, SCHEMES), ("targets", self.targets, TARGETS),
                                   ("act", self.act, ACTS)):
            if val not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {val!r}")
        if not isinstance(self.lm_head, bool):
            raise TypeError(f"lm_head must be a bool, got {type(self.lm_head).__name__}")

    @property
    def name(self) -> str:
        return f"{self.scheme}/{self.targets}/{'W4A8' if self.act == 'int8' else 'W4A16'}"


def model_arch(model) -> str:
    """The LAYOUT key of a transformers causal-LM, or ValueError naming the supported ones."""
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt not in LAYOUT:
        raise ValueError(f"unsupported architecture {mt!r}: int4lab handles {tuple(LAYOUT)} "
                         "(transformers 5 fused-expert MoE models)")
    return mt


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def decoder_layers(model) -> nn.ModuleList:
    return _get(model, LAYOUT[model_arch(model)]["layers"])


def _moe(layer, arch):
    """The sparse MoE block of a layer, or None (Qwen3-MoE may keep some layers dense: mlp_only_layers)."""
    lay = LAYOUT[arch]
    mlp = getattr(layer, lay["moe"])
    return mlp if hasattr(mlp, lay["experts"]) else None


# ----------------------------------------------------------------------------------------------------
# The one quantised matmul: CPU reference decode or CUDA kernels, same numerics.

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


_KERNELS_ON_CPU = False


def _use_kernels(t: torch.Tensor) -> bool:
    return t.is_cuda or _KERNELS_ON_CPU


@contextlib.contextmanager
def kernels_on_cpu(on: bool = True):
    """Inside this block CPU tensors also go through int4lab.kernels (Triton's interpreter: slow, for short
    windows) instead of the reference decode; the gate's decode instrument uses it for its scored steps."""
    global _KERNELS_ON_CPU
    old, _KERNELS_ON_CPU = _KERNELS_ON_CPU, bool(on)
    try:
        yield
    finally:
        _KERNELS_ON_CPU = old


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, act: str,
                w: torch.Tensor | None = None) -> torch.Tensor:
    """y [R, N] bf16; the Triton kernel on CUDA, `int4_matmul_ref` elsewhere (w: optional decoded cache)."""
    if x.shape[0] == 0:
        return x.new_zeros(0, packed.shape[0], dtype=torch.bfloat16)
    if _use_kernels(x):
        from .kernels import int4_linear
        # W4A8 quantises x as it comes (as the reference does); W4A16 means bf16 activations
        xk = x.to(torch.bfloat16) if act == "bf16" else x
        return int4_linear(xk.contiguous(), packed, scales, act=act)
    return int4_matmul_ref(x, packed, scales, act, w)


class _DecodeCache:
    """The CPU reference decodes each weight once, not on every call; a changed buffer (load_state_dict,
    .to()) changes its version or storage and is decoded again."""

    def _decoded(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        key = (packed.data_ptr(), packed._version, scales.data_ptr(), scales._version, packed.device)
        cache = self.__dict__.setdefault("_w_cache", {})
        hit = cache.get(id(packed))
        if hit is None or hit[0] != key:
            N, K = packed.shape[-2], packed.shape[-1] * 2
            hit = (key, dequant_int4_ref(packed, scales, N, K))
            cache[id(packed)] = hit
        return hit[1]


class Int4Linear(_DecodeCache, nn.Module):
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
        x2 = x.reshape(-1, self.in_features)
        w = None if _use_kernels(x2) else self._decoded(self.packed, self.scales)
        y = int4_matmul(x2, self.packed, self.scales, self.act, w).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, act={self.act}, int4-b32"


_SILU = ("SiLU", "SiLUActivation")       # moe_decode_step fuses SwiGLU; other activations take the loop below


class Int4Experts(_DecodeCache, nn.Module):
    """Drop-in for transformers 5 `<Arch>Experts` with int4-b32 weights.

    gate_up_packed uint8 [E, 2I, H/2], gate_up_scales fp16 [E, 2I, H/32] (gate rows first),
    down_packed uint8 [E, H, I/2], down_scales fp16 [E, H, I/32].
    forward(hidden [R, H], top_k_index [R, k], top_k_weights [R, k]) -> [R, H]: for each routed expert,
    act_fn(gate) * up, down, times the routing weight, summed over the k slots (the HF experts math),
    the sum rounded to bf16 once (as the kernels' combine does) and returned in hidden's dtype.
    """

    def __init__(self, gate_up: tuple, down: tuple, act_fn, act: str = "int8"):
        super().__init__()
        if act not in ACTS:
            raise ValueError(f"act must be one of {ACTS}, got {act!r}")
        self.num_experts = gate_up[0].shape[0]
        self.intermediate_dim = gate_up[0].shape[1] // 2
        self.hidden_dim = down[0].shape[1]
        self.act, self.act_fn = act, act_fn
        self.register_buffer("gate_up_packed", gate_up[0])
        self.register_buffer("gate_up_scales", gate_up[1])
        self.register_buffer("down_packed", down[0])
        self.register_buffer("down_scales", down[1])

    @classmethod
    def from_experts(cls, experts: nn.Module, act: str, gate_up=None, down=None) -> "Int4Experts":
        """Round-to-nearest pack of experts.gate_up_proj / down_proj unless packs are given."""
        dev = experts.gate_up_proj.device
        for name in ("gate_up_proj", "down_proj"):
            k = getattr(experts, name).shape[-1]
            if k % BLOCK:
                raise ValueError(f"experts.{name} has K = {k}, not a multiple of {BLOCK}: int4-b32 cannot hold it")
        gate_up = gate_up or pack_int4_b32(experts.gate_up_proj.detach().float())
        down = down or pack_int4_b32(experts.down_proj.detach().float())
        return cls(tuple(t.to(dev) for t in gate_up), tuple(t.to(dev) for t in down), experts.act_fn, act)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        if _use_kernels(hidden_states) and self.act == "int8" and type(self.act_fn).__name__ in _SILU:
            return self._forward_gemv(hidden_states, top_k_index, top_k_weights)
        out = torch.zeros_like(hidden_states)
        cpu = not _use_kernels(hidden_states)
        wgu = self._decoded(self.gate_up_packed, self.gate_up_scales) if cpu else None   # fp32 [E, 2I, H]
        wdn = self._decoded(self.down_packed, self.down_scales) if cpu else None         # fp32 [E, H, I]
        for e in torch.unique(top_k_index).tolist():
            if not 0 <= e < self.num_experts:
                continue                                            # HF's padding slot (expert parallelism)
            tok, slot = torch.where(top_k_index == e)               # [r], [r]
            x = hidden_states[tok]                                  # [r, H]
            gu = int4_matmul(x, self.gate_up_packed[e], self.gate_up_scales[e], self.act,
                             None if wgu is None else wgu[e]).to(x.dtype)
            gate, up = gu.chunk(2, dim=-1)                          # [r, I] each
            h = self.act_fn(gate) * up
            y = int4_matmul(h, self.down_packed[e], self.down_scales[e], self.act,
                            None if wdn is None else wdn[e]).to(x.dtype)
            y = y * top_k_weights[tok, slot, None]
            # index_put_(accumulate) rather than index_add_: same sums, and index_add_ costs ~10 ms a call
            # on the CPU build of torch 2.13 for a one-row update.
            out.index_put_((tok,), y.to(out.dtype), accumulate=True)
        # the block's output is bf16, as moe_decode_step's combine emits it, whatever the model's dtype
        return out.to(torch.bfloat16).to(hidden_states.dtype)

    def _forward_gemv(self, hidden_states, top_k_index, top_k_weights):
        # The MoE decode step of int4lab.kernels: one routed GEMV row per (token, slot), SwiGLU fused with
        # the re-quantisation of h, the k slots combined with the routing weights in float32.
        from .kernels import moe_decode_step
        y = moe_decode_step(hidden_states.contiguous(), top_k_index.contiguous(), top_k_weights.float().contiguous(),
                            self.gate_up_packed, self.gate_up_scales, self.down_packed, self.down_scales)
        return y.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden={self.hidden_dim}, intermediate={self.intermediate_dim}, "
                f"act={self.act}, int4-b32")


# ----------------------------------------------------------------------------------------------------
# The driver.

@dataclass
class QuantReport:
    arch: str
    scheme: Scheme
    layers: int = 0
    experts_modules: int = 0
    attn_modules: int = 0
    lm_head: bool = False
    gptq_experts: int = 0                     # (layer, expert) pairs packed with GPTQ
    fallback: list = None                     # [{"layer", "expert", "rows"}] packed round-to-nearest instead
    min_rows: int = 0
    calib_tokens: int = 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["scheme"] = asdict(self.scheme)
        return d


def _swap_attn(attn, act, packers=None):
    for name in ATTN_PROJ:
        lin = getattr(attn, name)
        packer = None if packers is None else packers[name]
        setattr(attn, name, Int4Linear.from_linear(lin, act, packer))


def quantize_model(model, scheme: str = "rtn", targets: str = "experts", act: str = "int8", *,
                   calib_ids: torch.Tensor | None = None, min_rows: int = 32, damp: float = 0.01,
                   blocksize: int = 128, batch_size: int = 8, lm_head: bool = False, progress: bool = True):
    """Quantise `model` in place onto int4-b32; returns (model, QuantReport).

    scheme "rtn" packs round-to-nearest; "gptq" needs calib_ids (int64 [B, T]) and packs with
    `int4lab.gptq.gptq_pack_int4_b32`, calibrated layer by layer (see module docstring). Experts with fewer
    than min_rows routed calibration rows fall back to round-to-nearest and are listed in the report.
    targets: "experts" or "experts+attn". act: "int8" (W4A8) or "bf16" (W4A16). lm_head=True packs the
    lm_head round-to-nearest (never calibrated). The router is never quantised.
    """
    sch = Scheme(scheme, targets, act, lm_head)
    arch = model_arch(model)
    if not isinstance(min_rows, int) or isinstance(min_rows, bool) or min_rows < 1:
        raise ValueError(f"min_rows must be a positive int, got {min_rows!r}")
    if not (isinstance(damp, (int, float)) and damp > 0):
        raise ValueError(f"damp must be a positive number, got {damp!r}")
    if scheme == "gptq":
        check_tensor("calib_ids", calib_ids, (torch.int64,), (2,))
        if calib_ids.numel() == 0:
            raise ValueError("calib_ids must hold at least one token")
    elif calib_ids is not None:
        raise ValueError("calib_ids is only used by scheme='gptq'; pass None for round-to-nearest")
    rep = QuantReport(arch=arch, scheme=sch, fallback=[], min_rows=min_rows,
                      calib_tokens=0 if calib_ids is None else calib_ids.numel())
    layers = decoder_layers(model)
    if scheme == "rtn":
        for layer in _progress(layers, progress, "rtn pack"):
            _quantize_layer_rtn(layer, arch, sch, rep)
    else:
        _quantize_gptq(model, layers, arch, sch, rep, calib_ids, min_rows, damp, blocksize, batch_size, progress)
    if lm_head:
        model.lm_head = Int4Linear.from_linear(model.lm_head, act)
        rep.lm_head = True
    rep.layers = len(layers)
    model.int4_scheme = sch
    return model, rep


def _progress(it, on, desc):
    if not on:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, leave=False)


def _quantize_layer_rtn(layer, arch, sch, rep):
    lay = LAYOUT[arch]
    moe = _moe(layer, arch)
    if moe is not None:
        setattr(moe, lay["experts"], Int4Experts.from_experts(getattr(moe, lay["experts"]), sch.act))
        rep.experts_modules += 1
    if sch.targets == "experts+attn":
        _swap_attn(getattr(layer, lay["attn"]), sch.act)
        rep.attn_modules += 1


def _to(obj, dev):
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_to(o, dev) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, dev) for k, v in obj.items()}
    return obj


class _Stop(Exception):
    pass


@torch.no_grad()
def capture_layer0_inputs(model, calib_ids: torch.Tensor, batch_size: int = 8) -> list:
    """Run the model up to decoder layer 0 on each batch of calib_ids; returns [(hidden [b, T, H], kwargs)]."""
    layers = decoder_layers(model)
    caught = []

    def grab(_mod, args, kwargs):
        hs = args[0] if args else kwargs.pop("hidden_states")
        caught.append((hs, {k: v for k, v in kwargs.items() if k != "hidden_states"}))
        raise _Stop

    h = layers[0].register_forward_pre_hook(grab, with_kwargs=True)
    dev = model.get_input_embeddings().weight.device
    try:
        for b in range(0, calib_ids.shape[0], batch_size):
            try:
                model(input_ids=calib_ids[b:b + batch_size].to(dev), use_cache=False)
            except _Stop:
                pass
    finally:
        h.remove()
    return caught


@torch.no_grad()
def _quantize_gptq(model, layers, arch, sch, rep, calib_ids, min_rows, damp, blocksize, batch_size, progress):
    from .gptq import HessianAccumulator, gptq_pack_int4_b32
    lay = LAYOUT[arch]
    batches = capture_layer0_inputs(model, calib_ids, batch_size)

    def gptq(w, acc):
        return gptq_pack_int4_b32(w.detach().float(), acc.H.to(w.device), damp=damp, blocksize=blocksize)

    for li, layer in enumerate(_progress(layers, progress, "gptq layers")):
        dev = next(layer.parameters()).device
        moe = _moe(layer, arch)
        attn = getattr(layer, lay["attn"])
        hooks = []
        acc = {}
        if sch.targets == "experts+attn":
            # q, k and v read the same input: one Hessian serves all three.
            acc["qkv"] = HessianAccumulator(attn.q_proj.in_features, device="cpu")
            acc["o"] = HessianAccumulator(attn.o_proj.in_features, device="cpu")
            hooks.append(attn.q_proj.register_forward_pre_hook(
                lambda m, a: acc["qkv"].add(a[0].reshape(-1, a[0].shape[-1]).float())))
            hooks.append(attn.o_proj.register_forward_pre_hook(
                lambda m, a: acc["o"].add(a[0].reshape(-1, a[0].shape[-1]).float())))
        if moe is not None:
            ex = getattr(moe, lay["experts"])
            E, I2, H = ex.gate_up_proj.shape
            acc_gu = [HessianAccumulator(H, device="cpu") for _ in range(E)]
            acc_dn = [HessianAccumulator(I2 // 2, device="cpu") for _ in range(E)]
            rows = [0] * E

            def expert_hook(m, args, kwargs):
                hs = args[0] if args else kwargs["hidden_states"]
                idx = args[1] if len(args) > 1 else kwargs["top_k_index"]      # [R, k]
                for e in torch.unique(idx).tolist():
                    if not 0 <= e < E:
                        continue
                    tok = torch.where((idx == e).any(-1))[0]
                    x = hs[tok].float()                                       # rows routed to e [r, H]
                    rows[e] += x.shape[0]
                    acc_gu[e].add(x)
                    gate, up = F.linear(x, m.gate_up_proj[e].float()).chunk(2, dim=-1)
                    acc_dn[e].add(m.act_fn(gate) * up)                         # down's input [r, I]
            hooks.append(ex.register_forward_pre_hook(expert_hook, with_kwargs=True))
        try:
            for hs, kw in batches:
                layer(_to(hs, dev), **_to(kw, dev))
        finally:
            for h in hooks:
                h.remove()

        if sch.targets == "experts+attn":
            packers = {n: (lambda w, a=acc["o" if n == "o_proj" else "qkv"]: gptq(w, a)) for n in ATTN_PROJ}
            _swap_attn(attn, sch.act, packers)
            rep.attn_modules += 1
        if moe is not None:
            gu_p, gu_s, dn_p, dn_s = [], [], [], []
            for e in range(E):
                if rows[e] >= min_rows:
                    p1, s1 = gptq(ex.gate_up_proj[e], acc_gu[e])
                    p2, s2 = gptq(ex.down_proj[e], acc_dn[e])
                    rep.gptq_experts += 1
                else:
                    p1, s1 = pack_int4_b32(ex.gate_up_proj[e].detach().float())
                    p2, s2 = pack_int4_b32(ex.down_proj[e].detach().float())
                    rep.fallback.append({"layer": li, "expert": e, "rows": rows[e]})
                gu_p.append(p1), gu_s.append(s1), dn_p.append(p2), dn_s.append(s2)
            new = Int4Experts.from_experts(ex, sch.act, (torch.stack(gu_p), torch.stack(gu_s)),
                                           (torch.stack(dn_p), torch.stack(dn_s)))
            setattr(moe, lay["experts"], new)
            rep.experts_modules += 1
        # The next layer sees this layer's quantised outputs.
        batches = [(layer(_to(hs, dev), **_to(kw, dev)), kw) for hs, kw in batches]


# ----------------------------------------------------------------------------------------------------
# Save / load: packed bytes + scales + the high-precision rest in one safetensors file.

def save_quantized(model, path) -> None:
    """Write model's state (packed uint8, fp16 scales, everything else as is) to a safetensors file.

    Metadata: format_version, arch, scheme (JSON of `Scheme`), config (JSON). Tied tensors are stored
    once per name (cloned), so the file loads without shared-memory surprises.
    """
    from safetensors.torch import save_file
    sch = getattr(model, "int4_scheme", None)
    if sch is None:
        raise ValueError("model is not quantised (no int4_scheme attribute): call quantize_model first")
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    meta = {"format_version": str(FORMAT_VERSION), "arch": model_arch(model),
            "scheme": json.dumps(asdict(sch)), "config": model.config.to_json_string()}
    save_file(state, str(path), metadata=meta)


def read_metadata(path) -> dict:
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_quantized(path, base_model):
    """Load a file written by `save_quantized` into base_model (an unquantised model of the same config).

    Refuses (ValueError) a file of another format_version or architecture, or whose tensor names or shapes
    differ from what the recorded scheme makes of base_model. Returns (model, Scheme).
    """
    from pathlib import Path
    from safetensors.torch import load_file
    if not Path(path).is_file():
        raise FileNotFoundError(f"quantised checkpoint {path} does not exist")
    meta = read_metadata(path)
    ver = meta.get("format_version")
    if ver != str(FORMAT_VERSION):
        raise ValueError(f"{path}: format_version {ver!r} is not supported (this int4lab reads {FORMAT_VERSION})")
    arch = model_arch(base_model)
    if meta.get("arch") != arch:
        raise ValueError(f"{path}: holds a {meta.get('arch')!r} model, base_model is {arch!r}")
    sch = Scheme(**json.loads(meta["scheme"]))
    # Build the quantised module structure (round-to-nearest placeholders of the right shapes), then overwrite.
    model, _ = quantize_model(base_model, "rtn", sch.targets, sch.act, lm_head=sch.lm_head, progress=False)
    model.int4_scheme = sch
    state = load_file(str(path), device="cpu")
    want = model.state_dict()
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        raise ValueError(f"{path}: tensor names do not match the scheme {sch.name}: "
                         f"missing {missing[:5]}, unexpected {extra[:5]}")
    for k, v in state.items():
        if tuple(v.shape) != tuple(want[k].shape) or v.dtype != want[k].dtype:
            raise ValueError(f"{path}: tensor {k} has shape {tuple(v.shape)} {v.dtype}, the model expects "
                             f"{tuple(want[k].shape)} {want[k].dtype}")
    model.load_state_dict(state, strict=True)
    return model, sch
