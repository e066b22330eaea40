"""Train a tiny MoE from random initialisation on the Shakespeare training split.

    python -m lab.train --arch all --time-budget 50 --steps 3000 --experts-impl grouped_mm  # H200, as committed
    python -m lab.train --arch mixtral --steps 3 --seq-len 32 --batch 2 \
        --train-tokens 5000 --eval-tokens 2000 --out /tmp/m --receipts /tmp/r          # CPU smoke run

Outputs go under runs/ (git-ignored) unless named: checkpoints to runs/models/<arch>/, the receipt to
runs/train_<arch>.json. The published ones (data/models/, data/receipts/) are rewritten only when --out /
--receipts name them. Every output path is checked before training starts, and a checkpoint directory is
replaced whole only once the new one is saved.

Objective: next-token cross-entropy + router_aux_loss_coef x the load-balancing loss (Switch-Transformer
style, computed by transformers from the router logits), AdamW, linear warm-up then cosine decay to a tenth
of the peak rate, bf16 autocast on CUDA (fp32 master weights), gradient clipping at 1.0.

Data: each split is one token stream, <|bos|> + the split's text (so exactly one BOS, at its start).
Training windows start at uniform random offsets. Evaluation scores every token of a stream exactly once,
in consecutive windows of --seq-len tokens, on the SAVED bf16 weights run in fp32 — the numbers a later
`load_tiny(arch)` reproduces. Perplexity = exp(mean NLL per token); bits per byte = total NLL / ln 2 / UTF-8
bytes of the text, which does not depend on the tokenizer. The unigram baseline predicts every token with
its add-one-smoothed frequency in the training stream; a model that learnt nothing beyond token frequencies
would score it.

Checkpoint selection: every --val-every steps the model is scored on the first --select-tokens tokens of
the validation stream (bf16 autocast on CUDA); the weights with the lowest such loss are the ones saved
(training this long on ~1.4M tokens can start to overfit). The selection peeks at validation, so the
receipt also reports the untouched test split and the out-of-domain text.

With --time-budget S, the step count is fixed after a short calibration (steps 5..25) as
min(--steps, S / seconds-per-step); the schedule is then cosine over that count. The receipt records it.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lab.paths import RUNS
from lab.provenance import write_receipt
from int4lab.models.checkpoints import load_tiny, model_dir
from int4lab.models.configs import ARCHS, check_arch, expert_shapes, tiny_config
from int4lab.models.tokenizer import TOKENIZER_DIR, load_tokenizer


def token_stream(text: str, tok) -> torch.Tensor:
    """[T] int64: <|bos|> followed by the text's tokens (no other special tokens)."""
    ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    return torch.tensor([tok.bos_token_id] + ids, dtype=torch.long)


def unigram_nll(train: torch.Tensor, target: torch.Tensor, vocab: int) -> float:
    """Total NLL (nats) of `target` under add-one-smoothed unigram frequencies of `train`."""
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    logp = counts.log() - counts.sum().log()
    return float(-logp[target].sum())


@torch.no_grad()
def stream_nll(model, stream: torch.Tensor, seq_len: int, batch: int, device) -> tuple[float, int]:
    """(total NLL in nats, tokens scored) for every token of stream[1:], windows of seq_len, fp32 logits."""
    n = stream.numel() - 1
    starts = list(range(0, n, seq_len))
    total = 0.0
    for i in range(0, len(starts), batch):
        chunk = starts[i:i + batch]
        full = [s for s in chunk if s + seq_len <= n]
        tail = [s for s in chunk if s + seq_len > n]  # at most one, shorter window at the very end
        for group, length in ((full, seq_len), *[([s], n - s) for s in tail]):
            if not group:
                continue
            x = torch.stack([stream[s:s + length] for s in group]).to(device)
            y = torch.stack([stream[s + 1:s + length + 1] for s in group]).to(device)
            logits = model(input_ids=x).logits.float()
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum"))
    return total, n


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, t))))


