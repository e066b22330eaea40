"""One gate run: quantise every arm, score every text once, attach CIs, the lottery and the verdicts.

An arm is a quantised copy of the source: round-to-nearest (`rtn/...`), a dithered round-to-nearest re-pack
(`rtn/... lottery#s`, the rounding lottery) or a GPTQ pack from calibration draw s (`gptq/... draw#s`).
"""
from __future__ import annotations

import contextlib
import io
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..quantize import Scheme, model_arch, quantize_model
from . import stats
from .score import restrict, score_models
from .settings import check_settings
from .texts import IN_DOMAIN, TEXTS, Windows, calibration_ids, documents, split_ids, trained_context

DITHER = 0.1               # the lottery's dither amplitude, in units of the block scale


@dataclass(frozen=True)
class Arm:
    scheme: Scheme
    dither: float = 0.0     # > 0: a lottery ticket (dithered round-to-nearest)
    seed: int = 0           # the dither's seed, or the calibration draw's

    @property
    def kind(self) -> str:
        return "gptq" if self.scheme.scheme == "gptq" else "lottery" if self.dither else "rtn"

    @property
    def name(self) -> str:
        return self.scheme.name + {"gptq": f" draw#{self.seed}", "lottery": f" lottery#{self.seed}",
                                   "rtn": ""}[self.kind]

    @property
    def twin(self) -> str:
        """The round-to-nearest arm this one is compared with (itself for round-to-nearest)."""
        return Scheme("rtn", self.scheme.targets, self.scheme.act).name


