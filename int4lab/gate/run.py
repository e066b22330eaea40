"""One gate run: quantise every arm, score every arm on every document, attach CIs, the lottery and the verdicts.

The arms (`arms.py`) are built and scored in groups that fit the device; the source is scored with every
group, and its per-token figures from the first group are the reference (the largest difference of a later
group's source nll from them is recorded as `source_rerun` in the receipt; no tolerance is applied to it).
The payload's figures are built from per-token arrays on the host by `compare.py`.
"""
from __future__ import annotations

import contextlib
import io
import time
from dataclasses import asdict

import numpy as np
import torch

from ..quantize import input_device, model_arch, quantize_model
from ..quantize.prefill import prefill_rows
from . import stats
from .arms import DITHER, Arm, GroupSizer, copy_source, free_memory, logits_bytes, model_bytes, plan_arms
from .compare import assemble
from .score import SCORE_PREFILL_ROWS, STAT_BYTES, ScoreTiming, score_models
from .settings import check_settings
from .sources import TextSource, read_source, read_sources
from .split import SPLIT_SEED, split_documents
from .texts import TEXTS, Windows, calibration_ids, documents, split_ids, trained_context

BATCH_TOKENS = 8192        # default bound on b x longest window per forward

__all__ = ["BATCH_TOKENS", "DITHER", "Arm", "check_budget", "plan_arms", "quiet", "run_gate"]


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
             window: int | None = None, batch: int = 16, batch_tokens: int | None = BATCH_TOKENS,
             arms_per_group: int | None = None, stat_bytes: int = STAT_BYTES,
             floor: bool = True, floor_stride: int = 16, calib_tokens: int = 16384,
             calib_len: int | None = None, min_rows: int | None = None, damp: float = 0.01,
             calib_split: str = "train", calib_text=None, n_boot: int = stats.N_BOOT, seed: int = 0,
             split_seed: int = SPLIT_SEED,
             parity_steps: int = 4, prefill_min_rows: int | None = SCORE_PREFILL_ROWS,
             max_docs: int | None = None, tasks=(), limit: int | None = None, progress: bool = True,
             loader=None, on_arm=None, log=None) -> dict:
    """Score the source, the precision floor and every arm on every document of `texts`; the receipt payload.

    Every arm scores every document, so every comparison between arms is paired on the same tokens.
    window: inputs per scoring window (default: the model's trained context); a document shorter than it is
    one window of its own length. batch / batch_tokens: at most `batch` windows per forward and at most
    batch_tokens inputs (b x its longest window; windows are sorted by length, so padding is small:
    `texts[t]["padding"]`). stat_bytes: scratch of one chunk of the on-device statistics (`score.py`).
    arms_per_group: arms held on the device at once (None: as many as the free GPU memory allows; on a CPU
    all of them); the source is re-run per group. floor: also score the source in the other precision
    (bf16 for an fp32 source, else fp32) on every floor_stride-th document; reported, never a threshold.
    texts: the texts to score, each a source spec (`sources.py`: a corpus split name, a .txt or .jsonl file, or
    hf:NAME[:CONFIG]:SPLIT[:FIELD]) or a `sources.TextSource`; each is recorded with its sha256.
    calib_tokens / calib_len: GPTQ calibration set per draw (calib_len default: `calib_len_default`), from
    calib_split, or from the documents of calib_text (a source spec, as texts) when given.
    parity_steps > 0: the decode instrument's kernel-parity check on the first arm, over that many steps, beside
    the source's own cached-vs-full gap on the same windows (`decode.parity`).
    prefill_min_rows: on CUDA, the arms score through the prefill path from that many rows per decoded weight
    (`int4lab.quantize.prefill`; 0: always, None: the decode kernels only); on a CPU they take the torch
    reference path whatever it says. The source runs the torch path in `dtype` either way (float32 by default
    and in the published CPU receipts; bfloat16 by the CLI's default on CUDA).
    max_docs: score only the first max_docs documents of each text (quick runs; None = all).
    tasks: lm-eval tasks to score as well (token-level perplexity from per-document log-likelihoods).
    device_map / max_memory: accelerate placement for checkpoint directories (see `load_model`); arms are then
    loaded from disk, otherwise copied from the source on its device.
    loader(dtype) -> (model, tokenizer, name) overrides `load_model` (tests). on_arm(name, model): called
    with each arm once quantised (holding it keeps its memory). log(str): one line per phase.

    The payload: per text the source perplexity and padding; per arm its relative perplexity change against
    the source with a paired bootstrap CI over all documents, and over the development and held-out documents
    (`dev`, `held_out`; `split`, split_seed and `split.SPLIT_RULE`), KL and top-1 with CIs, the verdict
    (`stats.verdict`, on held-out documents) and, for tickets and GPTQ draws, the paired change against the
    round-to-nearest twin (`vs_twin`); the rounding band per text (`lottery`), the calibration test
    (`calibration`, rule `stats.CALIBRATION_RULE`), the arm chosen on development documents with its held-out
    verdict (`choice`, `split.CHOICE_RULE`),
    the groups, and `timing` (build, forwards, scoring, bootstrap; `score_over_forwards` = scoring wall time
    over the time inside its forwards).
    """
    sources = read_sources(texts)
    texts = list(sources)
    check_settings(window=window, max_docs=max_docs, budget=budget, batch=batch, floor_stride=floor_stride,
                   n_boot=n_boot, parity_steps=parity_steps, limit=limit, texts=list(sources.values()),
                   prefill_rows=prefill_min_rows,
                   calib_tokens=calib_tokens, calib_len=calib_len, min_rows=min_rows, damp=damp)
    budget = check_budget(budget)
    if not arms:
        raise ValueError("arms must name at least one quantised arm")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ValueError(f"arm names must be unique, got {names}")
    calib_src = calib_source(calib_text, arms)
    parts = {t: split_documents(list(s.docs)[:max_docs], t, split_seed) for t, s in sources.items()}
    GroupSizer(arms_per_group, "cpu", 0)                     # its checks, before anything is loaded
    if tasks:
        from .lmeval import check_tasks
        check_tasks(tasks)
    from .models import check_max_memory, load_model
    check_max_memory(max_memory, device_map)
    _load = loader or (lambda dt: load_model(model, dt, device, device_map, max_memory))
    say = log or (lambda msg: None)

    def load(dt):
        with quiet():
            return _load(dt)

    t0 = time.time()
    src, tok, name = load(dtype)
    load_source_s = time.time() - t0
    arch = model_arch(src)
    context = trained_context(name, src.config)
    check_settings(window=window, calib_len=calib_len, trained_context=context)     # the model's own limit
    L = window or context
    wins = {t: Windows(tok, list(s.docs)[:max_docs], L) for t, s in sources.items()}
    nb = sum(len(w.batches(batch, batch_tokens)) for w in wins.values())
    vocab = src.get_output_embeddings().weight.shape[0]
    dev = input_device(src)
    if torch.cuda.is_available() and (device_map is not None or dev.type == "cuda"):
        dev = torch.device("cuda", torch.cuda.current_device() if dev.type != "cuda" else dev.index or 0)
    sizer = GroupSizer(arms_per_group, dev, logits_bytes(min(batch_tokens or batch * L, batch * L), vocab,
                                                         torch.empty(0, dtype=dtype).element_size()))
    bar = _bar(progress, len(arms), f"gate {name}")
    say(f"source {name} loaded in {load_source_s:.1f} s; {sum(w.tokens for w in wins.values())} tokens in "
        f"{nb} forwards per model; window {L}")

    train = None
    if any(a.kind == "gptq" for a in arms):
        train = split_ids(tok, calib_split) if calib_src is None else document_ids(tok, calib_src.docs)
    calib_name = calib_split if calib_src is None else calib_src.spec
    info, per, groups, timing = {}, {t: {} for t in texts}, [], ScoreTiming()
    rerun = []
    parity = lm = None
    secs = {"build_s": 0.0, "parity_s": 0.0, "lmeval_s": 0.0}

    def build(a: Arm):
        ta = time.time()
        sizer.start_build()
        m = copy_source(src) if device_map is None else load(dtype)[0]
        load_s = time.time() - ta
        calib = None
        if a.kind == "gptq":
            calib = calibration_ids(tok, calib_tokens, calib_len or calib_len_default(L, calib_tokens), seed=a.seed,
                                    split=calib_name, stream=train)
        m, rep = quantize_model(m, a.scheme.scheme, a.scheme.targets, a.scheme.act, calib_ids=calib,
                                min_rows=min_rows, damp=damp, dither=a.dither, dither_seed=a.seed, progress=False)
        quantise_s = time.time() - ta - load_s
        info[a.name] = {"kind": a.kind, "scheme": asdict(a.scheme), "dither": a.dither, "seed": a.seed,
                        "twin": a.twin, "scored": "every document", "quant_report": rep.to_dict(),
                        "copy" if device_map is None else "load": "deepcopy of the source" if device_map is None
                        else "from disk (device_map)", "load_s": load_s, "quantise_s": quantise_s,
                        "group": len(groups), "bytes": model_bytes(m), **sizer.end_build()}
        secs["build_s"] += time.time() - ta
        if on_arm is not None:
            on_arm(a.name, m)
        bar.update()
        say(f"built {a.name} in {time.time() - ta:.1f} s (quantise {quantise_s:.1f} s)")
        return m

    def score_group(held: dict, why: str):
        nonlocal parity, lm
        g = len(groups)
        groups.append({"arms": list(held), "closed": why})
        bar.total += nb * (1 + len(held))
        bar.refresh()
        before = sizer.peaks.reset() if sizer.cuda else None
        ts = time.time()
        with contextlib.ExitStack() as stack:
            for m in held.values():
                stack.enter_context(prefill_rows(m, prefill_min_rows))
            got_t = {t: score_models({"source": src, **held}, w, batch, bar.update, batch_tokens=batch_tokens,
                                     stat_bytes=stat_bytes, timing=timing) for t, w in wins.items()}
        for t, got in got_t.items():
            if "source" in per[t]:
                rerun.append(float(np.abs(got["source"].nll - per[t]["source"].nll).max()))
            else:
                per[t]["source"] = got["source"]
            for n in held:
                per[t][n] = got[n]
        groups[-1]["score_s"] = time.time() - ts
        if before is not None:
            groups[-1]["gpu_score_peak_bytes"] = sizer.peaks.since(before)
            sizer.scored(groups[-1]["gpu_score_peak_bytes"])
        say(f"group {g}: {len(held)} arms scored in {groups[-1]['score_s']:.1f} s ({why})")
        if parity_steps and parity is None:
            tp = time.time()
            parity = _parity(held[arms[0].name], tok, parity_steps, src)
            secs["parity_s"] += time.time() - tp
        if tasks:
            from .lmeval import lmeval_gate, merge_lmeval
            tl = time.time()
            with quiet():
                lm = merge_lmeval(lm, lmeval_gate({"source": src, **held}, tok, tasks, limit, L, n_boot, seed,
                                                  budget))
            secs["lmeval_s"] += time.time() - tl

    held = {}
    for a in arms:
        held[a.name] = build(a)
        close, why = sizer.full(len(held))
        if close and a is not arms[-1]:
            score_group(held, why)
            held = {}
            free_memory()
    score_group(held, "last arms")
    held = {}
    free_memory()

    per_floor, floor_s = {}, 0.0
    if floor:
        tf = time.time()
        fdt = torch.bfloat16 if dtype == torch.float32 else torch.float32
        fm = load(fdt)[0]
        subs = {t: w.subset(floor_stride) for t, w in wins.items()}
        bar.total += 2 * sum(len(w.batches(batch, batch_tokens)) for w in subs.values())
        per_floor = {t: score_models({"source": src, "floor": fm}, w, batch, bar.update, batch_tokens=batch_tokens,
                                     stat_bytes=stat_bytes) for t, w in subs.items()}
        del fm
        free_memory()
        floor_s = time.time() - tf
        say(f"floor scored in {floor_s:.1f} s")
    bar.close()

    tb = time.time()
    payload = assemble(arms, info, per, per_floor, wins, budget, n_boot, seed, parts, split_seed)
    bootstrap_s = time.time() - tb
    padding = {t: w.padding(w.batches(batch, batch_tokens)) for t, w in wins.items()}
    for t, w in wins.items():
        payload["texts"][t]["padding"] = padding[t]
        payload["texts"][t]["source"] = sources[t].describe()
        if sources[t].kind != "corpus":
            payload["texts"][t]["domain"] = "user"
    seconds = time.time() - t0
    calib_fw = sum(sum(r.get("calib_s", 0) + r.get("propagate_s", 0) for r in d["quant_report"].get("timing", []))
                   + (d["quant_report"].get("capture_s") or 0) for d in info.values())
    fw = timing.forward_s + calib_fw
    payload.update({
        "model": name, "arch": arch, "source": model, "dtype": _dt(dtype), "device": device,
        "device_map": device_map, "max_memory": _jsonable(max_memory), "budget": budget,
        "settings": {"window": L, "batch": batch, "batch_tokens": batch_tokens, "stat_bytes": stat_bytes,
                     "arms_per_group": arms_per_group or "auto", "group_rule": sizer.rule,
                     "n_boot": n_boot, "level": stats.LEVEL, "seed": seed, "bootstrap_unit": "document",
                     "split_seed": split_seed, "verdict_on": "held-out documents",
                     "scored": "every arm on every document", "texts": list(texts),
                     "calib_tokens": calib_tokens, "calib_len": calib_len or calib_len_default(L, calib_tokens),
                     "calib_split": calib_split if calib_src is None else None,
                     "calib_text": None if calib_src is None else calib_src.describe(),
                     "min_rows": min_rows if min_rows else "K (max(H, I))",
                     "min_rows_fallback": "round-to-nearest", "damp": damp,
                     "dither": sorted({a.dither for a in arms if a.dither}), "threads": torch.get_num_threads(),
                     "floor_stride": floor_stride, "max_docs": max_docs,
                     "prefill_min_rows": prefill_min_rows if prefill_min_rows is not None else "off"},
        "groups": groups, "source_bytes": model_bytes(src), "gpu_peak_bytes": sizer.peaks.total(),
        "source_rerun": {"groups": len(groups), "max_abs_nll": max(rerun) if rerun else 0.0,
                         "note": "the source's per-token nll in later groups against the first group's"},
        "timing": {"load_source_s": load_source_s, **secs, "floor_s": floor_s, "bootstrap_s": bootstrap_s,
                   **timing.to_dict(), "calibration_forward_s": calib_fw,
                   "score_over_forwards": timing.score_s / timing.forward_s if timing.forward_s else None,
                   "gate_over_forwards": seconds / fw if fw else None,
                   "note": "score_s: the scoring loops' wall time; forward_s: inside their model forwards "
                           "(synchronised); calibration_forward_s: GPTQ's calibration and propagation forwards; "
                           "gate_over_forwards = seconds / (forward_s + calibration_forward_s)"}})
    if floor:
        payload["floor"]["dtype"] = _dt(torch.bfloat16 if dtype == torch.float32 else torch.float32)
        payload["floor"]["scored"] = f"every {floor_stride}th document"
    if parity is not None:
        payload["parity"] = parity
    if lm is not None:
        payload["lmeval"] = lm
    payload["seconds"] = seconds
    return payload