def _shown(path: Path) -> str:
    """A path relative to the repository root when it is inside it (receipts stay portable)."""
    from lab.paths import ROOT
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def train_one(arch: str, texts: dict, args, command: str) -> dict:
    """Train, save bf16 safetensors to <out>/<arch>/, evaluate the saved weights, write the receipt."""
    check_arch(arch)
    device = torch.device(args.device)
    tok = load_tokenizer(args.tokenizer)
    streams = {k: token_stream(v, tok) for k, v in texts.items()}
    train = streams["train"]
    if args.train_tokens:
        train = train[:args.train_tokens]
    if train.numel() < args.seq_len + 2:
        raise ValueError(f"--train-tokens gives {train.numel()} tokens, need more than --seq-len + 1")

    torch.manual_seed(args.seed)
    config = tiny_config(arch, vocab_size=len(tok))
    from transformers import AutoModelForCausalLM
    kwargs = {} if args.experts_impl is None else {"experts_implementation": args.experts_impl}
    model = AutoModelForCausalLM.from_config(config, **kwargs).to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    coef = config.router_aux_loss_coef
    gen = torch.Generator().manual_seed(args.seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")

    select = streams["validation"][:args.select_tokens + 1]
    best, best_state, best_step, val_curve = float("inf"), None, -1, []
    total, curve, pending = args.steps, [], []
    t0 = time.perf_counter()
    t_calib = None
    step = 0
    while step < total:
        if args.time_budget and step == 5:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_calib = time.perf_counter()
        if args.time_budget and step == 25:
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.perf_counter() - t_calib) / 20
            total = max(26, min(args.steps, int(args.time_budget / per_step)))
        starts = torch.randint(0, train.numel() - args.seq_len - 1, (args.batch,), generator=gen)
        x = torch.stack([train[s:s + args.seq_len] for s in starts]).to(device, non_blocking=True)
        y = torch.stack([train[s + 1:s + args.seq_len + 1] for s in starts]).to(device, non_blocking=True)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, args.lr, args.warmup)
        with autocast:
            out = model(input_ids=x, output_router_logits=True)
            ce = F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), y.reshape(-1))
            loss = ce + coef * out.aux_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        pending.append((step, ce.detach(), out.aux_loss.detach()))
        if step % args.log_every == 0 or step == total - 1:
            # One host sync per log interval, not per step.
            for s, c, a in pending:
                if s % args.log_every == 0 or s == total - 1:
                    curve.append([s, round(float(c), 4), round(float(a), 4)])
            pending = []
            print(f"{arch} step {step:5d}/{total}  ce {curve[-1][1]:.3f}  aux {curve[-1][2]:.3f}  "
                  f"{time.perf_counter() - t0:6.1f}s", flush=True)
        if args.val_every and (step % args.val_every == args.val_every - 1 or step == total - 1):
            model.eval()
            with autocast:
                nll, n = stream_nll(model, select, args.seq_len, args.eval_batch, device)
            model.train()
            val_curve.append([step, round(nll / n, 4)])
            if nll / n < best:
                best, best_step = nll / n, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        step += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    if best_state is not None:
        model.load_state_dict(best_state)

    out_dir = model_dir(arch, args.out)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{arch}.", suffix=".partial", dir=out_dir.parent))
    try:
        model.config.trained_context = args.seq_len   # the gate's longest window (int4lab.gate.trained_context)
        model.to(torch.bfloat16).save_pretrained(fresh)
        _replace_dir(fresh, out_dir)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    del model, opt

    # Evaluate what was saved: bf16 weights, fp32 compute.
    saved = load_tiny(arch, torch.float32, device, root=args.out, experts_implementation=args.experts_impl)
    evals = {}
    for split in ("validation", "test", "ood"):
        if split not in streams:
            continue
        s = streams[split][:args.eval_tokens + 1] if args.eval_tokens else streams[split]
        nll, n = stream_nll(saved, s, args.seq_len, args.eval_batch, device)
        text_bytes = len(tok.decode(s[1:].tolist()).encode("utf-8"))
        uni = unigram_nll(train, s[1:], len(tok))
        evals[split] = {"tokens": n, "bytes": text_bytes,
                        "ppl": round(math.exp(nll / n), 3), "bits_per_byte": round(nll / math.log(2) / text_bytes, 4),
                        "unigram_ppl": round(math.exp(uni / n), 3),
                        "unigram_bits_per_byte": round(uni / math.log(2) / text_bytes, 4)}
    val = evals["validation"]
    files = sorted(p for p in out_dir.iterdir() if p.is_file())
    stride = max(1, len(curve) // 200)
    payload = {
        "arch": arch,
        "model_class": type(saved).__name__,
        "params": n_params,
        "expert_shapes": expert_shapes(config),
        "config": saved.config.to_diff_dict(),
        "training": {"steps": total, "steps_requested": args.steps, "time_budget_s": args.time_budget,
                     "seq_len": args.seq_len, "batch": args.batch, "lr": args.lr, "warmup": args.warmup,
                     "weight_decay": args.weight_decay, "router_aux_loss_coef": coef, "seed": args.seed,
                     "experts_implementation": saved.config._experts_implementation,
                     "train_tokens": int(train.numel()), "tokens_seen": total * args.batch * args.seq_len,
                     "epochs": round(total * args.batch * args.seq_len / train.numel(), 2),
                     "autocast": "bf16" if device.type == "cuda" else "off (fp32)",
                     "wall_s": round(train_s, 1), "s_per_step": round(train_s / total, 4),
                     "selection": {"val_every": args.val_every, "select_tokens": int(select.numel() - 1),
                                   "selected_step": best_step if best_state is not None else total - 1}},
        "loss_curve": {"columns": ["step", "train_ce", "aux_loss"], "rows": curve[::stride] + (
            [curve[-1]] if curve and curve[::stride][-1] != curve[-1] else [])},
        "val_curve": {"columns": ["step", "val_ce_select"], "rows": val_curve},
        "eval": evals,
        "final_val_ppl": val["ppl"],
        "unigram_val_ppl": val["unigram_ppl"],
        "unigram_over_val_ppl": round(val["unigram_ppl"] / val["ppl"], 2),
        "eval_method": "saved bf16 weights in fp32; consecutive windows of seq_len, every token scored once",
        "checkpoint": {"dir": _shown(out_dir), "sha256": {p.name: sha256(p) for p in files},
                       "bytes": sum(p.stat().st_size for p in files)},
        "tokenizer_sha256": sha256(Path(args.tokenizer or TOKENIZER_DIR) / "tokenizer.json"),
        "train_stream_sha256": hashlib.sha256(train.numpy().tobytes()).hexdigest(),
    }
    if os.environ.get("INT4LAB_LAUNCH_COMMIT"):
        # Set by whoever launches on a machine without the git checkout (provenance's commit is then
        # 'unknown'): the commit of the checkout that was copied there.
        payload["launch_commit"] = os.environ["INT4LAB_LAUNCH_COMMIT"]
    path = Path(args.receipts) / f"train_{arch}.json"
    write_receipt(path, payload, command)
    print(f"{arch}: {total} steps in {train_s:.0f}s; val ppl {val['ppl']:.2f} (unigram {val['unigram_ppl']:.1f}), "
          f"{val['bits_per_byte']:.3f} bits/byte -> {path}", flush=True)
    return payload


def _replace_dir(fresh: Path, target: Path) -> None:
    """Put the directory `fresh` at `target`: a directory there is moved aside first and removed only once the new
    one stands (a failure in between leaves the old one under its own name)."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old / target.name)
    try:
        os.replace(fresh, target)
    except BaseException:
        if old is not None:
            os.replace(old / target.name, target)
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_outputs(args, archs) -> None:
    """Before any training: every receipt path and checkpoint directory this run writes is acceptable, and the
    tokenizer is there (ValueError / FileNotFoundError naming the flag)."""
    from int4lab.files import check_dir_path, check_out_path
    check_dir_path(args.receipts, flag="--receipts")
    check_dir_path(args.out, flag="--out")
    for arch in archs:
        check_out_path(Path(args.receipts) / f"train_{arch}.json", flag="--receipts")
        check_dir_path(model_dir(arch, args.out), flag="--out")
    tok = Path(args.tokenizer or TOKENIZER_DIR) / "tokenizer.json"
    if not tok.is_file():
        raise FileNotFoundError(f"--tokenizer: no tokenizer.json in {tok.parent}")


def main(argv=None) -> int:
    import sys

    from int4lab.corpus import load_split
    ap = argparse.ArgumentParser(prog="python -m lab.train", description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=ARCHS + ("all",), required=True)
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps (upper bound with --time-budget)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds of training per arch; steps = min(--steps, budget / calibrated s-per-step)")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per training and evaluation window")
    ap.add_argument("--batch", type=int, default=32, help="windows per optimizer step")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (cosine to 0.1x)")
    ap.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decay on matrices (not norms)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--experts-impl", default=None, choices=("eager", "grouped_mm", "batched_mm"),
                    help="transformers experts implementation (default: transformers' choice)")
    ap.add_argument("--train-tokens", type=int, default=0, help="use only the first N training tokens (0: all)")
    ap.add_argument("--eval-tokens", type=int, default=0, help="score only the first N tokens per split (0: all)")
    ap.add_argument("--eval-batch", type=int, default=32)
    ap.add_argument("--val-every", type=int, default=100,
                    help="score the selection slice every N steps and keep the best weights (0: keep the last)")
    ap.add_argument("--select-tokens", type=int, default=32768, help="validation tokens used for selection")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder (default data/tokenizer)")
    ap.add_argument("--out", type=Path, default=RUNS / "models",
                    help="checkpoints go to <out>/<arch>/ (default runs/models; data/models only when named here)")
    ap.add_argument("--receipts", type=Path, default=RUNS,
                    help="receipt goes to <receipts>/train_<arch>.json (default runs/; data/receipts only when named)")
    args = ap.parse_args(argv)
    for name in ("steps", "seq_len", "batch", "warmup", "log_every", "eval_batch"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.seq_len > 512:
        ap.error("--seq-len must be at most 512 (the configs' max_position_embeddings)")
    if not (math.isfinite(args.lr) and args.lr > 0):
        ap.error(f"--lr must be a positive finite learning rate, got {args.lr}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        ap.error(f"--weight-decay must be a finite number >= 0, got {args.weight_decay}")
    if args.time_budget is not None and not (math.isfinite(args.time_budget) and args.time_budget > 0):
        ap.error(f"--time-budget must be a positive number of seconds (or left out), got {args.time_budget}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        ap.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    archs = ARCHS if args.arch == "all" else (args.arch,)
    try:
        check_outputs(args, archs)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    command = "python -m lab.train " + " ".join(sys.argv[1:] if argv is None else argv)
    texts = {k: load_split(k) for k in ("train", "validation", "test", "ood")}
    for arch in archs:
        train_one(arch, texts, args, command)
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
