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
    """Before any model loads: ValueError naming --tasks for a name that no lm-eval task file (nor data/tasks/)
    mentions, i.e. certainly not a task (a typo). A word scan of the task YAML files takes about a second where
    lm-eval's own index takes tens; a name it finds is left for lm-eval to judge."""
    import importlib.util
    import os
    import re

    from ..locations import DATA
    for t in tasks:
        if not isinstance(t, str):
            raise TypeError(f"--tasks: tasks must be lm-eval task names (str), got {t!r}")
    todo = [t for t in tasks if t not in LOCAL_TASKS]
    if not todo:
        return
    spec = importlib.util.find_spec("lm_eval")
    if spec is None:
        raise ValueError(f"--tasks {todo}: lm-eval is not installed (pip install lm-eval)")
    words: set = set()
    word = re.compile(r"[A-Za-z0-9_.\-]+")
    for root in (os.path.join(os.path.dirname(spec.origin), "tasks"), str(DATA / "tasks")):
        for folder, _, files in os.walk(root):
            for f in files:
                if f.endswith((".yaml", ".yml")):
                    with open(os.path.join(folder, f), errors="replace") as fh:
                        words.update(word.findall(fh.read()))
    unknown = [t for t in todo if t not in words]
    if unknown:
        raise ValueError(f"--tasks: {unknown} are not lm-eval tasks (no task file names them); see "
                         f"`lm-eval ls tasks`, or {sorted(LOCAL_TASKS)}")


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
