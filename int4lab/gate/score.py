"""The statistical instrument: batched full forwards over every window, per-token figures for every arm.

Shape legend: b = windows in a batch, L = window inputs, V = vocabulary, T = scored tokens of a text.

For each batch the source runs once; its log-probabilities are reused by every arm in the same pass (so the
source is computed once per run, and no [T, V] tensor is ever held). Per scored token, every model gets
    nll   = -log p(true next token)                       (the perplexity is exp(mean nll))
and each model other than the source also
    kl    = KL(source ‖ model) of the next-token distributions
    top1  = whether its arg-max token is the source's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .texts import Windows


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


def _input_device(model):
    from ..quantize import input_device
    return input_device(model)


@torch.no_grad()
def score_models(models: dict, win: Windows, batch: int = 16, step=None) -> dict[str, PerToken]:
    """{name: PerToken} for every model on every window; the first model of `models` is the reference
    (the source) that kl and top1 compare with. step(): called once per (batch, model), for a progress bar."""
    if not models:
        raise ValueError("models must hold at least the source")
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    names = list(models)
    out = {n: {"nll": [], "kl": [], "top1": []} for n in names}
    mask_all = win.scored_mask()
    docs = []
    for b in range(0, len(win), batch):
        ids = win.ids[b:b + batch]
        mask = mask_all[b:b + batch]                                    # [b, L]
        tgt = ids[:, 1:][mask]                                          # [t]
        docs.append(win.doc[b:b + batch].unsqueeze(1).expand_as(mask)[mask])
        ref_lp = ref_p = ref_top = None
        for n in names:
            m = models[n]
            logits = m(input_ids=ids[:, :-1].to(_input_device(m)), use_cache=False).logits
            lp = torch.log_softmax(logits.float().cpu()[mask], -1)    # [t, V]
            out[n]["nll"].append(-lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).double())
            if ref_lp is None:
                ref_lp, ref_p, ref_top = lp, lp.exp(), lp.argmax(-1)
                out[n]["kl"].append(torch.zeros(len(tgt), dtype=torch.float64))
                out[n]["top1"].append(torch.ones(len(tgt), dtype=torch.bool))
            else:
                out[n]["kl"].append((ref_p * (ref_lp - lp)).sum(-1).double())
                out[n]["top1"].append(lp.argmax(-1) == ref_top)
            if step is not None:
                step()
    doc = torch.cat(docs).numpy()
    return {n: PerToken(*(torch.cat(v[k]).numpy() for k in ("nll", "kl", "top1")), doc) for n, v in out.items()}


def restrict(p: PerToken, docs) -> PerToken:
    """The tokens of p that belong to the given documents (in their original order)."""
    keep = np.isin(p.doc, np.asarray(docs))
    return PerToken(p.nll[keep], p.kl[keep], p.top1[keep], p.doc[keep])
