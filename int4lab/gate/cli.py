"""`python -m int4lab.gate`: quantise, score every document of the test and ood texts, print one table,
write the receipt: runs/gate_<model>.json (git-ignored) unless --out names a path, so a user's run never
replaces a committed receipt in data/receipts/. Every setting and the output path are checked before any
model loads (`settings.check_settings`, `files.check_out_path`)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

from ..files import check_out_path
from ..locations import RUNS
from ..quantize import ACTS, SCHEMES, TARGETS
from .arms import LOTTERY
from .models import parse_max_memory
from .settings import check_settings
from .run import BATCH_TOKENS, DITHER, check_budget, plan_arms, run_gate
from .score import SCORE_PREFILL_ROWS, STAT_BYTES
from .table import format_table
from .texts import TEXTS

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _rows(v: str):
    """--prefill-rows: "off" -> None, else a non-negative int (argparse turns the ValueError into a usage error)."""
    if v.strip().lower() == "off":
        return None
    n = int(v)
    if n < 0:
        raise ValueError(v)
    return n


def receipt_path(name: str) -> Path:
    """The default receipt of a run on model `name`: runs/gate_<name>.json (data/receipts/ only through --out)."""
    return RUNS / f"gate_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.json"


def model_name_and_context(model: str) -> tuple[str, int]:
    """(short name, trained context) of --model without loading its weights, from its config.json: a tiny
    model's (data/models/<name>/) or a checkpoint directory's (errors as load_model's)."""
    from ..models import ARCHS, model_dir
    from .models import load_config
    from .texts import trained_context
    if model in ARCHS:
        return model, trained_context(model, load_config(model_dir(model)))
    path = Path(model)
    if not path.is_dir():
        raise FileNotFoundError(f"--model {model!r} is neither a tiny model name {tuple(ARCHS)} nor an existing "
                                f"checkpoint directory")
    return path.name, trained_context(path.name, load_config(path, files=True))


def parser() -> argparse.ArgumentParser:
    from . import __doc__ as doc
    ap = argparse.ArgumentParser(prog="python -m int4lab.gate", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True,
                    help="a tiny model name (mixtral, olmoe, qwen3_moe) or a HF checkpoint dir")
    ap.add_argument("--scheme", nargs="+", choices=SCHEMES, default=["rtn"],
                    help="rtn = round-to-nearest (always run: the baseline); gptq adds --calib-draws GPTQ packs")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=["experts"])
    ap.add_argument("--act", nargs="+", choices=ACTS, default=["int8"],
                    help="int8 = W4A8 (x quantised per 32: s = amax/127), bf16 = W4A16")
    ap.add_argument("--budget", type=float, default=0.01,
                    help="largest allowed relative perplexity increase ppl_q / ppl_source - 1 (default 0.01 = 1%%)")
    ap.add_argument("--texts", nargs="+", default=list(TEXTS), metavar="SOURCE",
                    help=f"texts to score, each a corpus split {TEXTS}, a .txt file (documents separated by blank "
                         "lines), a .jsonl file (a \"text\" field per line) or hf:NAME[:CONFIG]:SPLIT[:FIELD] "
                         "(the datasets package and the hub); at least 20 documents each, 10 per development and "
                         "held-out half")
    ap.add_argument("--window", type=int, default=None,
                    help="inputs per scoring window (default: the model's trained context)")
    ap.add_argument("--batch", type=int, default=16, help="most windows per forward (windows sorted by length)")
    ap.add_argument("--batch-tokens", type=int, default=BATCH_TOKENS,
                    help="most inputs per forward, b x its longest window (bounds the [tokens, V] logits held)")
    ap.add_argument("--arms-per-group", type=int, default=None,
                    help="arms held on the device at once, the source re-run per group (default: as many as the "
                         "free GPU memory holds; on a CPU all)")
    ap.add_argument("--stat-bytes", type=int, default=STAT_BYTES,
                    help="scratch bytes of one chunk of the on-device statistics (4 float32 [tokens, V] tensors)")
    ap.add_argument("--lottery", type=int, default=LOTTERY,
                    help=f"dithered round-to-nearest re-packs (default {LOTTERY}; 0: none)")
    ap.add_argument("--dither", type=float, default=DITHER, help="lottery dither amplitude, units of the scale")
    ap.add_argument("--calib-draws", type=int, default=3, help="GPTQ packs, each on its own calibration draw")
    ap.add_argument("--calib-tokens", type=int, default=16384, help="calibration tokens per draw (train split)")
    ap.add_argument("--calib-text", default=None, metavar="SOURCE",
                    help="GPTQ calibration text, a source as --texts takes (default: the corpus train split)")
    ap.add_argument("--calib-len", type=int, default=None, help="calibration sequence length (default: the scoring window, at most --calib-tokens)")
    ap.add_argument("--min-rows", type=int, default=None,
                    help="an expert routed fewer calibration rows is packed round-to-nearest (default: K)")
    ap.add_argument("--damp", type=float, default=0.01, help="GPTQ dampening, fraction of mean diag(H)")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    ap.add_argument("--floor-stride", type=int, default=16, help="the precision floor scores every n-th document")
    ap.add_argument("--max-docs", type=int, default=None, help="first n documents per text only (quick runs)")
    ap.add_argument("--no-floor", action="store_true", help="skip the bf16-vs-fp32 precision floor")
    ap.add_argument("--parity-steps", type=int, default=4,
                    help="decode steps of the kernel-parity check (0: skip; Triton's interpreter on a CPU)")
    ap.add_argument("--prefill-rows", type=_rows, default=SCORE_PREFILL_ROWS, metavar="N|off",
                    help="arms score through the prefill path from N rows per decoded weight (0: always; off: the "
                         f"decode kernels only; default {SCORE_PREFILL_ROWS}, the H100 rows sweep's suggestion)")
    ap.add_argument("--tasks", nargs="+", default=[],
                    help="lm-eval tasks to score too, e.g. wikitext (token-level perplexity per document)")
    ap.add_argument("--limit", type=int, default=None, help="lm-eval documents per task (default: all)")
    ap.add_argument("--dtype", choices=tuple(_DTYPES), default=None,
                    help="source precision (default float32 on a CPU, bfloat16 on CUDA)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--device-map", default=None, help="accelerate device_map for checkpoints, e.g. auto")
    ap.add_argument("--max-memory", nargs="+", default=None, metavar="DEVICE=SIZE",
                    help="accelerate max_memory with --device-map, e.g. 0=20GiB cpu=100GiB (forces a GPU/CPU split)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out", default=None,
                    help="receipt path (default runs/gate_<model>.json; data/receipts/ only when named here)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--log", action="store_true",
                    help="one line per phase on stderr (source loaded, each arm built, each group scored, floor)")
    return ap


