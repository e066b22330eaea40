"""The perplexity gate: may this int4-b32 model ship?

    python -m int4lab.gate --model olmoe --scheme rtn gptq                 # a small trained model, CPU
    python -m int4lab.gate --model /path/to/Mixtral-8x7B-v0.1 --device cuda --device-map auto --tasks wikitext

Every arm (round-to-nearest; its dithered re-packs, the rounding lottery; GPTQ packs from several
calibration draws) is scored against the source on every document of the held-out texts (`test`, in
domain; `ood`, out of domain), in windows no longer than the model's trained context, by batched full
forwards. Per text: token-level perplexity, the relative change vs the source with a paired bootstrap 95% CI
over documents, mean KL(source ‖ arm), its 99th percentile and top-1 agreement. The verdict: PASS when every
text's CI lies under the budget, FAIL when one lies over it, otherwise UNDECIDED with the tokens that would
decide it. The bf16-vs-fp32 precision floor is reported, never used as a threshold. Calibration counts only
when its gain over round-to-nearest clears zero and the lottery's spread in every draw. The decode
instrument (KV cache, through the int4 kernels) is a kernel-parity check on a short window.

    texts.py   documents, scoring windows, calibration draws       score.py   batched per-token figures
    stats.py   paired bootstrap, verdict, lottery, calibration     decode.py  the kernel-parity check
    models.py  loading a model                                     lmeval.py  lm-eval tasks, token level
    run.py     one gate run -> receipt payload                     table.py   CLI and README tables
    cli.py     python -m int4lab.gate                              settings.py the rules every setting obeys
"""
from .decode import PARITY_TOL, decode_logprobs, decode_windows, full_forward_logprobs, parity
from .models import load_model, parse_max_memory
from .run import DITHER, Arm, plan_arms, run_gate
from .score import PerToken, score_models
from .stats import calibration_judgement, lottery_spread, paired_ci, tokens_to_decide, verdict
from .table import format_table, render_gate_table, rows
from .texts import IN_DOMAIN, TEXTS, Windows, calibration_ids, documents, token_sha, trained_context
from .settings import MIN_DOCS, check_settings
from .cli import main, receipt_path

__all__ = ["DITHER", "IN_DOMAIN", "MIN_DOCS", "PARITY_TOL", "TEXTS", "Arm", "PerToken", "Windows", "calibration_ids",
           "calibration_judgement", "check_settings", "decode_logprobs", "decode_windows", "documents", "format_table",
           "full_forward_logprobs", "load_model", "lottery_spread", "main", "paired_ci", "parity",
           "parse_max_memory", "plan_arms",
           "receipt_path", "render_gate_table", "rows", "run_gate", "score_models", "token_sha",
           "tokens_to_decide", "trained_context", "verdict"]
