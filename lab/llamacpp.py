"""llama.cpp as an outside judge: score the same token ids with our model and with its GGUF in llama.cpp.

    python -m lab.llamacpp --model mixtral --scheme rtn gptq      # -> runs/llamacpp_mixtral.json (--out to name one)

Shape legend: W = windows, T = tokens per window (<= the trained context), V = vocabulary.

The test split is tokenised once (the model's tokenizer: this repository's for a small model, a checkpoint
directory's own for a directory) and cut into W windows of T tokens, each <|bos|> then
T - 1 text tokens, so when all windows are scored every text token except the last `tokens mod (T - 1)` is scored
once, at most T - 1 positions from its window's start (`--windows N` scores N of them, spread evenly).
Both engines get exactly these ids (llama.cpp's own tokeniser is bypassed: `Llama.eval(ids)`), and
both are scored on the log-probability of each next token.

Arms:
  source  the unquantised model in float32 vs its F32 GGUF (validates the export: every op in F32,
          llama.cpp's KV cache set to F32 too, so only float32 rounding differs: summation order and
          the engines' own elementwise functions, not separated);
  rtn/gptq the quantised model (W4A8: activations quantised per 32 to int8, float32 scale, each
          quantised projection's output, in these expert-only arms the experts' gate/up and down, and the MoE
          block's combined output rounded to bf16; attention stays float32) vs its Q4_0 GGUF
          (llama.cpp's CPU path quantises activations to Q8_0 per 32 with an fp16 scale, keeps the
          projection outputs and the expert combine in float32, and sums the int8 x int4 products in integers
          before scaling them. The rest of this note was read in ggml-org/ggml d99724f's x86 sources, not in
          the llama.cpp 0c1e57098 that llama-cpp-python 0.3.36 vendors, and was not measured: the whole
          32-product block in the repacked Q4_0 kernels, groups of four in the non-repacked
          `ggml_vec_dot_q4_0_q8_0`, each group then scaled and added in float. The experts' `MUL_MAT_ID` is
          served by one of these two, not recorded which; llamafile's sgemm and the AMX path take `MUL_MAT`
          only, so in these expert-only arms neither touches a Q4_0 weight).
For each arm: both perplexities, the relative difference with a paired bootstrap CI over documents,
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

from lab.paths import RUNS

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


def window_documents(tok, text: str, window: int, docs: list[str]) -> torch.Tensor:
    """int64 [W]: the document (index into `docs`, the text cut at blank lines as `int4lab.gate.documents` cuts it)
    in which each `score_windows(tok, text, window)` window's first text token starts. Documents are located in
    `text` by their first paragraph, tokens by the tokenizer's character offsets (a fast tokenizer)."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    starts, pos = [], 0
    for d in docs:
        first = d.split("\n\n", 1)[0]
        i = text.find(first, pos)
        if i < 0:
            raise ValueError("a document's first paragraph is not in the text: docs must be cut from this text")
        starts.append(i)
        pos = i + len(first)
    n = window - 1
    W = len(offsets) // n
    first_chars = torch.tensor([offsets[w * n][0] for w in range(W)], dtype=torch.int64)
    return torch.searchsorted(torch.tensor(starts, dtype=torch.int64), first_chars, right=True) - 1


# ----------------------------------------------------------------------------------------------------
# The two engines: log-probabilities [w, T - 1, V] (float64) for a chunk of windows

@torch.no_grad()
def ours_logprobs(model, windows: torch.Tensor) -> torch.Tensor:
    """Full forward of our (transformers) model; position t predicts token t + 1."""
    logits = model(input_ids=windows, use_cache=False).logits[:, :-1]
    return torch.log_softmax(logits.double(), -1)


KV_CACHES = ("f32", "f16")


