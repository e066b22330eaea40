"""The perplexity gate: may this int4-b32 model ship?

    python -m int4lab.gate --model mixtral --scheme rtn gptq --targets experts --act int8
    python -m int4lab.gate --model /path/to/Mixtral-8x7B-v0.1 --device cuda --device-map auto ...

Shape legend: W = decode windows, P = prompt tokens, S = scored decode steps per window, V = vocabulary.

Each quantised arm is compared with the source model on fixed texts by two instruments:

1. lm-eval (`loglikelihood_rolling` over whole documents, a full forward per window): word and byte
   perplexity, bits per byte, on the local tasks in data/tasks/ (`int4lab_test`: held-out Shakespeare,
   in domain; `int4lab_ood`: King James Bible, out of domain) or any lm-eval task you name (`wikitext`
   where the machine has it). The model is evaluated in memory: `HFLM(pretrained=model, tokenizer=tok)`.
2. decode: teacher-forced, one token per forward through the KV cache — a prompt of P tokens, then S
   scored steps — so on CUDA the decode kernels (R = 1 rows) compute every scored logit. A full forward
   never reaches them; only this instrument tests them. Metrics: token perplexity, mean KL(source ‖ arm)
   of the next-token distributions, top-1 agreement.

The noise floor is the same source weights evaluated in bfloat16 and in float32 (`noise_dtype`): a
relative perplexity change no larger than that is reported as parity. The rule (`verdict`) is stated there. Arms that scored
different token streams (sha256 of the ids) are refused, never compared.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import math
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .paths import DATA, RECEIPTS
from .quantize import ACTS, LAYOUT, SCHEMES, TARGETS, Scheme, model_arch, quantize_model

TASKS_DIR = DATA / "tasks"
TEXTS = ("test", "ood")                          # decode instrument: corpus splits
IN_DOMAIN = {"test", "int4lab_test"}             # the calibration text's domain (Shakespeare); the rest is OOD
LOCAL_TASKS = {"int4lab_test": "test", "int4lab_ood": "ood"}
INSTRUMENTS = ("lmeval", "decode")
LMEVAL_METRIC = "word_perplexity"                # wikitext's headline number; the budget applies to it


# ----------------------------------------------------------------------------------------------------
# Texts

def documents(split: str, doc_chars: int = 4096) -> list[str]:
    """The corpus split cut at blank lines into documents of at least doc_chars characters (last may be short)."""
    from .corpus import load_split
    if not isinstance(doc_chars, int) or doc_chars <= 0:
        raise ValueError(f"doc_chars must be a positive int, got {doc_chars!r}")
    docs, cur = [], []
    n = 0
    for para in re.split(r"\n\s*\n", load_split(split)):
        cur.append(para)
        n += len(para) + 2
        if n >= doc_chars:
            docs.append("\n\n".join(cur))
            cur, n = [], 0
    if cur:
        docs.append("\n\n".join(cur))
    return docs


def token_sha(ids) -> str:
    """sha256 of a token stream (int64 little-endian), short form: arms that scored different ids differ here."""
    t = torch.as_tensor(ids, dtype=torch.int64).flatten().cpu().contiguous()
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def decode_windows(tok, text: str, windows: int, prompt: int, steps: int) -> torch.Tensor:
    """int64 [W, P + S + 1]: W windows spread evenly over the tokenised text."""
    for name, v in (("windows", windows), ("prompt", prompt), ("steps", steps)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    L = prompt + steps + 1
    if ids.numel() < L * windows:
        raise ValueError(f"text has {ids.numel()} tokens, fewer than windows * (prompt + steps + 1) = {L * windows}")
    starts = torch.linspace(0, ids.numel() - L, windows).long()
    return torch.stack([ids[s:s + L] for s in starts.tolist()])


def calibration_ids(tok, seqs: int, seq_len: int, split: str = "train") -> torch.Tensor:
    """int64 [seqs, seq_len] consecutive-token sequences spread evenly over a corpus split (default train)."""
    from .corpus import load_split
    text = load_split(split)
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    if ids.numel() < seqs * seq_len:
        raise ValueError(f"split {split!r} has {ids.numel()} tokens, fewer than seqs * seq_len = {seqs * seq_len}")
    starts = torch.linspace(0, ids.numel() - seq_len, seqs).long()
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])


# ----------------------------------------------------------------------------------------------------
# Instrument 2: teacher-forced decode through the KV cache

def _input_device(model):
    return model.get_input_embeddings().weight.device


@torch.no_grad()
def decode_logprobs(model, windows: torch.Tensor, prompt: int, progress: bool = False,
                    kernels: bool = False) -> torch.Tensor:
    """float32 [W, S, V] log-probabilities: prefill windows[:, :P], then one token per forward with the cache.

    Step i feeds token P + i and scores the prediction of token P + i + 1. On CUDA the quantised modules run
    the Triton kernels; kernels=True sends the scored steps of a CPU model through them as well (Triton's
    interpreter, `quantize.kernels_on_cpu`), so the decode kernels are what is scored even without a GPU.
    """
    from .quantize import kernels_on_cpu
    dev = _input_device(model)
    W, L = windows.shape
    S = L - prompt - 1
    out = []
    it = range(W)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="decode windows", leave=False)
    for w in it:
        ids = windows[w:w + 1].to(dev)
        past = model(input_ids=ids[:, :prompt], use_cache=True).past_key_values
        steps = []
        for i in range(S):
            with kernels_on_cpu(kernels):
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


def decode_metrics(logp: torch.Tensor, ref_logp: torch.Tensor, windows: torch.Tensor, prompt: int) -> dict:
    """Perplexity of the true next tokens, mean KL(ref ‖ arm) and top-1 agreement with ref, over all steps."""
    target = windows[:, prompt + 1:]                                       # [W, S]
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)              # [W, S]
    kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)                     # [W, S]
    top1 = (logp.argmax(-1) == ref_logp.argmax(-1)).float()
    return {"ppl": math.exp(nll.double().mean().item()), "nll": nll.double().mean().item(),
            "kl": kl.double().mean().item(), "top1": top1.mean().item(), "steps": int(target.numel()),
            "tokens_sha": token_sha(windows)}


# ----------------------------------------------------------------------------------------------------
# Instrument 1: lm-eval on the in-memory model

def lmeval_metrics(model, tok, tasks=tuple(LOCAL_TASKS), limit: int | None = None, batch_size: int = 4,
                   quiet: bool = False) -> dict:
    """{task: {word_perplexity, byte_perplexity, bits_per_byte, tokens_sha}} from lm_eval.simple_evaluate.

    Local tasks (data/tasks/) are scored over the first `limit` documents (all when None); their
    tokens_sha hashes the tokenised documents. Other tasks (e.g. "wikitext") need the dataset on disk.
    """
    import logging

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    for t in tasks:
        if not isinstance(t, str):
            raise TypeError(f"tasks must be lm-eval task names (str), got {t!r}")
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device=str(_input_device(model)))
    only_local = all(t in LOCAL_TASKS for t in tasks)
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=not only_local)
    with _quiet(quiet):
        res = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit, task_manager=tm,
                                      bootstrap_iters=0, log_samples=False, verbosity="ERROR")
    out = {}
    for t in tasks:
        r = res["results"][t]
        m = {k: float(r[f"{k},none"]) for k in ("word_perplexity", "byte_perplexity", "bits_per_byte")}
        if t in LOCAL_TASKS:
            docs = documents(LOCAL_TASKS[t])[:limit]                  # what data/tasks/int4lab_docs.py serves
            m["tokens_sha"] = token_sha([i for d in docs for i in tok(d)["input_ids"]])
            m["docs"] = len(docs)
        else:
            m["tokens_sha"] = None
        out[t] = m
    return out


@contextlib.contextmanager
def _quiet(on: bool):
    """Send library progress bars (lm-eval, datasets, transformers' weight loading) to nowhere."""
    if not on:
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield


# ----------------------------------------------------------------------------------------------------
# The rule

def verdict(rel: dict, budget: float = 0.01, noise: float = 0.0, calibrated: bool = False,
            gain: dict | None = None, in_domain=IN_DOMAIN) -> tuple[str, list[str]]:
    """("PASS" | "FAIL" | "PARITY", reasons) for one arm on one instrument.

    rel[text]  = ppl_arm / ppl_source - 1 (relative perplexity change; positive is worse).
    gain[text] = ppl_arm / ppl_uncalibrated_twin - 1 (calibrated arms only; negative means calibration helped).
    noise: the relative change the source itself shows between bfloat16 and float32 (>= 0).

    1. Any text worse than max(budget, noise) -> FAIL (for every format, calibrated or not).
    2. Uncalibrated: every |rel| <= noise -> PARITY, else PASS (within budget on every text).
    3. Calibrated: the improvement over round-to-nearest counts only if it is beyond the noise, has the
       same sign on at least two texts, one of them out of domain, and no text got worse -> PASS; every
       |gain| <= noise -> PARITY; anything else -> FAIL (calibration refused).
    """
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget > 0:
        raise ValueError(f"budget must be a positive relative change (0.01 = 1%), got {budget!r}")
    if not isinstance(noise, (int, float)) or isinstance(noise, bool) or not noise >= 0:
        raise ValueError(f"noise must be a non-negative relative change, got {noise!r}")
    if not rel:
        raise ValueError("rel must hold at least one text")
    for t, r in rel.items():
        if not math.isfinite(r):
            raise ValueError(f"rel[{t!r}] must be finite, got {r!r}")
    worse = {t: r for t, r in rel.items() if r > max(budget, noise)}
    if worse:
        return "FAIL", [f"{t}: perplexity {r:+.3%} is past the budget {budget:.2%}" for t, r in worse.items()]
    if not calibrated:
        if all(abs(r) <= noise for r in rel.values()):
            return "PARITY", [f"every text within the noise floor ±{noise:.3%}"]
        return "PASS", [f"every text within the budget {budget:.2%} (worst {max(rel.values()):+.3%})"]
    if gain is None or set(gain) != set(rel):
        raise ValueError("a calibrated arm needs gain (change vs its round-to-nearest twin) on the same texts as rel")
    return calibration_verdict(gain, noise, in_domain)


def calibration_verdict(gain: dict, noise: float = 0.0, in_domain=IN_DOMAIN) -> tuple[str, list[str]]:
    """Step 3 of `verdict` alone: did calibration beat round-to-nearest (whatever the budget says)?

    PASS: better beyond noise on >= 2 texts, one out of domain, worse on none; PARITY: every |gain| <= noise;
    FAIL: anything else (the improvement is not confirmed, so calibration is refused).
    """
    if not gain:
        raise ValueError("gain must hold at least one text")
    better = [t for t, g in gain.items() if g < -noise]
    hurt = [t for t, g in gain.items() if g > noise]
    ood_better = [t for t in better if t not in in_domain]
    if len(better) >= 2 and ood_better and not hurt:
        return "PASS", [f"calibration improves on {better} (out of domain: {ood_better}), beyond noise ±{noise:.3%}"]
    if not better and not hurt:
        return "PARITY", [f"calibration vs round-to-nearest inside the noise floor ±{noise:.3%} on every text"]
    why = [f"improvement not confirmed: better on {better}, worse on {hurt}; needs the same sign on >= 2 texts "
           f"including one out of domain"]
    return "FAIL", why


def combine(verdicts: dict) -> str:
    """One verdict from several instruments: any FAIL fails, else any PASS passes, else PARITY."""
    vs = [v for v, _ in verdicts.values()]
    return "FAIL" if "FAIL" in vs else "PASS" if "PASS" in vs else "PARITY"


def check_same_tokens(arms: dict) -> None:
    """Refuse (ValueError) arms whose scored token streams differ: {arm: {instrument: {text: {tokens_sha}}}}."""
    first = None
    for name, inst in arms.items():
        shas = {(i, t): m.get("tokens_sha") for i, texts in inst.items() for t, m in texts.items()}
        if first is None:
            first = (name, shas)
            continue
        for key in sorted(set(shas) | set(first[1])):
            ref, sha = first[1].get(key, "nothing"), shas.get(key, "nothing")
            if sha != ref:
                raise ValueError(f"arms {first[0]!r} and {name!r} scored different token streams on "
                                 f"{key[0]}/{key[1]} ({ref} vs {sha}): refusing to compare them")


# ----------------------------------------------------------------------------------------------------
# Models

def load_model(model: str, dtype=torch.bfloat16, device: str = "cpu", device_map: str | None = None):
    """(model, tokenizer, short name) for a tiny arch name (int4lab.models.ARCHS) or a checkpoint directory."""
    from .models import ARCHS
    if model in ARCHS:
        from .models import load_tiny, load_tokenizer
        # On the CPU the eager experts loop is several times faster than transformers' grouped_mm fallback.
        impl = "eager" if str(device) == "cpu" else None
        return load_tiny(model, dtype, device, experts_implementation=impl).eval(), load_tokenizer(), model
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {model!r} is neither a tiny model name {tuple(ARCHS)} nor an existing "
                                f"checkpoint directory")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    cfg = AutoConfig.from_pretrained(path)
    if cfg.model_type not in LAYOUT:
        raise ValueError(f"unsupported architecture {cfg.model_type!r} in {path}: int4lab handles {tuple(LAYOUT)}")
    kw = {"device_map": device_map} if device_map else {}
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    if not device_map:
        m = m.to(device)
    return m.eval(), AutoTokenizer.from_pretrained(path), path.name


