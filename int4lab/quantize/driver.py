"""`quantize_model`: swap a model's experts (and optionally attention) for int4-b32 modules.

Shape legend: E = experts, N = out features, K = in features, H = hidden size, I = expert intermediate
size, B = calibration sequences, T = tokens per sequence.

Three ways to choose the codes, all emitting the same int4-b32 bytes layout:
- round-to-nearest (scheme="rtn"), `format.pack_int4_b32`;
- dithered round-to-nearest (scheme="rtn", dither > 0): codes round(w / s + u), u uniform on [-dither, dither)
  from ticket dither_seed's counter-based stream, drawn on the weights' device (`dither.py`: the same bytes
  on every device) — a rounding that differs from round-to-nearest only where w / s sits near a half (a weight's error
  grows by at most dither times its block's scale). The gate re-packs with several seeds to measure how much
  perplexity moves under such small changes (the rounding lottery);
- GPTQ (scheme="gptq"), following IST-DASLab/gptq's sequential driver: capture the inputs of decoder layer 0;
  for each layer, hook every projection (`hessian.hessian_hooks`), run the layer, pack with GPTQ, swap the
  quantised modules in, then run the layer again so the next layer is calibrated on quantised outputs.
  Expert e's Hessian comes only from the rows the router sends to it; an expert with fewer than `min_rows`
  rows (default: K of its widest input, so its Hessians have full rank) is packed round-to-nearest instead,
  and the report lists it with its row count.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from .._checks import check_finite, check_k, check_module, check_positive_int, check_tensor
from ..format import BLOCK, block_scales, check_scale_range, pack_codes, pack_int4_b32
from .dither import DitherStream, dither_noise
from .hessian import attn_key, expert_key, hessian_hooks, shared_key
from .layout import (ATTN_PROJ, Scheme, attention, decoder_layers, experts_of, input_device, model_arch,
                     set_experts, shared_expert, shared_proj)
from .modules import Int4Experts, Int4Linear, check_experts_k, restored_on_failure
from .placement import expert_chunk, layer_device, onload, sync, to_device


@dataclass
class QuantReport:
    arch: str
    scheme: Scheme
    layers: int = 0
    experts_modules: int = 0
    shared_modules: int = 0                   # shared experts (dense MLPs beside the routed ones) quantised
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
    hessian_device: list = field(default_factory=list)   # per layer: where its Hessians accumulated (GPTQ)
    timing: list = field(default_factory=list)           # per layer: seconds per phase (see quantize_model)
    capture_s: float = 0.0                                # GPTQ: running the model up to layer 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["scheme"] = asdict(self.scheme)
        return d


def dithered_pack(w: torch.Tensor, dither: float, seed: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`pack_int4_b32` with the rounding dithered: codes round(w / s + u) clamped to [-8, 7], u uniform on
    [-dither, dither) (24-bit grid), element i of w taking element offset + i of ticket `seed`'s stream
    (`dither.dither_noise`, drawn on w's device); the same scales (amax / 7). w [..., N, K] float; returns
    (packed uint8, scales float16). ValueError for NaN or inf in w, as pack_int4_b32."""
    check_finite("w", w)
    s = block_scales(w)                                             # fp32 [..., N, K/32]
    check_scale_range(s)
    wb = w.float().reshape(*w.shape[:-1], -1, BLOCK)
    u = dither_noise(wb.numel(), seed, dither, offset, wb.device).reshape(wb.shape)
    q = torch.round((wb / s.unsqueeze(-1)).add_(u)).clamp_(-8, 7).to(torch.int8).reshape(w.shape)
    return pack_codes(q), s.to(torch.float16)


def _stream_pack(stream: DitherStream):
    """A packer that takes each tensor's noise from the next stretch of `stream` (packing order)."""
    def pack(w):
        p = dithered_pack(w, stream.dither, stream.seed, stream.position)
        stream.position += w.numel()
        return p
    return pack


def _progress(it, on, desc):
    if not on:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, leave=False)


def _swap_linears(parent, names, act, packers=None):
    for name in names:
        packer = None if packers is None else packers[name]
        setattr(parent, name, Int4Linear.from_linear(getattr(parent, name), act, packer))


def _swap_attn(attn, act, packers=None):
    _swap_linears(attn, ATTN_PROJ, act, packers)