class LlamaCppScorer:
    """One llama.cpp context over a GGUF file: no flash attention, logits for every position, and the KV cache in
    F32 (`kv_cache="f32"`, what every receipt uses) or in llama.cpp's default F16 (`"f16"`, to measure what the
    default changes). Nothing here fixes the kernel path: the installed build's compiled features and the CPU choose
    it (a receipt records the build's `system_info`), so the same command on another build or CPU may score
    differently."""

    def __init__(self, gguf_path, window: int = WINDOW, threads: int | None = None, kv_cache: str = "f32"):
        if not have_llama_cpp():
            raise ImportError(f"llama_cpp is not importable: {INSTALL_HINT}")
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {KV_CACHES}, got {kv_cache!r}")
        import llama_cpp
        from llama_cpp import Llama
        self.window = window
        kv = llama_cpp.GGML_TYPE_F32 if kv_cache == "f32" else llama_cpp.GGML_TYPE_F16
        self.llm = Llama(model_path=str(gguf_path), n_ctx=window, n_batch=window, n_ubatch=window,
                         logits_all=True, flash_attn=False, type_k=kv, type_v=kv, n_threads=threads or os.cpu_count(),
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
#
# Read in the llama.cpp sources that llama-cpp-python 0.3.36 vendors (llama.cpp 0c1e57098, its CHANGELOG says):
#   ggml/src/ggml-cpu/arch/x86/quants.c  quantize_row_q8_0, the `#if defined(__AVX2__) || defined(__AVX__)` branch:
#       maxScalar = amax of the 32-block; d = maxScalar / 127.f (float32); y.d = fp16(d);
#       id = maxScalar != 0 ? 127.f / maxScalar : 0 (float32); codes = _mm256_round_ps(x * id, _MM_ROUND_NEAREST)
#       (round half to even). Every x86 matmul of a Q4_0 weight (ggml_compute_forward_mul_mat and _mul_mat_id,
#       the llamafile sgemm path, the AMX path; the last two serve MUL_MAT only, never the experts' MUL_MAT_ID)
#       quantises its activation rows with it, and
#   ggml/src/ggml-cpu/arch/x86/repack.cpp  ggml_quantize_mat_q8_0_4x8 (the repacked Q4_0 path, 4 rows at a time)
#       applies the same rule ("Divided by 127.f to mirror results in quantize_row_q8_0").
#   ggml/src/ggml-quants.c  quantize_row_q8_0_ref (the scalar reference, for platforms without a SIMD branch and
#       for writing model files): d = amax / 127; id = d ? 1.0f / d : 0; codes = roundf(x * id) (half away from 0).
# So on x86 the codes are rint(x * (127 / amax)) in float32 and only the scale is stored in fp16: the decoded
# activation is code * fp16(amax / 127). Ours (`quant_x_rows_ref`): rint(x * (1 / (amax / 127 + 1e-12))), the
# scale kept in float32.

Q8_0_PATHS = ("x86", "ref")


def q8_0_codes(x: torch.Tensor, path: str = "x86") -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's Q8_0 activation quantiser on x [R, K] (K % 32 == 0): (codes int8 [R, K], d float16 [R, K/32]).

    path "x86": quantize_row_q8_0's AVX/AVX2 branch (what the llama.cpp CPU runs that wrote the receipts execute):
    d = amax / 127 and id = 127 / amax in float32, codes = round-half-even(x * id).
    path "ref": quantize_row_q8_0_ref's rule, id = 1 / d, codes = roundf(v) with v = x * id, emulated as
    sign(v) * floor(|v| + 0.5) in float32. That is roundf (half away from zero) at every |v| <= 127.5 but one:
    |v| = 0.5 - 2^-25, the largest float32 below one half, where |v| + 0.5 rounds up to 1.0 in float32, so this
    gives +-1 where roundf gives 0.
    Both store d = fp16(amax / 127). The module comment above cites the source lines."""
    if path not in Q8_0_PATHS:
        raise ValueError(f"path must be one of {Q8_0_PATHS}, got {path!r}")
    if x.dim() != 2 or x.shape[-1] % 32:
        raise ValueError(f"x must be [R, K] with K a multiple of 32, got shape {tuple(x.shape)}")
    R, K = x.shape
    xb = x.float().reshape(R, K // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    d = amax / 127.0                                                      # float32, as `maxScalar / 127.f`
    if path == "x86":
        inv = torch.where(amax > 0, 127.0 / torch.where(amax > 0, amax, torch.ones_like(amax)), torch.zeros_like(amax))
        q = torch.round(xb * inv)                                         # _MM_ROUND_NEAREST: half to even
    else:
        inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)), torch.zeros_like(d))
        v = xb * inv
        q = torch.sign(v) * torch.floor(v.abs() + 0.5)                     # roundf: half away from zero
    return q.clamp(-127, 127).to(torch.int8).reshape(R, K), d.squeeze(-1).to(torch.float16)


def q8_0_activations(x: torch.Tensor, path: str = "x86") -> torch.Tensor:
    """x [R, K] -> float32 [R, K] as ggml's CPU path sees it before a Q4_0 dot product: `q8_0_codes` decoded,
    code * float(fp16 d)."""
    q, d = q8_0_codes(x, path)
    R, K = x.shape
    return (q.float().reshape(R, K // 32, 32) * d.float().unsqueeze(-1)).reshape(R, K)


def ggml_q8_0(x: torch.Tensor, path: str = "x86") -> tuple[torch.Tensor, torch.Tensor]:
    """The installed llama.cpp's own Q8_0 quantiser on x [R, K], through ctypes: (codes int8 [R, K], d fp16
    [R, K/32]). path "x86" calls libggml-cpu's `quantize_row_q8_0` (the build's SIMD branch), "ref" libggml-base's
    `quantize_row_q8_0_ref`. Needs llama_cpp (the libraries ship with it)."""
    import ctypes
    if not have_llama_cpp():
        raise ImportError(f"llama_cpp is not importable: {INSTALL_HINT}")
    if path not in Q8_0_PATHS:
        raise ValueError(f"path must be one of {Q8_0_PATHS}, got {path!r}")
    if x.dim() != 2 or x.shape[-1] % 32:
        raise ValueError(f"x must be [R, K] with K a multiple of 32, got shape {tuple(x.shape)}")
    import llama_cpp
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    lib = ctypes.CDLL(str(lib_dir / ("libggml-cpu.so" if path == "x86" else "libggml-base.so")))
    if path == "x86":
        lib.ggml_cpu_init()
    fn = lib.quantize_row_q8_0 if path == "x86" else lib.quantize_row_q8_0_ref
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
    R, K = x.shape
    src = np.ascontiguousarray(x.float().numpy())
    out = np.zeros((R, K // 32, 34), dtype=np.uint8)                       # block_q8_0: fp16 d, int8 qs[32]
    for r in range(R):
        fn(src[r].ctypes.data, out[r].ctypes.data, K)
    d = torch.from_numpy(out[..., :2].copy().view(np.float16).reshape(R, K // 32))
    q = torch.from_numpy(out[..., 2:].copy().view(np.int8).reshape(R, K))
    return q, d


def _w4a8_activations(x: torch.Tensor) -> torch.Tensor:
    """Our W4A8 activations, decoded: `quant_x_rows_ref` codes times their float32 scale."""
    from int4lab.format import quant_x_rows_ref
    q, s = quant_x_rows_ref(x)
    R, K = x.shape
    return (q.float().reshape(R, K // 32, 32) * s.unsqueeze(-1)).reshape(R, K)


NUMERICS_ACTIVATIONS = ("q8_0", "ours")
NUMERICS_OUTPUTS = ("fp32", "bf16")


@contextlib.contextmanager
def llamacpp_numerics(activations: str = "q8_0", outputs: str = "fp32"):
    """Inside: our quantised modules compute with llama.cpp's CPU numerics, in part or whole. The weights are
    untouched; CPU reference path only.

    activations "q8_0": `q8_0_activations` (ggml's x86 rule: fp16 scale); "ours": `quant_x_rows_ref` (float32
    scale). outputs "fp32": each quantised projection's output and the expert combine stay float32, as ggml's are; "bf16":
    each rounded to bf16 as our kernels do. ("q8_0", "fp32") is llama.cpp's side in these two respects only: the
    matmuls still multiply dequantised values in float32 (ggml multiplies integer partial sums, per 32-product block
    or per four products depending on the kernel as read in ggml d99724f, by the product of the two fp16 scales),
    in torch's summation order, not ggml's; ("ours", "bf16") computes what our model computes without the
    context, bit for bit (tests/lab/test_llamacpp.py); the two mixed ones change one half at a time (which changes
    close the gap; mean |delta log p| does not split it into shares).
    """
    from int4lab import quantize as qz
    if activations not in NUMERICS_ACTIVATIONS or outputs not in NUMERICS_OUTPUTS:
        raise ValueError(f"activations must be one of {NUMERICS_ACTIVATIONS} and outputs one of {NUMERICS_OUTPUTS}, "
                         f"got {activations!r}, {outputs!r}")
    act_of = q8_0_activations if activations == "q8_0" else _w4a8_activations
    rounded = (lambda y: y.to(torch.bfloat16)) if outputs == "bf16" else (lambda y: y)     # noqa: E731

    def matmul(x, packed, scales, act, w=None):
        N, K = packed.shape[0], packed.shape[1] * 2
        w = qz.dequant_int4_ref(packed, scales, N, K) if w is None else w
        return rounded(act_of(x) @ w.t())

    def experts_forward(self, hidden_states, top_k_index, top_k_weights):
        R, k = top_k_index.shape
        wgu = self._decoded(self.gate_up_packed, self.gate_up_scales)             # fp32 [E, 2I, H]
        wdn = self._decoded(self.down_packed, self.down_scales)                   # fp32 [E, H, I]
        ys = hidden_states.new_zeros(R, k, hidden_states.shape[-1])             # [R, k, H]: one row per slot
        for e in torch.unique(top_k_index).tolist():
            if not 0 <= e < self.num_experts:
                continue
            tok, slot = torch.where(top_k_index == e)
            xe = hidden_states[tok]
            gate, up = rounded(act_of(xe) @ wgu[e].t()).to(xe.dtype).chunk(2, dim=-1)
            ys[tok, slot] = rounded(act_of(self.act_fn(gate) * up) @ wdn[e].t()).to(xe.dtype)
        valid = (top_k_index >= 0) & (top_k_index < self.num_experts)
        w = torch.where(valid, top_k_weights.to(ys.dtype), 0).unsqueeze(-1)
        out = (ys * w).sum(1)                                                   # slots in order, float32
        return rounded(out).to(hidden_states.dtype)

    mm = qz.Int4Linear.forward.__globals__["int4_matmul"].__globals__    # where int4_matmul finds its reference
    old_ref, old_fwd = mm["int4_matmul_ref"], qz.Int4Experts.forward
    mm["int4_matmul_ref"], qz.Int4Experts.forward = matmul, experts_forward
    try:
        yield
    finally:
        mm["int4_matmul_ref"], qz.Int4Experts.forward = old_ref, old_fwd


def paired_bootstrap(nll_a: torch.Tensor, nll_b: torch.Tensor, reps: int = BOOTSTRAP, seed: int = 0,
                     groups: torch.Tensor | None = None) -> dict:
    """Relative perplexity difference ppl_b / ppl_a - 1 over equal-size windows, with a 95% paired
    bootstrap CI: the gate's own (`int4lab.gate.stats.paired_ci`), whole groups resampled with replacement, the
    same draw for both; `groups` (int [W]) is the document of each window (None: each window its own group)."""
    from int4lab.gate.stats import paired_ci
    if nll_a.shape != nll_b.shape or nll_a.dim() != 1 or nll_a.numel() < 2:
        raise ValueError("nll_a and nll_b must be 1-D tensors of the same length >= 2 (one NLL per window)")
    groups = torch.arange(nll_a.numel()) if groups is None else torch.as_tensor(groups, dtype=torch.int64)
    if groups.shape != nll_a.shape:
        raise ValueError(f"groups must hold one id per window ({nll_a.numel()}), got shape {tuple(groups.shape)}")
    G = int(torch.unique(groups).numel())
    if G < 2:
        raise ValueError("the bootstrap needs at least 2 groups (documents)")
    ci = paired_ci(nll_b.double().numpy(), nll_a.double().numpy(), groups.numpy(), n_boot=reps, seed=seed,
                   p99=False)["rel"]
    return {"rel": ci["value"], "ci95": [ci["lo"], ci["hi"]], "reps": reps, "seed": seed,
            "windows": nll_a.numel(), "groups": G, "ci_contains_zero": ci["lo"] <= 0.0 <= ci["hi"]}


# Two engines are called equivalent on an arm when the paired 95 % CI of ppl_llama.cpp / ppl_ours - 1 lies inside
# +-EQUIV_MARGIN: a quarter of the gate's 1 % perplexity budget (chapter 04), so that an engine difference inside it
# is small next to the budget the arms are judged by. It was fixed after the first llama.cpp receipts had been
# read, so it is not a pre-registered margin; the CIs the receipts record are the measurement. A CI that contains 0
# but crosses the margin is no evidence of agreement. Nor is the margin small next to the quantisation effect itself:
# where our quantised model's ppl differs from our source model's by less than the margin, the verdict cannot tell
# llama.cpp reproducing the quantised model from it reproducing the unquantised one. The perplexities themselves
# can, on the windows scored: every arm scores the same ids, so a quantised arm's ppl_llamacpp reads directly against
# the source arm's ppl_ours, and against the emulation of llama.cpp's numerics (`ours_with_llamacpp_numerics`). What
# is not computed is a paired CI of llama.cpp against the source model (the receipts keep no per-window NLLs), which
# would bound that difference across documents.
EQUIV_MARGIN = 0.0025


def equivalent(diff: dict, margin: float = EQUIV_MARGIN) -> bool:
    """Whether a `paired_bootstrap` result's 95 % CI lies inside +-margin."""
    lo, hi = diff["ci95"]
    return -margin < lo and hi < margin