def check_extra_flags(words, base=(), *, flag: str = "--gate-args",
                      fixed=("model", "out", "device", "device_map", "max_memory")) -> argparse.Namespace:
    """Gate flags a driver passes through (words: a list, or one string split as shell words; after its own
    `base` flags): ValueError naming `flag` unless they parse, leave the `fixed` settings (the driver's own)
    alone, and pass `check_settings`."""
    import contextlib
    import io
    import shlex

    if isinstance(words, str):
        try:
            words = shlex.split(words)
        except ValueError as e:
            raise ValueError(f"{flag}: must split as shell words ({e}): {words!r}") from None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            g = parser().parse_args(["--model", "x", *base, *words])
    except SystemExit:
        raise ValueError(f"{flag}: not flags the gate takes: {' '.join(words)!r}") from None
    ref = parser().parse_args(["--model", "x", *base])
    own = [k for k in fixed if getattr(g, k) != getattr(ref, k)]
    if own:
        raise ValueError(f"{flag}: may not set --{', --'.join(k.replace('_', '-') for k in own)}: the driver sets "
                         f"them itself (use its own flags), got {' '.join(words)!r}")
    try:
        check_settings(window=g.window, max_docs=g.max_docs, budget=g.budget, batch=g.batch, threads=g.threads,
                       floor_stride=g.floor_stride, n_boot=g.boot, parity_steps=g.parity_steps, limit=g.limit,
                       calib_tokens=g.calib_tokens, calib_len=g.calib_len, min_rows=g.min_rows, damp=g.damp,
                       dither=g.dither, batch_tokens=g.batch_tokens, stat_bytes=g.stat_bytes, seed=g.seed)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
    return g