def _swap_shared(layer, arch, act, packers) -> int:
    """Quantise a layer's shared expert (a dense MLP every token passes through) with the routed experts;
    its sigmoid gate, like the router, stays in full precision. Returns 1 when there was one, else 0."""
    names = shared_proj(layer, arch)
    if names:
        _swap_linears(shared_expert(layer, arch), names, act, packers)
    return int(bool(names))


def check_unquantised(name: str, model) -> None:
    """ValueError naming `name` when `model` already holds int4-b32 modules: packing reads the float
    weights (gate_up_proj, q_proj.weight), which quantisation replaced."""
    check_module(name, model)
    sch = getattr(model, "int4_scheme", None)
    if sch is not None or any(isinstance(m, (Int4Experts, Int4Linear)) for m in model.modules()):
        what = f" ({sch.name})" if sch is not None else ""
        raise ValueError(f"{name} is already quantised{what}: pass a fresh unquantised model (quantisation "
                         f"replaces the float weights it reads)")


def quantize_model(model, scheme: str = "rtn", targets: str = "experts", act: str = "int8", *,
                   calib_ids: torch.Tensor | None = None, min_rows: int | None = None, damp: float = 0.01,
                   blocksize: int = 128, batch_size: int = 8, lm_head: bool = False, dither: float = 0.0,
                   dither_seed: int = 0, progress: bool = True):
    """Quantise `model` in place onto int4-b32; returns (model, QuantReport).

    scheme "rtn" packs round-to-nearest (dithered when dither > 0: amplitude in units of the scale, seeded
    by dither_seed); "gptq" needs calib_ids (int64 [B, T]) and packs with `int4lab.gptq.gptq_pack_int4_b32`,
    calibrated layer by layer (see module docstring). Experts with fewer than min_rows routed calibration rows
    (default None: max(H, I), the K of their widest input) fall back to round-to-nearest, listed in the report.
    targets: "experts" (with a shared expert's projections, where the architecture has one) or "experts+attn".
    act: "int8" (W4A8) or "bf16" (W4A16). lm_head=True packs the lm_head round-to-nearest (never calibrated).
    The router (and a shared expert's gate) is never quantised.

    The report's `timing` holds one dict per layer, in seconds (synchronised on CUDA): round-to-nearest
    {"layer", "pack_s"}; GPTQ {"layer", "calib_s" (the hooked forward that fills the Hessians), "attn_pack_s",
    "experts_pack_s", "propagate_s" (the forward that feeds the next layer), "gptq_matrices" (expert
    matrices packed with GPTQ), "rtn_matrices"}. A layer's experts are packed in batches
    (`gptq_pack_int4_b32_experts`), as many experts at once as `expert_chunk` allows.
    """
    sch = Scheme(scheme, targets, act, lm_head)
    arch = model_arch(model)
    check_unquantised("model", model)
    if min_rows is not None and (not isinstance(min_rows, int) or isinstance(min_rows, bool) or min_rows < 1):
        raise ValueError(f"min_rows must be a positive int or None (= K), got {min_rows!r}")
    if not (isinstance(damp, (int, float)) and damp > 0):
        raise ValueError(f"damp must be a positive number, got {damp!r}")
    check_k("blocksize", blocksize, BLOCK)              # up front, whether or not an expert reaches GPTQ
    check_positive_int("batch_size", batch_size, " (calibration sequences per forward)")
    if not (isinstance(dither, (int, float)) and 0 <= dither <= 0.5):
        raise ValueError(f"dither must be a number in [0, 0.5] (units of the scale), got {dither!r}")
    if dither and scheme != "rtn":
        raise ValueError("dither applies to scheme='rtn' only (the rounding lottery)")
    if scheme == "gptq":
        check_tensor("calib_ids", calib_ids, (torch.int64,), (2,))
        if calib_ids.numel() == 0:
            raise ValueError("calib_ids must hold at least one token")
        vocab = model.get_input_embeddings().num_embeddings
        lo, hi = int(calib_ids.min()), int(calib_ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"calib_ids must lie in [0, vocab_size) = [0, {vocab}), got values in [{lo}, {hi}] "
                             f"(tokenised with another tokenizer?)")
        n_pos = getattr(model.config, "max_position_embeddings", None)
        if isinstance(n_pos, int) and calib_ids.shape[1] > n_pos:
            raise ValueError(f"calib_ids must hold sequences of at most max_position_embeddings = {n_pos} tokens "
                             f"(the positions the model has), got length {calib_ids.shape[1]}")
    elif calib_ids is not None:
        raise ValueError("calib_ids is only used by scheme='gptq'; pass None for round-to-nearest")
    rep = QuantReport(arch=arch, scheme=sch, min_rows=min_rows or 0, damp=damp if scheme == "gptq" else 0.0,
                      calib_tokens=0 if calib_ids is None else calib_ids.numel(), dither=float(dither),
                      dither_seed=dither_seed if dither else None)
    layers = decoder_layers(model)
    with restored_on_failure(model):               # a failure half-way leaves the float model, not a mix
        if scheme == "rtn":
            pack = _stream_pack(DitherStream(dither_seed, dither)) if dither else pack_int4_b32
            for li, layer in enumerate(_progress(layers, progress, "rtn pack")):
                _quantize_layer_rtn(layer, arch, sch, rep, pack, li)
        else:
            _quantize_gptq(model, layers, arch, sch, rep, calib_ids, min_rows, damp, blocksize, batch_size, progress)
        if lm_head:
            model.lm_head = Int4Linear.from_linear(model.lm_head, act)
            rep.lm_head = True
    rep.layers = len(layers)
    model.int4_scheme = sch
    return model, rep