def arm_result(cmp: dict, groups: torch.Tensor | None = None) -> dict:
    """The receipt entry of one arm from `compare`'s output (`groups`: the document of each window)."""
    ppl_ours = math.exp(cmp["nll_ours"].double().mean().item())
    ppl_cpp = math.exp(cmp["nll_cpp"].double().mean().item())
    return {"ppl_ours": ppl_ours, "ppl_llamacpp": ppl_cpp,
            "diff": paired_bootstrap(cmp["nll_ours"], cmp["nll_cpp"], groups=groups),
            **{k: cmp[k] for k in ("max_abs_dlogp", "mean_abs_dlogp", "max_abs_dlogp_any_token",
                                   "top1_agreement", "tokens")}}


# ----------------------------------------------------------------------------------------------------
# The judge

# the two halves of llama.cpp's numerics, one at a time (`llamacpp_numerics`): the fp16 activation scale, and float32
# outputs (projections and expert combine together, not separated); which changes, alone and together, close the
# gap (not a split into shares)
DECOMPOSITION = {"llamacpp_numerics": ("q8_0", "fp32"),
                 "fp16_activation_scale_only": ("q8_0", "bf16"),
                 "fp32_outputs_only": ("ours", "fp32")}


def kv_cache_effect(path, windows: torch.Tensor, window: int = WINDOW, threads: int | None = None,
                    chunk: int = 8) -> dict:
    """What llama.cpp's default F16 KV cache changes against the F32 cache the receipts use, on one GGUF file:
    |delta log-prob| of the scored tokens (max, mean) and the top-1 agreement, F16 against F32 (per-token
    numbers only: no perplexity difference is recorded)."""
    cache = {kv: LlamaCppScorer(path, window, threads, kv_cache=kv) for kv in KV_CACHES}
    target = windows[:, 1:]
    dmax, dsum, agree = 0.0, 0.0, 0
    try:
        for i in range(0, windows.shape[0], chunk):
            w, t = windows[i:i + chunk], target[i:i + chunk].unsqueeze(-1)
            a, b = cache["f16"].logprobs(w), cache["f32"].logprobs(w)
            d = (a.gather(-1, t) - b.gather(-1, t)).abs()
            dmax, dsum = max(dmax, d.max().item()), dsum + d.sum().item()
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
    finally:
        for sc in cache.values():
            sc.close()
    n = target.numel()
    return {"max_abs_dlogp": dmax, "mean_abs_dlogp": dsum / n, "top1_agreement": agree / n, "tokens": n}


