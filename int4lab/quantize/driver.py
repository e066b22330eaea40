"""`quantize_model`: swap a model's experts (and optionally attention) for int4-b32 modules.

Shape legend: E = experts, N = out features, K = in features, H = hidden size, I = expert intermediate
size, B = calibration sequences, T = tokens per sequence.

Three ways to choose the codes, all emitting the same int4-b32 bytes layout:
- round-to-nearest (scheme="rtn"), `format.pack_int4_b32`;
- dithered round-to-nearest (scheme="rtn", dither > 0): codes round(w / s + u), u ~ U(-dither, dither) drawn
  from a seeded generator — an equally good rounding that differs only where w / s sits near a half.
  The gate re-packs with several seeds to measure how much perplexity moves under such harmless changes
  (the rounding lottery);
- GPTQ (scheme="gptq"), following IST-DASLab/gptq's sequential driver: capture the inputs of decoder layer 0;
  for each layer, hook every projection (`hessian.hessian_hooks`), run the layer, pack with GPTQ, swap the
  quantised modules in, then run the layer again so the next layer is calibrated on quantised outputs.
  Expert e's Hessian comes only from the rows the router sends to it; an expert with fewer than `min_rows`
  rows (default: K of its widest input, so its Hessians have full rank) is packed round-to-nearest instead,
  and the report lists it with its row count.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .._checks import check_tensor
from ..format import BLOCK, block_scales, check_scale_range, pack_codes, pack_int4_b32
from .hessian import attn_key, expert_key, hessian_hooks
from .layout import ATTN_PROJ, LAYOUT, Scheme, attention, decoder_layers, experts_of, model_arch, moe_block
from .modules import Int4Experts, Int4Linear, check_experts_k


@dataclass
class QuantReport:
    arch: str
    scheme: Scheme
    layers: int = 0
    experts_modules: int = 0
    attn_modules: int = 0
    lm_head: bool = False
    gptq_experts: int = 0                     # (layer, expert) pairs packed with GPTQ
    fallback: list = field(default_factory=list)   # [{"layer", "expert", "rows"}] packed round-to-nearest instead
    rows: list = field(default_factory=list)       # rows[layer][expert]: routed calibration rows
    min_rows: int = 0
    calib_tokens: int = 0
    damp: float = 0.0
    dither: float = 0.0
    dither_seed: int | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["scheme"] = asdict(self.scheme)
        return d


def dithered_pack(w: torch.Tensor, dither: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_int4_b32` with the rounding dithered: codes round(w / s + u), u ~ U(-dither, dither), clamped to
    [-8, 7]; the same scales (amax / 7). w [..., N, K] float; returns (packed uint8, scales float16)."""
    s = block_scales(w)                                             # fp32 [..., N, K/32]
    check_scale_range(s)
    wb = w.float().reshape(*w.shape[:-1], -1, BLOCK)
    u = (torch.rand(wb.shape, generator=generator) * 2 - 1) * dither
    q = torch.round(wb / s.unsqueeze(-1) + u.to(wb.device)).clamp_(-8, 7).to(torch.int8).reshape(w.shape)
    return pack_codes(q), s.to(torch.float16)


def _progress(it, on, desc):
    if not on:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, leave=False)


def _swap_attn(attn, act, packers=None):
    for name in ATTN_PROJ:
        packer = None if packers is None else packers[name]
        setattr(attn, name, Int4Linear.from_linear(getattr(attn, name), act, packer))


def _set_experts(layer, arch, new):
    setattr(moe_block(layer, arch), LAYOUT[arch]["experts"], new)