def main(argv=None, stamp=None, prog: str = "python -m int4lab.gate") -> int:
    """The CLI. The result file holds {"provenance": run_info(command), **payload}; stamp(info) -> info, when
    given, adds to that block what a publisher records beside it (e.g. the commit and the code measured)."""
    args = parser().parse_args(argv)
    from ..files import write_text_atomic
    from ..runinfo import run_info
    try:                                    # everything that can be refused is refused before any work
        name, context = model_name_and_context(args.model)
        arms = plan_arms(args.scheme, args.targets, args.act, args.lottery, args.calib_draws, args.dither)
        from .run import calib_len_default, calib_source
        from .sources import read_sources
        texts = list(read_sources(args.texts).values())
        calib_text = calib_source(args.calib_text, arms)
        check_settings(window=args.window, max_docs=args.max_docs, budget=args.budget, batch=args.batch,
                       threads=args.threads, floor_stride=args.floor_stride,
                       n_boot=args.boot, parity_steps=args.parity_steps, limit=args.limit,
                       calib_tokens=args.calib_tokens,
                       calib_len=args.calib_len if args.calib_len is not None else
                       calib_len_default(args.window or context, args.calib_tokens),
                       min_rows=args.min_rows, damp=args.damp, dither=args.dither,
                       trained_context=context, texts=texts, device=args.device,
                       batch_tokens=args.batch_tokens, stat_bytes=args.stat_bytes, seed=args.seed,
                       device_map=args.device_map, max_memory=args.max_memory)
        if args.out is not None and not args.out.strip():
            raise ValueError(f"--out: out must name a file, got {args.out!r} (leave it out for runs/)")
        path = check_out_path(args.out if args.out is not None else receipt_path(name))
        if args.tasks:
            from .lmeval import check_tasks
            check_tasks(args.tasks)
        max_memory = parse_max_memory(args.max_memory)
        check_budget(args.budget)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = _DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if str(args.device).startswith("cuda")
                                                    else torch.float32)
    try:
        payload = run_gate(args.model, arms, budget=args.budget, dtype=dtype, device=args.device,
                           device_map=args.device_map, max_memory=max_memory, texts=texts, calib_text=calib_text,
                           window=args.window, batch=args.batch,
                           floor=not args.no_floor, calib_tokens=args.calib_tokens, calib_len=args.calib_len,
                           min_rows=args.min_rows, damp=args.damp, n_boot=args.boot, seed=args.seed,
                           parity_steps=args.parity_steps, max_docs=args.max_docs,
                           prefill_min_rows=args.prefill_rows, batch_tokens=args.batch_tokens,
                           arms_per_group=args.arms_per_group,
                           stat_bytes=args.stat_bytes, floor_stride=args.floor_stride, tasks=args.tasks,
                           limit=args.limit,
                           progress=not args.quiet,
                           log=(lambda m: print(m, file=sys.stderr, flush=True)) if args.log else None)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args_line = " ".join(argv if argv is not None else sys.argv[1:])
    info = run_info(f"{prog} {args_line}")
    body = {"provenance": stamp(info) if stamp is not None else info, **payload}
    write_text_atomic(path, json.dumps(body, indent=1) + "\n")
    print(format_table(payload))
    print(f"receipt: {path}")
    return 0