def calib_len_default(window: int, calib_tokens: int) -> int:
    """GPTQ's calibration sequence length when none is given: the scoring window, cut to calib_tokens so that
    one sequence fits the set (Qwen3-MoE's 40,960 and Mixtral's 32,768 trained contexts against the 16,384
    calibration tokens of the default)."""
    return min(window, calib_tokens) if calib_tokens >= 1 else window


def calib_source(calib_text, arms):
    """The calibration source of calib_text (None: the corpus train split); refused without a GPTQ arm."""
    if calib_text is None:
        return None
    if not any(a.kind == "gptq" for a in arms):
        raise ValueError("--calib-text: calibration text is read by GPTQ only; add --scheme gptq or drop it")
    return calib_text if isinstance(calib_text, TextSource) else read_source(calib_text, "--calib-text")


def document_ids(tok, docs) -> torch.Tensor:
    """int64 [n]: documents joined by blank lines as one token stream (a calibration source)."""
    return torch.tensor(tok("\n\n".join(docs), add_special_tokens=False, verbose=False)["input_ids"],
                        dtype=torch.int64)


def _jsonable(max_memory):
    return None if not max_memory else {str(k): v for k, v in max_memory.items()}


def _dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _bar(on, total, desc):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, disable=not on)


def _parity(model, tok, steps, source) -> dict:
    from .decode import decode_windows, parity
    w = decode_windows(tok, documents("test")[0], windows=1, prompt=8, steps=steps)
    return parity(model, w, 8, kernels=True, reference=source)