def gguf_vocabulary(model: str) -> Path | None:
    """The tokenizer directory the judge's GGUF files are written with, chosen as `python -m int4lab.export` chooses
    it: a checkpoint directory's own when it holds a tokenizer.json, None (this repository's) otherwise. Checked
    without loading any weights: ValueError when that tokenizer cannot be written (`read_tokenizer`'s rules) or its
    token count differs from config.json's vocab_size, the embedding rows (`write_gguf` would refuse the file)."""
    from int4lab.archs import arch_of
    from int4lab.export import read_tokenizer
    from int4lab.gate.models import load_config
    from int4lab.models import ARCHS, model_dir
    path = model_dir(model) if model in ARCHS else Path(model)
    tok_dir = path if model not in ARCHS and (path / "tokenizer.json").is_file() else None
    tok_path, *_, n_tokens = read_tokenizer(tok_dir)
    cfg = load_config(path)
    rows = arch_of(cfg).sizes(cfg)["vocab"]
    if rows != n_tokens:
        raise ValueError(f"--model {model!r}: config.json gives {rows} embedding rows (vocab_size) but the tokenizer "
                         f"its GGUF would carry ({tok_path}) has {n_tokens} tokens; llama.cpp sizes the embedding by "
                         "the token list, so they must match (convert a hub checkpoint with llama.cpp's "
                         "convert_hf_to_gguf.py)")
    return tok_dir


