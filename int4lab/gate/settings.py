"""The gate's settings, checked before any work starts: each refusal is a ValueError naming the command-line
flag, the setting and the rule ("--max-docs: max_docs must be ...").

Why at least MIN_DOCS = 10 documents per text and split. The verdict's 95 % interval is a paired bootstrap over
documents (`stats.paired_ci`): each resample draws the text's n documents with replacement. Over one
document every resample is that document, the interval has zero width, and PASS or FAIL would follow from
one number ("[+0.38 %, +0.38 %] PASS"). Over n documents the percentile interval is too narrow by about
sqrt((n - 1) / n) and has only C(2n - 1, n) distinct resamples: 3 at n = 2, 126 at n = 5. At n = 10 it is
about 5 % too narrow with 92,378 distinct resamples, which is the least we accept; the committed texts hold
88 (test) and 71 (ood). Each text is split into development and held-out documents (`split.py`: a pack is
chosen on one half, its verdict read on the other), and each half keeps MIN_DOCS, so a text needs
2 * MIN_DOCS. The rule counts the documents every arm scores (the first max_docs of each text).
We refuse rather than answer UNDECIDED: a run
that cannot decide by construction is a settings mistake, and it is cheaper to say so before the models load.
"""
from __future__ import annotations

import math

MIN_DOCS = 10
MIN_BOOT = 100      # the bootstrap's own floor (stats.paired_ci): a 2.5 % tail needs a few resamples beyond it


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _need(ok: bool, name: str, flag: str, rule: str, v) -> None:
    if not ok:
        raise ValueError(f"{flag}: {name} must be {rule}, got {v!r}")


def check_settings(*, window=None, max_docs=None, budget=None, batch=None, threads=None, floor_stride=None,
                   n_boot=None, parity_steps=None, limit=None, calib_tokens=None, calib_len=None, min_rows=None,
                   damp=None, dither=None, trained_context=None, texts=None, device=None,
                   batch_tokens=None, stat_bytes=None, seed=None, device_map=None, max_memory=None,
                   prefill_rows=None) -> None:
    """Refuse degenerate gate settings before any work (module doc). An argument left None is not checked
    (its default applies). trained_context: the model's (texts.trained_context), the largest window.
    texts: the texts to score, source specs or `sources.TextSource`s; with them, every text must keep
    2 * MIN_DOCS documents after max_docs (`sources.check_document_count`; reads the texts, not the model)."""
    if budget is not None:
        _need(isinstance(budget, (int, float)) and not isinstance(budget, bool) and math.isfinite(budget)
              and 0 < budget < 1, "budget", "--budget",
              "a positive finite relative change below 1 (0.01 = 1 %; inf or >= 1 would pass any arm)", budget)
    if window is not None:
        _need(_int(window) and window >= 1, "window", "--window", "a positive int (None: the trained context)",
              window)
        if trained_context is not None:
            _need(window <= trained_context, "window", "--window",
                  f"at most the model's trained context {trained_context} (positions beyond it were never "
                  "trained, so perplexity there says nothing about the quantisation)", window)
    if max_docs is not None:
        _need(_int(max_docs) and max_docs >= 2 * MIN_DOCS, "max_docs", "--max-docs",
              f"None (every document) or an int >= {2 * MIN_DOCS}: {MIN_DOCS} in each of the development and "
              "held-out splits; a bootstrap over fewer documents cannot give a verdict (int4lab.gate.settings)",
              max_docs)
    for name, flag, v, lo in (("batch", "--batch", batch, 1), ("threads", "--threads", threads, 1),
                              ("floor_stride", "--floor-stride", floor_stride, 1),
                              ("n_boot", "--boot", n_boot, MIN_BOOT),
                              ("parity_steps", "--parity-steps", parity_steps, 0),
                              ("limit", "--limit", limit, 1), ("calib_tokens", "--calib-tokens", calib_tokens, 1),
                              ("calib_len", "--calib-len", calib_len, 1), ("min_rows", "--min-rows", min_rows, 1),
                              ("batch_tokens", "--batch-tokens", batch_tokens, 1),
                              ("stat_bytes", "--stat-bytes", stat_bytes, 1), ("seed", "--seed", seed, 0),
                              ("prefill_rows", "--prefill-rows", prefill_rows, 0)):
        if v is not None:
            _need(_int(v) and v >= lo, name, flag, f"an int >= {lo}", v)
    if calib_len is not None and trained_context is not None:        # the rule --window follows
        _need(calib_len <= trained_context, "calib_len", "--calib-len",
              f"at most the model's trained context {trained_context} (GPTQ would calibrate on positions the "
              "model never trained on)", calib_len)
    if calib_tokens is not None and calib_len is not None:
        _need(calib_tokens >= calib_len, "calib_tokens", "--calib-tokens",
              f"at least calib_len ({calib_len}): one calibration sequence", calib_tokens)
    if damp is not None:
        _need(isinstance(damp, (int, float)) and math.isfinite(damp) and damp > 0, "damp", "--damp",
              "a positive finite fraction of mean diag(H)", damp)
    if dither is not None:
        _need(isinstance(dither, (int, float)) and 0 <= dither <= 0.5, "dither", "--dither",
              "a number in [0, 0.5] (units of the scale)", dither)
    if device is not None:
        check_device(device)
    if device_map is not None:
        check_device_map(device_map)
    if max_memory is not None:
        from .models import parse_max_memory
        try:
            parse_max_memory(max_memory)
        except ValueError as e:
            raise ValueError(f"--max-memory: {e}") from None
    if texts is not None:
        from .sources import check_document_count, read_sources
        check_document_count(read_sources(texts), max_docs)


def check_device(device) -> None:
    """ValueError naming --device unless it parses and exists here (cuda needs a CUDA device)."""
    import torch
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device: device must be cpu or cuda[:N], got {device!r}") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device: device must be one this machine has: {device!r} asks for CUDA and "
                             "torch sees no CUDA device (use --device cpu)")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"--device: device must be one this machine has: {device!r}, but there are "
                             f"{torch.cuda.device_count()} CUDA devices")
    elif d.type != "cpu":
        raise ValueError(f"--device: device must be cpu or cuda[:N], got {device!r}")


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(device_map) -> None:
    """ValueError naming --device-map unless it is one of accelerate's strategies or a device here."""
    if device_map in DEVICE_MAPS:
        return
    try:
        check_device(device_map)
    except ValueError:
        raise ValueError(f"--device-map: device_map must be one of {DEVICE_MAPS} or a device (cpu, cuda[:N]), "
                         f"got {device_map!r}") from None