def arm_name(s: Scheme) -> str:
    return s.name


def arms_for(schemes, targets, acts) -> list[Scheme]:
    """Every (scheme, targets, act) combination; a GPTQ arm brings its round-to-nearest twin (the rule needs it)."""
    out = []
    for sc in schemes:
        for tg in targets:
            for a in acts:
                for s in ([Scheme("rtn", tg, a)] if sc == "gptq" else []) + [Scheme(sc, tg, a)]:
                    if s not in out:
                        out.append(s)
    return out


# ----------------------------------------------------------------------------------------------------
# The gate

def run_gate(model: str, arms, *, instruments=INSTRUMENTS, budget: float = 0.01, dtype=torch.bfloat16,
             device: str = "cpu", device_map: str | None = None, tasks=tuple(LOCAL_TASKS),
             limit: int | None = None, batch_size: int = 4, windows: int = 4, prompt: int = 32, steps: int = 32,
             calib_seqs: int = 32, calib_len: int = 128, min_rows: int = 32, damp: float = 0.01,
             decode_kernels: bool = False, progress: bool = True, loader=None) -> dict:
    """Evaluate the source (in dtype, and in the other precision for the noise floor) and every quantised
    arm (quantised from the source in dtype); returns the receipt payload.

    arms: list of `Scheme`. loader(dtype) -> (model, tokenizer, name) overrides `load_model` (tests).
    decode_kernels: on a CPU model, score the quantised arms' decode steps through the Triton kernels in the
    interpreter (slow: use a short window); on CUDA the kernels run regardless.
    """
    instruments = tuple(instruments)
    for i in instruments:
        if i not in INSTRUMENTS:
            raise ValueError(f"instruments must be among {INSTRUMENTS}, got {i!r}")
    if not arms:
        raise ValueError("arms must name at least one quantised arm")
    verdict({"x": 0.0}, budget)                                      # validates budget early
    from .corpus import load_split
    _load = loader or (lambda dt: load_model(model, dt, device, device_map))

    def load(dt):
        with _quiet(not progress):
            return _load(dt)
    t0 = time.time()
    m, tok, name = load(dtype)
    arch = model_arch(m)
    texts = {t: load_split(t) for t in TEXTS}
    wins = {t: decode_windows(tok, texts[t], windows, prompt, steps) for t in TEXTS}
    calib = None
    if any(a.scheme == "gptq" for a in arms):
        calib = calibration_ids(tok, calib_seqs, calib_len)

    def evaluate(mod, kernels=False):
        res, lp = {}, {}
        if "lmeval" in instruments:
            res["lmeval"] = lmeval_metrics(mod, tok, tasks, limit, batch_size, quiet=not progress)
        if "decode" in instruments:
            lp = {t: decode_logprobs(mod, wins[t], prompt, kernels=kernels) for t in TEXTS}
        return res, lp

    src_res, src_lp = evaluate(m)
    if "decode" in instruments:
        src_res["decode"] = {t: decode_metrics(src_lp[t], src_lp[t], wins[t], prompt) for t in TEXTS}
    del m
    # The noise floor: the same weights in the other precision (float32 for a bf16/fp16 source, else bf16).
    noise_dtype = torch.bfloat16 if dtype == torch.float32 else torch.float32
    m2 = load(noise_dtype)[0]
    noise_res, noise_lp = evaluate(m2)
    del m2
    if "decode" in instruments:
        noise_res["decode"] = {t: decode_metrics(noise_lp[t], src_lp[t], wins[t], prompt) for t in TEXTS}
    noise = {}
    for inst in instruments:
        key = _ppl_key(inst)
        per = {t: noise_res[inst][t][key] / src_res[inst][t][key] - 1 for t in src_res[inst]}
        noise[inst] = {"per_text": per, "floor": max(abs(v) for v in per.values())}

    out_arms = {}
    it = arms
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(arms, desc=f"gate {name}")
    for s in it:
        ta = time.time()
        mq = load(dtype)[0]
        mq, rep = quantize_model(mq, s.scheme, s.targets, s.act, calib_ids=calib if s.scheme == "gptq" else None,
                                 min_rows=min_rows, damp=damp, progress=False)
        res, lp = evaluate(mq, decode_kernels)
        del mq
        if "decode" in instruments:
            res["decode"] = {t: decode_metrics(lp[t], src_lp[t], wins[t], prompt) for t in TEXTS}
        out_arms[s.name] = {"scheme": asdict(s), "quant_report": rep.to_dict(), "metrics": res,
                            "seconds": time.time() - ta}
    check_same_tokens({"source": src_res, "source_noise": noise_res,
                       **{k: a["metrics"] for k, a in out_arms.items()}})

    for k, a in out_arms.items():
        s = Scheme(**a["scheme"])
        a["rel"], a["gain"], a["verdict"] = {}, {}, {}
        for inst in instruments:
            key = _ppl_key(inst)
            rel = {t: a["metrics"][inst][t][key] / src_res[inst][t][key] - 1 for t in src_res[inst]}
            gain = None
            if s.scheme == "gptq":
                twin = out_arms[Scheme("rtn", s.targets, s.act).name]["metrics"][inst]
                gain = {t: a["metrics"][inst][t][key] / twin[t][key] - 1 for t in rel}
                a["gain"][inst] = gain
            a["rel"][inst] = rel
            a["verdict"][inst] = verdict(rel, budget, noise[inst]["floor"], s.scheme == "gptq", gain)
            if gain is not None:
                a.setdefault("calibration", {})[inst] = calibration_verdict(gain, noise[inst]["floor"])
        a["verdict_overall"] = combine(a["verdict"])
    return {"model": name, "arch": arch, "source": model, "dtype": str(dtype).replace("torch.", ""),
            "device": device, "device_map": device_map, "budget": budget, "instruments": list(instruments),
            "settings": {"tasks": list(tasks), "limit": limit, "batch_size": batch_size, "windows": windows,
                         "prompt": prompt, "steps": steps, "calib_seqs": calib_seqs, "calib_len": calib_len,
                         "min_rows": min_rows, "damp": damp, "lmeval_metric": LMEVAL_METRIC,
                         "decode_kernels": bool(decode_kernels) or str(device).startswith("cuda"),
                         "in_domain": sorted(IN_DOMAIN)},
            "noise_dtype": str(noise_dtype).replace("torch.", ""),
            "source_metrics": src_res, "source_noise_metrics": noise_res, "noise": noise, "arms": out_arms,
            "seconds": time.time() - t0}