def judge(model: str, schemes=("rtn", "gptq"), targets: str = "experts", *, window: int = WINDOW,
          windows: int | None = None, threads: int | None = None, workdir=None, progress: bool = True) -> dict:
    """Receipt payload: the source arm and one arm per scheme, each scored by our model and by llama.cpp.

    windows: score this many windows spread evenly over the test split (None: all of them). The paired CIs
    resample documents (`window_documents`), not windows. Each quantised arm also scores our model under
    `llamacpp_numerics`, whole and in its two halves (`DECOMPOSITION`), against the same llama.cpp
    log-probabilities; the source arm also measures llama.cpp's default F16 KV cache against F32
    (`kv_cache_effect`). The GGUF files carry the vocabulary `gguf_vocabulary` names, checked before any model is
    built, so llama.cpp's tokeniser is checked against the tokenizer the windows were cut with.
    """
    from int4lab.corpus import load_split
    from int4lab.export import build_model, write_gguf
    from int4lab.gate import documents, token_sha
    t0 = time.time()
    tok_dir = gguf_vocabulary(model)
    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    wd = Path(workdir or tmp.name)
    arms = {}
    wins = tok_check = docs = None
    total = 0
    for scheme in (None, *schemes):
        ta = time.time()
        m, tok, name = build_model(model, scheme, targets)
        if wins is None:
            text = load_split("test")
            wins = score_windows(tok, text, window)
            docs = window_documents(tok, text, window, documents("test"))
            total = wins.shape[0]
            if windows is not None and windows < total:
                pick = torch.linspace(0, total - 1, windows).round().long()
                wins, docs = wins[pick], docs[pick]
        label = "source" if scheme is None else f"{scheme}/{targets}/W4A8"
        path = write_gguf(m, wd / f"{name}-{label.replace('/', '-')}.gguf", name=f"{name}-{label}", force=True,
                          tokenizer_dir=tok_dir)
        scorer = LlamaCppScorer(path, window, threads)
        if tok_check is None:
            tok_check = tokenizer_agreement(tok, scorer, load_split("test")[:20000])
        variants = None if scheme is None else {k: (lambda a=a, o=o: llamacpp_numerics(a, o))
                                                for k, (a, o) in DECOMPOSITION.items()}
        cmp = compare(m, scorer, wins, variants=variants)
        scorer.close()
        arms[label] = {**arm_result(cmp["ours"], docs), "gguf_bytes": path.stat().st_size}
        if variants:
            arms[label]["ours_with_llamacpp_numerics"] = arm_result(cmp["llamacpp_numerics"], docs)
            arms[label]["decomposition"] = {k: {f: cmp[k][f] for f in ("max_abs_dlogp", "mean_abs_dlogp",
                                                                        "top1_agreement")}
                                            for k in DECOMPOSITION}
        else:
            arms[label]["kv_cache_f16"] = kv_cache_effect(path, wins, window, threads)
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
            "documents": int(torch.unique(docs).numel()), "window_documents": docs.tolist(),
            "equivalence_margin": EQUIV_MARGIN,
            "tokens_scored": int(wins[:, 1:].numel()), "tokens_sha": token_sha(wins), "targets": targets,
            "tokenizer_check": tok_check, "arms": arms, "seconds": time.time() - t0}


