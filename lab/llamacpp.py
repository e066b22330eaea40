"""llama.cpp as an outside judge: score the same token ids with our model and with its GGUF in llama.cpp.

    python -m lab.llamacpp --model mixtral --scheme rtn gptq      # -> runs/llamacpp_mixtral.json (--out to name one)

Shape legend: W = windows, T = tokens per window (<= the trained context), V = vocabulary.

The test split is tokenised once (our tokenizer) and cut into W windows of T tokens, each <|bos|> then
T - 1 text tokens, so every text token is scored once, at most T - 1 positions from its window's start.
Both engines get exactly these ids (llama.cpp's own tokeniser is bypassed: `Llama.eval(ids)`), and
both are scored on the log-probability of each next token.

Arms:
  source  the unquantised model in float32 vs its F32 GGUF (validates the export: every op in F32,
          llama.cpp's KV cache set to F32 too, so only summation order differs);
  rtn/gptq the quantised model (W4A8: activations quantised per 32 to int8, float32 scale, each
          projection's output rounded to bf16) vs its Q4_0 GGUF (llama.cpp's CPU path quantises
          activations to Q8_0 per 32 with an fp16 scale and keeps float32 outputs).
For each arm: both perplexities, the relative difference with a paired bootstrap CI over windows,
the |delta log-prob| of the scored tokens (max, mean) and the top-1 agreement of the two engines.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from int4lab.paths import RUNS

WINDOW = 256                      # the models' trained context (lab.train)
BOOTSTRAP = 2000
# llama-cpp-python does not report the llama.cpp commit at run time (its build sees no git tree);
# the commit each release vendors is the one its CHANGELOG names.
LLAMA_CPP_COMMIT = {"0.3.36": "0c1e57098"}
INSTALL_HINT = "pip install -e '.[llama]'  (llama-cpp-python==0.3.36, builds llama.cpp from source)"


def have_llama_cpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def llama_provenance() -> dict:
    import llama_cpp
    v = llama_cpp.__version__
    return {"llama_cpp_python": v, "llama_cpp_commit": LLAMA_CPP_COMMIT.get(v, "unknown"),
            "llama_cpp_commit_source": "llama-cpp-python CHANGELOG for this version",
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}


# ----------------------------------------------------------------------------------------------------
# Token windows

def score_windows(tok, text: str, window: int = WINDOW, bos_id: int | None = None) -> torch.Tensor:
    """int64 [W, window]: <|bos|> + window - 1 consecutive tokens of `text`, W = tokens // (window - 1)."""
    if not isinstance(window, int) or isinstance(window, bool) or window < 2:
        raise ValueError(f"window must be an int >= 2, got {window!r}")
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    n = window - 1
    W = ids.numel() // n
    if W == 0:
        raise ValueError(f"text has {ids.numel()} tokens, fewer than window - 1 = {n}")
    bos = tok.bos_token_id if bos_id is None else bos_id
    body = ids[:W * n].reshape(W, n)
    return torch.cat([torch.full((W, 1), bos, dtype=torch.int64), body], dim=1)


# ----------------------------------------------------------------------------------------------------
# The two engines: log-probabilities [w, T - 1, V] (float64) for a chunk of windows

@torch.no_grad()
def ours_logprobs(model, windows: torch.Tensor) -> torch.Tensor:
    """Full forward of our (transformers) model; position t predicts token t + 1."""
    logits = model(input_ids=windows, use_cache=False).logits[:, :-1]
    return torch.log_softmax(logits.double(), -1)


