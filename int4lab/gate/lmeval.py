"""lm-eval tasks in the gate (e.g. `--tasks wikitext` for real checkpoints), scored at the token level.

lm-eval's `word_perplexity` divides by words, which inflates a relative change by tokens / words; the gate
instead reads each document's summed log-likelihood from lm-eval's logged samples, counts the document's
tokens with the model's tokenizer, and reports token-level perplexity with the same paired bootstrap over
documents as the main instrument. lm-eval's own metrics are kept alongside.
"""
from __future__ import annotations

import logging

import numpy as np

from . import stats


LOCAL_TASKS = {"int4lab_test": "test", "int4lab_ood": "ood"}


def check_tasks(tasks) -> None:
    """ValueError naming --tasks unless every name is a task lm-eval knows (or one of LOCAL_TASKS); reads
    lm-eval's task index (its YAML files), loads no model. Without lm-eval installed, any non-local task is
    refused with the install hint."""
    for t in tasks:
        if not isinstance(t, str) or not t:
            raise ValueError(f"--tasks: each task must be an lm-eval task name, got {t!r}")
    rest = [t for t in tasks if t not in LOCAL_TASKS]
    if not rest:
        return
    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ValueError(f"--tasks {' '.join(rest)} needs lm-eval: pip install lm-eval") from None
    from ..locations import DATA
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    known = set(TaskManager(include_path=str(DATA / "tasks")).all_tasks)
    unknown = [t for t in rest if t not in known]
    if unknown:
        raise ValueError(f"--tasks: task must be one lm-eval knows (e.g. wikitext, or {', '.join(LOCAL_TASKS)}), "
                         f"got unknown {', '.join(map(repr, unknown))}")


def _doc_logliks(model, tok, task: str, limit, max_length: int, batch_size: int = 4) -> tuple:
    """(loglik [D], tokens [D], lm-eval metrics) of one model on one task."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from ..locations import DATA
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    dev = str(model.get_input_embeddings().weight.device)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device=dev, max_length=max_length)
    tm = TaskManager(include_path=str(DATA / "tasks"), include_defaults=task not in LOCAL_TASKS)
    res = lm_eval.simple_evaluate(model=lm, tasks=[task], limit=limit, task_manager=tm, bootstrap_iters=0,
                                  log_samples=True, verbosity="ERROR")
    samples = sorted(res["samples"][task], key=lambda s: s["doc_id"])
    ll = np.array([float(np.ravel(s["filtered_resps"][0])[0]) for s in samples])
    n = np.array([len(tok(s["target"], add_special_tokens=False, verbose=False)["input_ids"]) for s in samples])
    metrics = {k.split(",")[0]: float(v) for k, v in res["results"][task].items()
               if isinstance(v, (int, float)) and not k.startswith("alias")}
    return ll, n, metrics


def lmeval_gate(models: dict, tok, tasks, limit, max_length: int, n_boot: int, seed: int, budget: float) -> dict:
    """{task: {"tokens", "docs", "source_ppl", "metrics": {model: lm-eval metrics},
    "arms": {name: {"rel": CI, "ppl", "verdict"}}}}; models' first entry is the source."""
    for t in tasks:
        if not isinstance(t, str):
            raise TypeError(f"tasks must be lm-eval task names (str), got {t!r}")
    out = {}
    for task in tasks:
        per = {name: _doc_logliks(m, tok, task, limit, max_length) for name, m in models.items()}
        names = list(per)
        _, n, _ = per[names[0]]
        doc = np.repeat(np.arange(len(n)), n)

        def tokens_nll(ll):                       # each document's mean nll on each of its tokens
            return np.repeat(-ll / np.maximum(n, 1), n)
        src = tokens_nll(per[names[0]][0])
        entry = {"tokens": int(n.sum()), "docs": int(len(n)), "source_ppl": float(np.exp(src.mean())),
                 "metrics": {k: v[2] for k, v in per.items()}, "arms": {}}
        for name in names[1:]:
            x = tokens_nll(per[name][0])
            ci = stats.paired_ci(x, src, doc, n_boot=n_boot, seed=seed)
            entry["arms"][name] = {"rel": ci["rel"], "ppl": float(np.exp(x.mean())),
                                   "verdict": stats.verdict({task: ci}, budget)["verdict"]}
        out[task] = entry
    return out


def merge_lmeval(old: dict | None, new: dict) -> dict:
    """Two `lmeval_gate` results over different arm groups: the arms and metrics of both, the source's
    figures from the first (the source runs with every group)."""
    if old is None:
        return new
    for task, e in new.items():
        if task not in old:
            old[task] = e
            continue
        old[task]["arms"].update(e["arms"])
        old[task]["metrics"].update({k: v for k, v in e["metrics"].items() if k != "source"})
    return old