def _pack_experts_rtn(w: torch.Tensor, pack, chunk: int | None = None):
    """Round-to-nearest pack of w [E, N, K] a few experts at a time: the float32 copy `pack` needs never
    holds the whole layer (Mixtral: 5.6 GB per layer in float32)."""
    E, N, K = w.shape
    chunk = chunk or expert_chunk(4 * 4 * N * K, w.device)          # w, w / s, the noise, scratch (float32)
    if chunk >= E:
        return pack(w.detach().float())
    parts = [pack(w[e:e + chunk].detach().float()) for e in range(0, E, chunk)]
    return torch.cat([p for p, _ in parts]), torch.cat([s for _, s in parts])


def _quantize_layer_rtn(layer, arch, sch, rep, pack, li=0):
    t0 = time.perf_counter()
    onload(layer)
    ex = experts_of(layer, arch)
    if ex is not None:
        check_experts_k(ex)
        # a few experts at a time; a dithered pack's stream runs on across the chunks in order
        gu = _pack_experts_rtn(ex.gate_up_proj, pack)
        dn = _pack_experts_rtn(ex.down_proj, pack)
        set_experts(layer, arch, Int4Experts.from_experts(ex, sch.act, gu, dn))
        rep.experts_modules += 1
        rep.shared_modules += _swap_shared(layer, arch, sch.act, {p: pack for p in shared_proj(layer, arch)})
    if sch.targets == "experts+attn":
        _swap_attn(attention(layer, arch), sch.act, {p: pack for p in ATTN_PROJ})
        rep.attn_modules += 1
    dev = layer_device(layer)
    sync(dev)
    rep.timing.append({"layer": li, "pack_s": time.perf_counter() - t0})


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
    dev = input_device(model)
    try:
        for b in range(0, calib_ids.shape[0], batch_size):
            try:
                model(input_ids=calib_ids[b:b + batch_size].to(dev), use_cache=False)
            except _Stop:
                pass
    finally:
        h.remove()
    return caught