class LlamaCppScorer:
    """One llama.cpp context over a GGUF file: F32 KV cache, no flash attention, logits for every position."""

    def __init__(self, gguf_path, window: int = WINDOW, threads: int | None = None):
        if not have_llama_cpp():
            raise ImportError(f"llama_cpp is not importable: {INSTALL_HINT}")
        import llama_cpp
        from llama_cpp import Llama
        self.window = window
        self.llm = Llama(model_path=str(gguf_path), n_ctx=window, n_batch=window, n_ubatch=window,
                         logits_all=True, flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32,
                         type_v=llama_cpp.GGML_TYPE_F32, n_threads=threads or os.cpu_count(),
                         n_threads_batch=threads or os.cpu_count(), verbose=False, vocab_only=False)

    def logprobs(self, windows: torch.Tensor) -> torch.Tensor:
        out = []
        for row in windows.tolist():
            if len(row) > self.window:
                raise ValueError(f"window of {len(row)} tokens exceeds the context {self.window}")
            self.llm.reset()
            self.llm.eval(row)
            scores = torch.from_numpy(np.array(self.llm.scores[:len(row) - 1], dtype=np.float64))
            out.append(torch.log_softmax(scores, -1))
        return torch.stack(out)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def close(self):
        self.llm.close()


# ----------------------------------------------------------------------------------------------------
# Comparison

def compare(model, scorer, windows: torch.Tensor, chunk: int = 8, variants=None) -> dict:
    """Per-window NLL of both engines, |delta log-prob| and top-1 agreement over every scored token.

    variants: {name: context manager factory}; each scores our model again inside that context against the
    same llama.cpp log-probabilities (used for `llamacpp_numerics`). Returns {"ours": stats, name: stats}.
    """
    import contextlib
    runs = {"ours": contextlib.nullcontext, **(variants or {})}
    target = windows[:, 1:]
    acc = {k: {"nll_ours": [], "dmax": 0.0, "dsum": 0.0, "vmax": 0.0, "agree": 0} for k in runs}
    nll_cpp = []
    for i in range(0, windows.shape[0], chunk):
        w = windows[i:i + chunk]
        t = target[i:i + chunk].unsqueeze(-1)
        b = scorer.logprobs(w)                                                     # [w, T-1, V]
        lb = b.gather(-1, t).squeeze(-1)                                          # [w, T-1]
        nll_cpp.append(-lb.mean(-1))
        for k, ctx in runs.items():
            with ctx():
                a = ours_logprobs(model, w)
            la = a.gather(-1, t).squeeze(-1)
            r = acc[k]
            r["nll_ours"].append(-la.mean(-1))
            d = (la - lb).abs()
            r["dmax"], r["dsum"] = max(r["dmax"], d.max().item()), r["dsum"] + d.sum().item()
            r["vmax"] = max(r["vmax"], (a - b).abs().max().item())
            r["agree"] += int((a.argmax(-1) == b.argmax(-1)).sum())
    n = target.numel()
    return {k: {"nll_ours": torch.cat(r["nll_ours"]), "nll_cpp": torch.cat(nll_cpp), "max_abs_dlogp": r["dmax"],
                "mean_abs_dlogp": r["dsum"] / n, "max_abs_dlogp_any_token": r["vmax"],
                "top1_agreement": r["agree"] / n, "tokens": n} for k, r in acc.items()}


# ----------------------------------------------------------------------------------------------------
# llama.cpp's activation numerics, emulated on our model (a diagnostic, not a format)