def plan_arms(schemes=("rtn",), targets=("experts",), acts=("int8",), lottery: int = 4,
              calib_draws: int = 3, dither: float = DITHER) -> list[Arm]:
    """For each (targets, act): round-to-nearest, `lottery` dithered re-packs, and `calib_draws` GPTQ packs
    when "gptq" is among schemes (each calibrated on its own draw of the train split)."""
    for name, v, lo in (("lottery", lottery, 0), ("calib_draws", calib_draws, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    out = []
    for tg in targets:
        for a in acts:
            out.append(Arm(Scheme("rtn", tg, a)))
            out += [Arm(Scheme("rtn", tg, a), dither, s) for s in range(1, lottery + 1)]
            if "gptq" in schemes:
                out += [Arm(Scheme("gptq", tg, a), 0.0, s) for s in range(calib_draws)]
    return out


@contextlib.contextmanager
def quiet(on: bool = True):
    """Send library progress bars and warnings (lm-eval, transformers' weight loading) to nowhere."""
    if not on:
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def check_budget(budget) -> float:
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget > 0:
        raise ValueError(f"budget must be a positive relative change (0.01 = 1%), got {budget!r}")
    return float(budget)


def run_gate(model: str, arms: list[Arm], *, budget: float = 0.01, dtype=torch.float32, device: str = "cpu",
             device_map: str | None = None, max_memory: dict | None = None, texts=TEXTS,
             window: int | None = None, batch: int = 16,
             floor: bool = True, subset_stride: int = 4, floor_stride: int = 16, calib_tokens: int = 16384,
             calib_len: int | None = None, min_rows: int | None = None, damp: float = 0.01,
             calib_split: str = "train", n_boot: int = stats.N_BOOT, seed: int = 0, parity_steps: int = 4,
             max_docs: int | None = None, tasks=(), limit: int | None = None, progress: bool = True,
             loader=None) -> dict:
    """Score the source, the precision floor and every arm on every document of `texts`; the receipt payload.

    window: inputs per scoring window (default: the model's trained context). floor: also score the source
    in the other precision (bf16 for an fp32 source, else fp32) on every floor_stride-th document; reported,
    never used as a threshold. subset_stride: the lottery tickets and the calibration draws after the first
    score every subset_stride-th document (1: all), and gains / the lottery spread are measured there.
    calib_tokens / calib_len: GPTQ calibration set per draw (calib_len default: window), from calib_split.
    parity_steps > 0: the decode instrument's kernel-parity check on the first arm, over that many steps.
    max_docs: score only the first max_docs documents of each text (quick runs; None = all).
    tasks: lm-eval tasks to score as well (token-level perplexity from per-document log-likelihoods).
    device_map / max_memory: accelerate placement for checkpoint directories (see `load_model`).
    loader(dtype) -> (model, tokenizer, name) overrides `load_model` (tests).
    """
    check_settings(window=window, max_docs=max_docs, budget=budget, batch=batch, subset_stride=subset_stride,
                   floor_stride=floor_stride, n_boot=n_boot, parity_steps=parity_steps, limit=limit, texts=texts,
                   arms=arms)
    budget = check_budget(budget)
    if not arms:
        raise ValueError("arms must name at least one quantised arm")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arm names must be unique, got {names}")
    for t in texts:
        if t not in TEXTS:
            raise ValueError(f"texts must be among {TEXTS}, got {t!r}")
    from .models import check_max_memory, load_model
    check_max_memory(max_memory, device_map)
    _load = loader or (lambda dt: load_model(model, dt, device, device_map, max_memory))

    def load(dt):
        with quiet():
            return _load(dt)

    t0 = time.time()
    src, tok, name = load(dtype)
    arch = model_arch(src)
    L = window or trained_context(name, src.config)
    wins = {t: Windows(tok, documents(t)[:max_docs], L) for t in texts}
    subs = {t: w.subset(subset_stride) for t, w in wins.items()}
    floors = {t: w.subset(floor_stride) for t, w in wins.items()}
    # The verdict arms (round-to-nearest, the first calibration draw) score every document; the lottery and
    # the further calibration draws score every subset_stride-th one, as does each comparison among them.
    full = [a for a in arms if a.kind == "rtn" or (a.kind == "gptq" and a.seed == min(
        b.seed for b in arms if b.kind == "gptq" and b.scheme == a.scheme))]
    sub = [a for a in arms if a not in full]
    nb = {k: sum((len(w) + batch - 1) // batch for w in ws.values()) for k, ws in
          (("full", wins), ("sub", subs), ("floor", floors))}
    total = len(arms) + nb["full"] * (1 + len(full)) + (nb["sub"] * (1 + len(sub)) if sub else 0) + \
        (2 * nb["floor"] if floor else 0)
    bar = _bar(progress, total, f"gate {name}")

    info, models = {}, {}
    train = split_ids(tok, calib_split) if any(a.kind == "gptq" for a in arms) else None
    for a in arms:
        ta = time.time()
        m = load(dtype)[0]
        load_s = time.time() - ta
        calib = None
        if a.kind == "gptq":
            calib = calibration_ids(tok, calib_tokens, calib_len or L, seed=a.seed, stream=train)
        m, rep = quantize_model(m, a.scheme.scheme, a.scheme.targets, a.scheme.act, calib_ids=calib,
                                min_rows=min_rows, damp=damp, dither=a.dither, dither_seed=a.seed, progress=False)
        models[a.name] = m
        info[a.name] = {"kind": a.kind, "scheme": asdict(a.scheme), "dither": a.dither, "seed": a.seed,
                        "twin": a.twin, "scored": "every document" if a in full or subset_stride == 1 else
                        f"every {subset_stride}th document", "quant_report": rep.to_dict(),
                        "load_s": load_s, "quantise_s": time.time() - ta - load_s}
        bar.update()

    per_full = {t: score_models({"source": src, **{a.name: models[a.name] for a in full}}, w, batch, bar.update)
                for t, w in wins.items()}
    per_sub = {t: score_models({"source": src, **{a.name: models[a.name] for a in sub}}, w, batch, bar.update)
               for t, w in subs.items()} if sub else {}
    per_floor = {}
    if floor:
        fdt = torch.bfloat16 if dtype == torch.float32 else torch.float32
        fm = load(fdt)[0]
        per_floor = {t: score_models({"source": src, "floor": fm}, w, batch, bar.update) for t, w in floors.items()}
        del fm
    bar.close()
    sub_names = {a.name for a in sub}
    sub_docs = {t: np.unique(w.doc.numpy()) for t, w in subs.items()}

    def get(n, t, on_sub):
        if not on_sub:
            return per_full[t][n]
        return per_sub[t][n] if n in per_sub.get(t, {}) else restrict(per_full[t][n], sub_docs[t])

    def compare(a, ref, t, per=None):
        on_sub = a in sub_names or ref in sub_names or a.startswith("lottery-base:")
        a = a.removeprefix("lottery-base:")
        if per is not None:
            x, r, s = per[a], per[ref], per["source"]
        else:
            x, r, s = get(a, t, on_sub), get(ref, t, on_sub), get("source", t, on_sub)
        ci = stats.paired_ci(x.nll, r.nll, s.doc, kl=x.kl, top1=x.top1, n_boot=n_boot, seed=seed)
        ci["ppl"] = x.ppl
        return ci

    out_texts = {t: {"docs": w.docs, "windows": len(w), "tokens": w.tokens, "tokens_sha": w.sha,
                     "domain": "in" if t in IN_DOMAIN else "out", "source_ppl": per_full[t]["source"].ppl,
                     "subset_docs": subs[t].docs, "subset_tokens": subs[t].tokens}
                 for t, w in wins.items()}
    payload_arms = {}
    for a in arms:
        d = info[a.name]
        d["texts"] = {t: compare(a.name, "source", t) for t in texts}
        d["verdict"] = stats.verdict(d["texts"], budget)
        if a.kind != "rtn" and a.twin in models:
            # against the twin on the lottery's documents, so gains and the lottery spread share their tokens
            d["vs_twin"] = {t: compare("lottery-base:" + a.name, a.twin, t)["rel"] for t in texts}
        payload_arms[a.name] = d
    payload = {"model": name, "arch": arch, "source": model, "dtype": _dt(dtype), "device": device,
               "device_map": device_map, "max_memory": _jsonable(max_memory), "budget": budget,
               "settings": {"window": L, "batch": batch, "n_boot": n_boot, "level": stats.LEVEL, "seed": seed,
                            "bootstrap_unit": "document", "texts": list(texts), "calib_tokens": calib_tokens,
                            "calib_len": calib_len or L, "calib_split": calib_split,
                            "min_rows": min_rows if min_rows else "K (max(H, I))",
                            "min_rows_fallback": "round-to-nearest", "damp": damp,
                            "dither": sorted({a.dither for a in arms if a.dither}),
                            "threads": torch.get_num_threads(),
                            "subset_stride": subset_stride, "floor_stride": floor_stride, "max_docs": max_docs},
               "texts": out_texts, "arms": payload_arms}
    if floor:
        payload["floor"] = {"dtype": _dt(torch.bfloat16 if dtype == torch.float32 else torch.float32),
                            "scored": f"every {floor_stride}th document",
                            "note": "same weights in the other precision: arithmetic, not sampling; reported only",
                            "texts": {t: compare("floor", "source", t, per_floor[t]) for t in texts}}
    payload["lottery"] = _lottery(arms, payload_arms, texts, {
        a.name: {t: compare("lottery-base:" + a.name, "source", t)["rel"]["value"] for t in texts}
        for a in arms if a.kind == "rtn"})
    payload["calibration"] = _calibration(arms, payload_arms, payload["lottery"])
    if parity_steps:
        payload["parity"] = _parity(models[arms[0].name], tok, parity_steps)
    if tasks:
        from .lmeval import lmeval_gate
        with quiet():
            payload["lmeval"] = lmeval_gate({"source": src, **models}, tok, tasks, limit,
                                            L, n_boot, seed, budget)
    payload["seconds"] = time.time() - t0
    return payload


def _jsonable(max_memory):
    return None if not max_memory else {str(k): v for k, v in max_memory.items()}


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _bar(on, total, desc):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not on)


def _lottery(arms, payload_arms, texts, base_sub) -> dict:
    """Per round-to-nearest arm with dithered re-packs: each draw's relative change and the spread, all on
    the lottery's documents (base_sub: the round-to-nearest arms' changes restricted to them)."""
    out = {}
    for base in [a for a in arms if a.kind == "rtn"]:
        draws = [a.name for a in arms if a.kind == "lottery" and a.twin == base.name]
        if not draws:
            continue
        per_text = {}
        for t in texts:
            rels = [base_sub[base.name][t]] + [payload_arms[n]["texts"][t]["rel"]["value"] for n in draws]
            per_text[t] = {"rel": rels, "spread": stats.lottery_spread(rels)}
        out[base.name] = {"draws": draws, "dither": payload_arms[draws[0]]["dither"], "texts": per_text}
    return out


def _calibration(arms, payload_arms, lottery) -> dict:
    """Per calibrated scheme: each draw's gain over its round-to-nearest twin and the judgement."""
    out = {}
    for sname in dict.fromkeys(a.scheme.name for a in arms if a.kind == "gptq"):
        draws = [a for a in arms if a.kind == "gptq" and a.scheme.name == sname]
        twin = draws[0].twin
        entry = {"draws": [a.name for a in draws], "twin": twin,
                 "gains": [payload_arms[a.name].get("vs_twin") for a in draws]}
        if twin in lottery and len(draws) >= 3 and all(entry["gains"]):
            spread = {t: v["spread"] for t, v in lottery[twin]["texts"].items()}
            entry["judgement"] = stats.calibration_judgement(entry["gains"], spread)
        else:
            entry["judgement"] = {"verdict": "NOT JUDGED",
                                  "reasons": ["needs >= 3 calibration draws and the round-to-nearest twin's lottery"]}
        out[sname] = entry
    return out


def _parity(model, tok, steps) -> dict:
    from .decode import decode_windows, parity
    w = decode_windows(tok, documents("test")[0], windows=1, prompt=8, steps=steps)
    return parity(model, w, 8, kernels=True)