def summary_rows(payload: dict) -> list[dict]:
    """One row per (arm, instrument, text) of a gate receipt: relative change, gain, KL, top-1, verdict."""
    rows = []
    for name, a in payload["arms"].items():
        for inst, rel in a["rel"].items():
            for t, r in rel.items():
                m = a["metrics"][inst][t]
                rows.append({"model": payload["model"], "arm": name, "scheme": a["scheme"]["scheme"],
                             "targets": a["scheme"]["targets"], "act": a["scheme"]["act"], "instrument": inst,
                             "text": t, "domain": "in" if t in IN_DOMAIN else "ood",
                             "ppl": m[_ppl_key(inst)], "rel": r, "noise": payload["noise"][inst]["floor"],
                             "gain_vs_rtn": a["gain"].get(inst, {}).get(t), "kl": m.get("kl"), "top1": m.get("top1"),
                             "verdict": a["verdict"][inst][0], "overall": a["verdict_overall"],
                             "calibration": a.get("calibration", {}).get(inst, (None,))[0]})
    return rows


def _ppl_key(inst: str) -> str:
    return LMEVAL_METRIC if inst == "lmeval" else "ppl"


def receipt_path(name: str) -> Path:
    return RECEIPTS / f"gate_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.json"


# ----------------------------------------------------------------------------------------------------
# CLI

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m int4lab.gate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a tiny model name (mixtral, olmoe, qwen3_moe) or a HF checkpoint dir")
    ap.add_argument("--scheme", nargs="+", choices=SCHEMES, default=["rtn"],
                    help="rtn = round-to-nearest (the baseline); gptq = calibrated on the train split, "
                         "minimising ||X(W - Ŵ)ᵀ||² per (layer, expert); a gptq arm brings its rtn twin")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=["experts"])
    ap.add_argument("--act", nargs="+", choices=ACTS, default=["int8"],
                    help="int8 = W4A8 (x quantised per 32: s = amax/127), bf16 = W4A16")
    ap.add_argument("--budget", type=float, default=0.01,
                    help="largest allowed relative perplexity increase ppl_q / ppl_source - 1 (default 0.01 = 1%%)")
    ap.add_argument("--instrument", nargs="+", choices=INSTRUMENTS, default=list(INSTRUMENTS))
    ap.add_argument("--tasks", nargs="+", default=list(LOCAL_TASKS),
                    help="lm-eval tasks; int4lab_* are local (data/tasks/), 'wikitext' needs the dataset cached")
    ap.add_argument("--limit", type=int, default=None, help="lm-eval documents per task (default: all)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--windows", type=int, default=4, help="decode windows per text")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens per decode window (not scored)")
    ap.add_argument("--steps", type=int, default=32, help="scored one-token decode steps per window")
    ap.add_argument("--decode-kernels", action="store_true",
                    help="on the CPU, score the decode steps through the Triton kernels in the interpreter "
                         "(slow; on CUDA the kernels are always used)")
    ap.add_argument("--calib-seqs", type=int, default=32)
    ap.add_argument("--calib-len", type=int, default=128)
    ap.add_argument("--min-rows", type=int, default=32,
                    help="an expert routed fewer calibration rows than this is packed round-to-nearest")
    ap.add_argument("--damp", type=float, default=0.01, help="GPTQ dampening, fraction of mean diag(H)")
    ap.add_argument("--dtype", choices=tuple(_DTYPES), default="bfloat16")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--device-map", default=None, help="accelerate device_map for checkpoints, e.g. auto")
    ap.add_argument("--out", default=None, help="receipt path (default data/receipts/gate_<model>.json)")
    args = ap.parse_args(argv)

    from .receipts import write_receipt
    torch.manual_seed(0)
    try:
        payload = run_gate(args.model, arms_for(args.scheme, args.targets, args.act), instruments=args.instrument,
                           budget=args.budget, dtype=_DTYPES[args.dtype], device=args.device,
                           device_map=args.device_map, tasks=args.tasks, limit=args.limit,
                           batch_size=args.batch_size, windows=args.windows, prompt=args.prompt, steps=args.steps,
                           calib_seqs=args.calib_seqs, calib_len=args.calib_len, min_rows=args.min_rows,
                           damp=args.damp, decode_kernels=args.decode_kernels)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = Path(args.out) if args.out else receipt_path(payload["model"])
    write_receipt(path, payload, command="python -m int4lab.gate " + " ".join(argv if argv is not None else sys.argv[1:]))
    for k, a in payload["arms"].items():
        print(f"{k:32s} {a['verdict_overall']:6s} " + "; ".join(f"{i}: {v[0]}" for i, v in a["verdict"].items()))
    print(f"receipt: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