def q8_0_activations(x: torch.Tensor) -> torch.Tensor:
    """x [R, K] -> float32 [R, K] as ggml's CPU path sees it before a Q4_0 dot product: per 32, codes
    round-half-even(x * 127 / amax) and the scale d = amax / 127 stored in fp16 (ggml quantize_row_q8_0)."""
    K = x.shape[-1]
    xb = x.float().reshape(-1, K // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    d = (amax / 127).to(torch.float16).float()
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (torch.round(xb * inv).clamp(-127, 127) * d).reshape(x.shape)


@contextlib.contextmanager
def llamacpp_numerics():
    """Inside: our quantised modules compute as llama.cpp's CPU Q4_0 path does — activations through
    `q8_0_activations`, float32 projection outputs and a float32 expert combine (no bf16 rounding).
    The weights are untouched. CPU reference path only."""
    from int4lab import quantize as qz

    def matmul(x, packed, scales, act, w=None):
        N, K = packed.shape[0], packed.shape[1] * 2
        w = qz.dequant_int4_ref(packed, scales, N, K) if w is None else w
        return q8_0_activations(x) @ w.t()

    def experts_forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        wgu = self._decoded(self.gate_up_packed, self.gate_up_scales)             # fp32 [E, 2I, H]
        wdn = self._decoded(self.down_packed, self.down_scales)                   # fp32 [E, H, I]
        for e in torch.unique(top_k_index).tolist():
            tok, slot = torch.where(top_k_index == e)
            gate, up = (q8_0_activations(hidden_states[tok]) @ wgu[e].t()).chunk(2, dim=-1)
            y = q8_0_activations(self.act_fn(gate) * up) @ wdn[e].t()
            out.index_put_((tok,), (y * top_k_weights[tok, slot, None]).to(out.dtype), accumulate=True)
        return out

    mm = qz.Int4Linear.forward.__globals__["int4_matmul"].__globals__    # where int4_matmul finds its reference
    old_ref, old_fwd = mm["int4_matmul_ref"], qz.Int4Experts.forward
    mm["int4_matmul_ref"], qz.Int4Experts.forward = matmul, experts_forward
    try:
        yield
    finally:
        mm["int4_matmul_ref"], qz.Int4Experts.forward = old_ref, old_fwd


def paired_bootstrap(nll_a: torch.Tensor, nll_b: torch.Tensor, reps: int = BOOTSTRAP, seed: int = 0) -> dict:
    """Relative perplexity difference ppl_b / ppl_a - 1 over equal-size windows, with a 95% paired
    bootstrap CI (windows resampled with replacement, the same draw for both)."""
    if nll_a.shape != nll_b.shape or nll_a.dim() != 1 or nll_a.numel() < 2:
        raise ValueError("nll_a and nll_b must be 1-D tensors of the same length >= 2 (one NLL per window)")
    d = (nll_b - nll_a).double()
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, d.numel(), (reps, d.numel()), generator=g)
    boot = torch.exp(d[idx].mean(-1)) - 1
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return {"rel": math.exp(d.mean().item()) - 1, "ci95": [lo, hi], "reps": reps, "seed": seed,
            "windows": d.numel(), "ci_contains_zero": lo <= 0.0 <= hi}


def arm_result(cmp: dict) -> dict:
    """The receipt entry of one arm from `compare`'s output."""
    ppl_ours = math.exp(cmp["nll_ours"].double().mean().item())
    ppl_cpp = math.exp(cmp["nll_cpp"].double().mean().item())
    return {"ppl_ours": ppl_ours, "ppl_llamacpp": ppl_cpp, "diff": paired_bootstrap(cmp["nll_ours"], cmp["nll_cpp"]),
            **{k: cmp[k] for k in ("max_abs_dlogp", "mean_abs_dlogp", "max_abs_dlogp_any_token",
                                   "top1_agreement", "tokens")}}


# ----------------------------------------------------------------------------------------------------
# The judge