def tokenizer_agreement(tok, scorer, text: str) -> dict:
    """Does llama.cpp's gpt-2 BPE tokenise the text to `tok`'s ids? (Scoring bypasses it; a user's prompt does not.)"""
    ours = tok(text, add_special_tokens=False)["input_ids"]
    theirs = scorer.tokenize(text)
    return {"chars": len(text), "tokens_ours": len(ours), "tokens_llamacpp": len(theirs),
            "identical": list(ours) == list(theirs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.llamacpp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="mixtral | olmoe | qwen3_moe | a checkpoint directory (its GGUF "
                    "files carry its own tokenizer.json if it has one; one with only tokenizer.model or vocab.json "
                    "gets this repository's vocabulary; one with no tokenizer is refused; the token count must equal "
                    "config.json's vocab_size)")
    ap.add_argument("--scheme", nargs="+", default=["rtn", "gptq"], choices=["rtn", "gptq"])
    ap.add_argument("--targets", default="experts", choices=["experts", "experts+attn"])
    ap.add_argument("--window", type=int, default=WINDOW)
    ap.add_argument("--windows", type=int, default=None,
                    help="score N windows spread evenly over the test split (default: all, about 500)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None,
                    help="receipt path (default runs/llamacpp_<model>.json; data/receipts/ only when named here)")
    args = ap.parse_args(argv)
    from int4lab.files import check_out_path
    from int4lab.gate.cli import model_name_and_context
    from lab.provenance import write_receipt
    out = args.out or RUNS / f"llamacpp_{Path(args.model).name}.json"
    try:                                                     # everything refusable, before the judge runs
        for flag, v, lo in (("--window", args.window, 2), ("--windows", args.windows, 1),
                            ("--threads", args.threads, 1)):
            if v is not None and v < lo:
                raise ValueError(f"{flag} must be an int >= {lo}, got {v}")
        model_name_and_context(args.model)
        gguf_vocabulary(args.model)                          # the vocabulary written, before any model is built
        check_out_path(out)
        if not have_llama_cpp():                             # last: a bad flag is named whether or not it is
            raise ValueError(f"llama_cpp is not installed: {INSTALL_HINT}")
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads or os.cpu_count())
    payload = judge(args.model, tuple(args.scheme), args.targets, window=args.window,
                    windows=args.windows, threads=args.threads)
    write_receipt(out, payload, command="python -m lab.llamacpp " + " ".join(sys.argv[1:] if argv is None else argv))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
