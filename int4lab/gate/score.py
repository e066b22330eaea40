"""The statistical instrument: batched full forwards over every window, per-token figures for every arm.

Shape legend: b = windows in a forward, Lb = its longest window's inputs, V = vocabulary, t = scored tokens
of a forward, c = tokens of one statistics chunk, T = scored tokens of a text.

For each forward the source runs once; its logits stay on their device while every other model of the call
runs on the same windows (no [T, V] tensor is ever held, and none goes to the host). Per scored token, every
model gets
    nll   = -log p(true next token)                       (the perplexity is exp(mean nll))
and each model other than the source also
    kl    = KL(source ‖ model) = Σ_v p_src(v) (log p_src(v) - log p_model(v))
    top1  = whether its arg-max token is the source's.
The log-probabilities are float32 (log_softmax of the logits cast to float32), the KL's sum over the
vocabulary is accumulated in float64. They are computed where the logits are, c tokens at a time, with
c x V x 4 bytes x 4 live float32 tensors under `stat_bytes`; only the three per-token scalars leave the
device. `token_stats` is that computation on its own (tests compare it with the one-shot formula).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .texts import Windows

STAT_BYTES = 256 << 20          # float32 scratch of one statistics chunk (4 tensors of [c, V])
# Rows per decoded int4 weight from which an arm's scoring forward takes the prefill path (tensor cores) instead
# of the decode kernels: the rows sweep of data/receipts/prefill_h100.json suggests 512 on an H100, where the
# path ran at about 0.90x bf16's tokens/s (OLMoE) against 0.29x for the decode kernels. Only CUDA runs it (on a CPU the
# int4 modules take the torch reference path whatever the setting). None: scoring through the decode kernels.
SCORE_PREFILL_ROWS = 512


@dataclass
class PerToken:
    """float64 [T] nll, kl (zeros for the source), bool [T] top1, int64 [T] doc (document of each token)."""
    nll: np.ndarray
    kl: np.ndarray
    top1: np.ndarray
    doc: np.ndarray

    @property
    def ppl(self) -> float:
        return float(np.exp(self.nll.mean()))


@dataclass
class ScoreTiming:
    """Seconds of a scoring call: wall (`score_s`), inside model forwards (`forward_s`, synchronised; the
    first model's share in `source_forward_s`), and tokens the forwards computed (`inputs`, padding included)."""
    score_s: float = 0.0
    forward_s: float = 0.0
    source_forward_s: float = 0.0
    forwards: int = 0
    inputs: int = 0
    per_model_s: dict = field(default_factory=dict)

    def add(self, other: "ScoreTiming") -> None:
        for k in ("score_s", "forward_s", "source_forward_s", "forwards", "inputs"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k, v in other.per_model_s.items():
            self.per_model_s[k] = self.per_model_s.get(k, 0.0) + v

    def to_dict(self) -> dict:
        return {"score_s": self.score_s, "forward_s": self.forward_s, "source_forward_s": self.source_forward_s,
                "forwards": self.forwards, "inputs": self.inputs, "per_model_s": dict(self.per_model_s)}


def chunk_rows(V: int, stat_bytes: int = STAT_BYTES) -> int:
    """Tokens per statistics chunk: four float32 [c, V] tensors within stat_bytes (at least 1)."""
    if not isinstance(stat_bytes, int) or isinstance(stat_bytes, bool) or stat_bytes < 1:
        raise ValueError(f"stat_bytes must be a positive int, got {stat_bytes!r}")
    return max(1, stat_bytes // (16 * V))


@torch.no_grad()
def token_stats(logits: torch.Tensor, rows: torch.Tensor, tgt: torch.Tensor, ref: torch.Tensor | None = None,
                ref_top: torch.Tensor | None = None, stat_bytes: int = STAT_BYTES) -> dict:
    """Per-token figures of one model, on the logits' device, in chunks of `chunk_rows(V, stat_bytes)` tokens.

    logits [R, V] (any float dtype; R positions of a forward, padding included), rows int64 [t] (the scored
    positions), tgt int64 [t] (their true next tokens); ref [R, V] the source's logits of the same positions
    and ref_top int64 [t] its arg-max tokens (None for the source itself).
    Returns {"nll": float64 [t], "top": int64 [t] (arg-max token), "kl": float64 [t] (ref given),
    "top1": bool [t] (ref given)}, on the logits' device.
    """
    if logits.dim() != 2 or rows.dim() != 1 or tgt.shape != rows.shape:
        raise ValueError(f"logits must be [R, V], rows and tgt equal [t] vectors; got {tuple(logits.shape)}, "
                         f"{tuple(rows.shape)}, {tuple(tgt.shape)}")
    if (ref is None) != (ref_top is None) or (ref is not None and ref.shape != logits.shape):
        raise ValueError("ref and ref_top go together, ref with the logits' shape")
    dev = logits.device
    rows, tgt = rows.to(dev), tgt.to(dev)
    c = chunk_rows(logits.shape[1], stat_bytes)
    out = {k: [] for k in ("nll", "top", "kl", "top1")}
    for s in range(0, rows.numel(), c):
        r = rows[s:s + c]
        lp = torch.log_softmax(logits[r].float(), -1)                            # [c, V]
        out["nll"].append(-lp.gather(-1, tgt[s:s + c, None]).squeeze(-1).double())
        top = lp.argmax(-1)
        out["top"].append(top)
        if ref is not None:
            ref_lp = torch.log_softmax(ref[r].to(dev).float(), -1)              # [c, V]
            out["kl"].append((ref_lp.exp() * (ref_lp - lp)).sum(-1, dtype=torch.float64))
            out["top1"].append(top == ref_top[s:s + c].to(dev))
        del lp
    dtypes = {"nll": torch.float64, "top": torch.int64, "kl": torch.float64, "top1": torch.bool}
    keys = ("nll", "top") if ref is None else tuple(dtypes)
    return {k: torch.cat(out[k]) if out[k] else torch.zeros(0, dtype=dtypes[k], device=dev) for k in keys}


def _input_device(model):
    from ..quantize import input_device
    return input_device(model)


def _sync(dev) -> None:
    if torch.device(dev).type == "cuda":
        torch.cuda.synchronize(dev)


@torch.no_grad()
def score_models(models: dict, win: Windows, batch: int = 16, step=None, *, batch_tokens: int | None = None,
                 stat_bytes: int = STAT_BYTES, timing: ScoreTiming | None = None) -> dict[str, PerToken]:
    """{name: PerToken} for every model on every window (window order); the first model of `models` is the
    reference (the source) that kl and top1 compare with. Forwards hold windows of similar length
    (`Windows.batches(batch, batch_tokens)`), each trimmed to its longest window. step(): called once per
    (forward, model), for a progress bar. timing: a ScoreTiming to add this call's seconds to."""
    if not models:
        raise ValueError("models must hold at least the source")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    names = list(models)
    T = win.tokens
    out = {n: {"nll": np.zeros(T), "kl": np.zeros(T), "top1": np.ones(T, dtype=bool)} for n in names}
    doc = np.zeros(T, dtype=np.int64)
    off = win.offsets
    tm = ScoreTiming()
    t_call = time.perf_counter()
    for idx in win.batches(batch, batch_tokens):
        n = win.n[idx]
        Lb = int(n.max()) - 1
        ids = win.ids[idx, :Lb + 1]                                             # [b, Lb + 1]
        mask = torch.arange(Lb).unsqueeze(0) < (n - 1).unsqueeze(1)             # [b, Lb]
        rows = mask.flatten().nonzero().squeeze(1)                              # [t]
        tgt = ids[:, 1:].flatten()[rows]                                        # [t]
        pos = torch.cat([torch.arange(int(o), int(o) + int(k) - 1) for o, k in zip(off[idx], n)]).numpy()
        doc[pos] = win.doc[idx].repeat_interleave(n - 1).numpy()
        tm.inputs += ids.shape[0] * Lb
        ref = ref_top = None
        for name in names:
            m = models[name]
            dev = _input_device(m)
            _sync(dev)
            t0 = time.perf_counter()
            logits = m(input_ids=ids[:, :-1].to(dev), use_cache=False).logits
            _sync(logits.device)
            dt = time.perf_counter() - t0
            tm.forward_s += dt
            tm.forwards += 1
            tm.per_model_s[name] = tm.per_model_s.get(name, 0.0) + dt
            logits = logits.reshape(-1, logits.shape[-1])                       # [b * Lb, V]
            if ref is None:
                tm.source_forward_s += dt
                st = token_stats(logits, rows, tgt, stat_bytes=stat_bytes)
                ref, ref_top = logits, st["top"]
            else:
                st = token_stats(logits.to(ref.device), rows, tgt, ref, ref_top, stat_bytes)
                out[name]["kl"][pos] = st["kl"].cpu().numpy()
                out[name]["top1"][pos] = st["top1"].cpu().numpy()
            out[name]["nll"][pos] = st["nll"].cpu().numpy()
            del logits, st
            if step is not None:
                step()
        del ref, ref_top
    tm.score_s = time.perf_counter() - t_call
    if timing is not None:
        timing.add(tm)
    return {n: PerToken(v["nll"], v["kl"], v["top1"], doc.copy()) for n, v in out.items()}


def restrict(p: PerToken, docs) -> PerToken:
    """The tokens of p that belong to the given documents (in their original order)."""
    keep = np.isin(p.doc, np.asarray(docs))
    return PerToken(p.nll[keep], p.kl[keep], p.top1[keep], p.doc[keep])