def judge(model: str, schemes=("rtn", "gptq"), targets: str = "experts", *, window: int = WINDOW,
          windows: int | None = None, threads: int | None = None, workdir=None, progress: bool = True) -> dict:
    """Receipt payload: the source arm and one arm per scheme, each scored by our model and by llama.cpp.

    windows: score this many windows spread evenly over the test split (None: all of them). Each quantised
    arm also scores our model under `llamacpp_numerics` against the same llama.cpp log-probabilities.
    """
    from int4lab.corpus import load_split
    from int4lab.export import build_model, write_gguf
    from int4lab.gate import token_sha
    t0 = time.time()
    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    wd = Path(workdir or tmp.name)
    arms = {}
    wins = tok_check = None
    total = 0
    for scheme in (None, *schemes):
        ta = time.time()
        m, tok, name = build_model(model, scheme, targets)
        if wins is None:
            wins = score_windows(tok, load_split("test"), window)
            total = wins.shape[0]
            if windows is not None and windows < total:
                wins = wins[torch.linspace(0, total - 1, windows).round().long()]
        label = "source" if scheme is None else f"{scheme}/{targets}/W4A8"
        path = write_gguf(m, wd / f"{name}-{label.replace('/', '-')}.gguf", name=f"{name}-{label}", force=True)
        scorer = LlamaCppScorer(path, window, threads)
        if tok_check is None:
            tok_check = tokenizer_agreement(tok, scorer, load_split("test")[:20000])
        variants = None if scheme is None else {"llamacpp_numerics": llamacpp_numerics}
        cmp = compare(m, scorer, wins, variants=variants)
        scorer.close()
        arms[label] = {**arm_result(cmp["ours"]), "gguf_bytes": path.stat().st_size}
        if variants:
            arms[label]["ours_with_llamacpp_numerics"] = arm_result(cmp["llamacpp_numerics"])
        arms[label]["seconds"] = time.time() - ta
        if progress:
            a = arms[label]
            print(f"{name} {label}: ppl ours {a['ppl_ours']:.4f}, llama.cpp {a['ppl_llamacpp']:.4f}, "
                  f"rel {a['diff']['rel']:+.2e} CI {a['diff']['ci95']}, max|dlogp| {a['max_abs_dlogp']:.2e}, "
                  f"mean {a['mean_abs_dlogp']:.2e}", flush=True)
        del m
    if tmp is not None:
        tmp.cleanup()
    return {"model": model, "llama": llama_provenance(), "split": "test", "window": window,
            "windows": int(wins.shape[0]), "windows_in_split": int(total),
            "tokens_scored": int(wins[:, 1:].numel()), "tokens_sha": token_sha(wins), "targets": targets,
            "tokenizer_check": tok_check, "arms": arms, "seconds": time.time() - t0}


def tokenizer_agreement(tok, scorer, text: str) -> dict:
    """Does llama.cpp's gpt-2 BPE tokenise the text to our ids? (Scoring bypasses it; a user's prompt does not.)"""
    ours = tok(text, add_special_tokens=False)["input_ids"]
    theirs = scorer.tokenize(text)
    return {"chars": len(text), "tokens_ours": len(ours), "tokens_llamacpp": len(theirs),
            "identical": list(ours) == list(theirs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.llamacpp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="mixtral | olmoe | qwen3_moe | a checkpoint directory")
    ap.add_argument("--scheme", nargs="+", default=["rtn", "gptq"], choices=["rtn", "gptq"])
    ap.add_argument("--targets", default="experts", choices=["experts", "experts+attn"])
    ap.add_argument("--window", type=int, default=WINDOW)
    ap.add_argument("--windows", type=int, default=None,
                    help="score N windows spread evenly over the test split (default: all, about 500)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None,
                    help="receipt path (default runs/llamacpp_<model>.json; data/receipts/ only when named here)")
    args = ap.parse_args(argv)
    if not have_llama_cpp():
        print(f"llama_cpp is not importable: {INSTALL_HINT}")
        return 2
    from int4lab._checks import check_out_path
    from int4lab.receipts import write_receipt
    out = args.out or RUNS / f"llamacpp_{Path(args.model).name}.json"
    try:
        check_out_path(out)                                  # before the judge runs, not after
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads or os.cpu_count())
    payload = judge(args.model, tuple(args.scheme), args.targets, window=args.window,
                    windows=args.windows, threads=args.threads)
    write_receipt(out, payload, command="python -m lab.llamacpp " + " ".join(sys.argv[1:] if argv is None else argv),
                  sources="llamacpp")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