def quantize_model(model, scheme: str = "rtn", targets: str = "experts", act: str = "int8", *,
                   calib_ids: torch.Tensor | None = None, min_rows: int | None = None, damp: float = 0.01,
                   blocksize: int = 128, batch_size: int = 8, lm_head: bool = False, dither: float = 0.0,
                   dither_seed: int = 0, progress: bool = True):
    """Quantise `model` in place onto int4-b32; returns (model, QuantReport).

    scheme "rtn" packs round-to-nearest (dithered when dither > 0: amplitude in units of the scale, seeded
    by dither_seed); "gptq" needs calib_ids (int64 [B, T]) and packs with `int4lab.gptq.gptq_pack_int4_b32`,
    calibrated layer by layer (see module docstring). Experts with fewer than min_rows routed calibration rows
    (default None: max(H, I), the K of their widest input) fall back to round-to-nearest, listed in the report.
    targets: "experts" or "experts+attn". act: "int8" (W4A8) or "bf16" (W4A16). lm_head=True packs the
    lm_head round-to-nearest (never calibrated). The router is never quantised.
    """
    sch = Scheme(scheme, targets, act, lm_head)
    arch = model_arch(model)
    if min_rows is not None and (not isinstance(min_rows, int) or isinstance(min_rows, bool) or min_rows < 1):
        raise ValueError(f"min_rows must be a positive int or None (= K), got {min_rows!r}")
    if not (isinstance(damp, (int, float)) and damp > 0):
        raise ValueError(f"damp must be a positive number, got {damp!r}")
    if not (isinstance(dither, (int, float)) and 0 <= dither <= 0.5):
        raise ValueError(f"dither must be a number in [0, 0.5] (units of the scale), got {dither!r}")
    if dither and scheme != "rtn":
        raise ValueError("dither applies to scheme='rtn' only (the rounding lottery)")
    if scheme == "gptq":
        check_tensor("calib_ids", calib_ids, (torch.int64,), (2,))
        if calib_ids.numel() == 0:
            raise ValueError("calib_ids must hold at least one token")
    elif calib_ids is not None:
        raise ValueError("calib_ids is only used by scheme='gptq'; pass None for round-to-nearest")
    rep = QuantReport(arch=arch, scheme=sch, min_rows=min_rows or 0, damp=damp if scheme == "gptq" else 0.0,
                      calib_tokens=0 if calib_ids is None else calib_ids.numel(), dither=float(dither),
                      dither_seed=dither_seed if dither else None)
    layers = decoder_layers(model)
    if scheme == "rtn":
        gen = torch.Generator().manual_seed(dither_seed)
        pack = (lambda w: dithered_pack(w, dither, gen)) if dither else pack_int4_b32
        for layer in _progress(layers, progress, "rtn pack"):
            _quantize_layer_rtn(layer, arch, sch, rep, pack)
    else:
        _quantize_gptq(model, layers, arch, sch, rep, calib_ids, min_rows, damp, blocksize, batch_size, progress)
    if lm_head:
        model.lm_head = Int4Linear.from_linear(model.lm_head, act)
        rep.lm_head = True
    rep.layers = len(layers)
    model.int4_scheme = sch
    return model, rep


def _quantize_layer_rtn(layer, arch, sch, rep, pack):
    ex = experts_of(layer, arch)
    if ex is not None:
        check_experts_k(ex)
        gu = pack(ex.gate_up_proj.detach().float())
        dn = pack(ex.down_proj.detach().float())
        _set_experts(layer, arch, Int4Experts.from_experts(ex, sch.act, gu, dn))
        rep.experts_modules += 1
    if sch.targets == "experts+attn":
        _swap_attn(attention(layer, arch), sch.act, {p: pack for p in ATTN_PROJ})
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
    from ..gptq import gptq_pack_int4_b32
    batches = capture_layer0_inputs(model, calib_ids, batch_size)

    def gptq(w, acc):
        return gptq_pack_int4_b32(w.detach().float(), acc.H.to(w.device), damp=damp, blocksize=blocksize)

    for li, layer in enumerate(_progress(layers, progress, "gptq layers")):
        dev = next(layer.parameters()).device
        ex = experts_of(layer, arch)
        with hessian_hooks(model, layers=[li], attn=sch.targets == "experts+attn") as accs:
            for hs, kw in batches:
                layer(_to(hs, dev), **_to(kw, dev))
        if sch.targets == "experts+attn":
            _swap_attn(attention(layer, arch), sch.act,
                       {p: (lambda w, a=accs[attn_key(li, p)]: gptq(w, a)) for p in ATTN_PROJ})
            rep.attn_modules += 1
        if ex is not None:
            E, I2, H = ex.gate_up_proj.shape
            need = min_rows or max(H, I2 // 2)
            rep.min_rows = need
            gu_p, gu_s, dn_p, dn_s, rows = [], [], [], [], []
            for e in range(E):
                a_gu, a_dn = accs.get(expert_key(li, e, "gate_up")), accs.get(expert_key(li, e, "down"))
                n = 0 if a_gu is None else a_gu.nsamples
                rows.append(n)
                if n >= need:
                    p1, s1 = gptq(ex.gate_up_proj[e], a_gu)
                    p2, s2 = gptq(ex.down_proj[e], a_dn)
                    rep.gptq_experts += 1
                else:
                    p1, s1 = pack_int4_b32(ex.gate_up_proj[e].detach().float())
                    p2, s2 = pack_int4_b32(ex.down_proj[e].detach().float())
                    rep.fallback.append({"layer": li, "expert": e, "rows": n})
                gu_p.append(p1), gu_s.append(s1), dn_p.append(p2), dn_s.append(s2)
            rep.rows.append(rows)
            _set_experts(layer, arch, Int4Experts.from_experts(ex, sch.act, (torch.stack(gu_p), torch.stack(gu_s)),
                                                               (torch.stack(dn_p), torch.stack(dn_s))))
            rep.experts_modules += 1
        # The next layer sees this layer's quantised outputs.
        batches = [(layer(_to(hs, dev), **_to(kw, dev)), kw) for hs, kw in batches]
