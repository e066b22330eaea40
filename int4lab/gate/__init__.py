"""The perplexity gate: may this int4-b32 model ship?

    python -m int4lab.gate --model olmoe --scheme rtn gptq                 # a small trained model, CPU
    python -m int4lab.gate --model /path/to/Mixtral-8x7B-v0.1 --device cuda --device-map auto --tasks wikitext

Every arm (round-to-nearest; its dithered re-packs, the rounding lottery; GPTQ packs from several
calibration draws) is scored against the source on every document of the held-out texts (`test`, in
domain; `ood`, out of domain), in windows no longer than the model's trained context and never across a
document, by batched full forwards of length-sorted windows; the per-token statistics are computed on the
device. Arms are held in groups that fit the device (the source re-runs per group). Per text: token-level
perplexity, the relative change vs the source with a paired bootstrap 95% CI over documents, mean
KL(source ‖ arm) with its CI, its 99th percentile and top-1 agreement. The verdict: PASS when every text's
CI lies under the budget, FAIL when one lies over it, otherwise UNDECIDED with the tokens that would decide
it; it is one-sided, so KL is reported beside it. The bf16-vs-fp32 precision floor is reported, never used
as a threshold. Each text's documents are split by a seeded hash into development and held-out halves
(`split.py`): the pack to ship is chosen on the development half, every verdict read on the held-out half.
Calibration is judged by a test at a stated error rate: each GPTQ draw's paired change against
round-to-nearest, against the lottery tickets' changes (`stats.CALIBRATION_RULE`). The decode instrument (KV
cache, through the int4 kernels) is a kernel-parity check on a short window.

    texts.py   documents, scoring windows, calibration draws       score.py   on-device per-token figures
    arms.py    the arms, copies of the source, group sizes         compare.py arms vs source, vs their twin
    stats.py   paired bootstrap, verdict, band, calibration test  decode.py  the kernel-parity check
    split.py   development / held-out documents, the choice
    models.py  loading a model                                     lmeval.py  lm-eval tasks, token level
    run.py     one gate run -> receipt payload                     table.py   CLI and README tables
    cli.py     python -m int4lab.gate                              settings.py the rules every setting obeys
"""
from .decode import PARITY_REF_FACTOR, PARITY_TOL, decode_logprobs, decode_windows, full_forward_logprobs, parity
from .models import load_model, parse_max_memory
from .arms import DITHER, Arm, plan_arms
from .run import BATCH_TOKENS, run_gate
from .score import SCORE_PREFILL_ROWS, STAT_BYTES, PerToken, score_models, token_stats
from .stats import CALIBRATION_RULE, calibration_judgement, paired_ci, rounding_band, tokens_to_decide, verdict
from .split import CHOICE_RULE, SPLIT_RULE, choose, split_documents
from .table import format_table, render_gate_table, rows
from .texts import IN_DOMAIN, TEXTS, Windows, calibration_ids, documents, token_sha, trained_context
from .settings import MIN_DOCS, check_settings
from .cli import main, receipt_path

__all__ = ["BATCH_TOKENS", "CALIBRATION_RULE", "CHOICE_RULE", "SPLIT_RULE", "choose", "split_documents",
           "DITHER", "IN_DOMAIN", "MIN_DOCS", "PARITY_REF_FACTOR", "PARITY_TOL", "SCORE_PREFILL_ROWS", "STAT_BYTES",
           "TEXTS", "Arm", "PerToken", "Windows", "calibration_ids", "calibration_judgement", "check_settings", "decode_logprobs",
           "decode_windows", "documents", "format_table", "full_forward_logprobs", "load_model", "main", "paired_ci",
           "parity", "parse_max_memory", "plan_arms", "receipt_path", "render_gate_table", "rounding_band", "rows",
           "run_gate", "score_models", "token_sha", "token_stats", "tokens_to_decide", "trained_context",
           "verdict"]