def _hessian_bytes(layer, arch, attn: bool) -> int:
    """float32 bytes of every Hessian one layer's hooks accumulate (two per routed expert, q/k/v/o)."""
    n = 0
    ex = experts_of(layer, arch)
    if ex is not None:
        E, I2, H = ex.gate_up_proj.shape
        n += E * (H * H + (I2 // 2) ** 2)
        n += sum(getattr(shared_expert(layer, arch), p).in_features ** 2 for p in shared_proj(layer, arch))
    if attn:
        at = attention(layer, arch)
        n += sum(getattr(at, p).in_features ** 2 for p in ATTN_PROJ)
    return 4 * n


def _hessian_device(layer, arch, attn: bool, dev):
    """Where a layer's Hessians accumulate: on its GPU when they take at most a quarter of the free memory
    (no host round trip per batch), otherwise on the host (a small card still calibrates big experts)."""
    dev = torch.device(dev)
    if dev.type == "cuda" and _hessian_bytes(layer, arch, attn) <= torch.cuda.mem_get_info(dev)[0] // 4:
        return dev
    return torch.device("cpu")


def _pack_experts_gptq(w, accs, keys, cal, need_rtn, damp, blocksize):
    """int4-b32 of w [E, N, K]: GPTQ for the experts in `cal` (their Hessians accs[keys[e]]), batched as
    many at a time as the scratch budget allows; round-to-nearest for the experts in need_rtn."""
    from ..gptq import gptq_pack_int4_b32_experts
    E, N, K = w.shape
    dev = w.device
    packed = torch.empty(E, N, K // 2, dtype=torch.uint8, device=dev)
    scales = torch.empty(E, N, K // BLOCK, dtype=torch.float16, device=dev)
    # per expert: H, its damped copy, the factor and its inverse (K x K), the float32 weight and scratch (N x K)
    chunk = expert_chunk(4 * (4 * K * K + 4 * N * K), dev)
    for i in range(0, len(cal), chunk):
        ids = cal[i:i + chunk]
        idx = torch.tensor(ids, device=dev)
        Hs = torch.stack([accs[keys[e]].H.to(dev) for e in ids])
        p, sc = gptq_pack_int4_b32_experts(w.index_select(0, idx), Hs, damp=damp, blocksize=blocksize)
        del Hs
        packed[idx], scales[idx] = p, sc
    if need_rtn:
        idx = torch.tensor(need_rtn, device=dev)
        p, sc = _pack_experts_rtn(w.index_select(0, idx), pack_int4_b32)
        packed[idx], scales[idx] = p, sc
    return packed, scales


@torch.no_grad()
def _quantize_gptq(model, layers, arch, sch, rep, calib_ids, min_rows, damp, blocksize, batch_size, progress):
    from ..gptq import gptq_pack_int4_b32
    t0 = time.perf_counter()
    batches = capture_layer0_inputs(model, calib_ids, batch_size)
    rep.capture_s = time.perf_counter() - t0

    def gptq(w, acc):
        return gptq_pack_int4_b32(w.detach().float(), acc.H.to(w.device), damp=damp, blocksize=blocksize)

    attn = sch.targets == "experts+attn"
    for li, layer in enumerate(_progress(layers, progress, "gptq layers")):
        onload(layer)
        dev = layer_device(layer)
        ex = experts_of(layer, arch)
        hdev = _hessian_device(layer, arch, attn, dev)
        rep.hessian_device.append(str(hdev))
        t = {"layer": li}
        t0 = time.perf_counter()
        with hessian_hooks(model, layers=[li], attn=attn, device=hdev) as accs:
            for hs, kw in batches:
                layer(to_device(hs, dev), **to_device(kw, dev))
        sync(dev)
        t["calib_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if attn:
            _swap_attn(attention(layer, arch), sch.act,
                       {p: (lambda w, a=accs[attn_key(li, p)]: gptq(w, a)) for p in ATTN_PROJ})
            rep.attn_modules += 1
        sync(dev)
        t["attn_pack_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if ex is not None:
            E, I2, H = ex.gate_up_proj.shape
            need = min_rows or max(H, I2 // 2)
            rep.min_rows = need
            rows = []
            for e in range(E):
                a_gu = accs.get(expert_key(li, e, "gate_up"))
                rows.append(0 if a_gu is None else a_gu.nsamples)
            cal = [e for e in range(E) if rows[e] >= need]
            fb = [e for e in range(E) if rows[e] < need]
            rep.gptq_experts += len(cal)
            rep.fallback += [{"layer": li, "expert": e, "rows": rows[e]} for e in fb]
            gu = _pack_experts_gptq(ex.gate_up_proj, accs, {e: expert_key(li, e, "gate_up") for e in cal},
                                    cal, fb, damp, blocksize)
            dn = _pack_experts_gptq(ex.down_proj, accs, {e: expert_key(li, e, "down") for e in cal},
                                    cal, fb, damp, blocksize)
            rep.rows.append(rows)
            set_experts(layer, arch, Int4Experts.from_experts(ex, sch.act, gu, dn))
            rep.experts_modules += 1
            rep.shared_modules += _swap_shared(layer, arch, sch.act, {
                p: (lambda w, a=accs[shared_key(li, p)]: gptq(w, a)) for p in shared_proj(layer, arch)})
            t["gptq_matrices"], t["rtn_matrices"] = 2 * len(cal), 2 * len(fb)
        del accs
        sync(dev)
        t["experts_pack_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        # The next layer sees this layer's quantised outputs.
        batches = [(layer(to_device(hs, dev), **to_device(kw, dev)), kw) for hs, kw in batches]
        sync(dev)
        t["propagate_s"] = time.perf_counter() - t0
        rep.timing.append(t)
