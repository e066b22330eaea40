"""The gate's texts: corpus splits cut into documents, documents cut into windows of at most the trained
context (batched by length, so forwards carry little padding), and calibration sequences from the train split.

Shape legend: W = windows, L = window length (<= the model's trained context), B = calibration sequences,
T = tokens per calibration sequence.
"""
from __future__ import annotations

import hashlib
import re

import torch

TEXTS = ("test", "ood")                 # held-out Shakespeare plays (in domain), King James Bible (out of domain)
IN_DOMAIN = ("test",)


def documents(split: str, doc_chars: int = 4096) -> list[str]:
    """The corpus split cut at blank lines into documents of about doc_chars characters: a document closes at the
    first blank line once its paragraphs, each counted with two characters for the break after it, reach doc_chars,
    so it holds at least doc_chars - 2 characters and can run well past doc_chars; the last may be short."""
    from ..corpus import load_split
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


def trained_context(model_name: str, config=None) -> int:
    """Longest window the model was trained on, from its config: `trained_context` where training saved it
    (the tiny models: their training sequence length), else max_position_embeddings."""
    n = getattr(config, "trained_context", None) or getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"cannot tell the trained context of {model_name!r}: its config has neither "
                         "trained_context nor max_position_embeddings; pass --window")
    return n


class Windows:
    """Every token of every document after its first, scored exactly once, by windows of at most L inputs.

    ids int64 [W, L + 1] (right-padded with 0), n int64 [W] (real tokens per window), doc int64 [W]
    (document index). Window j of a document holds tokens jL .. jL + L of it; the model reads its first
    n - 1 and predicts tokens 1 .. n - 1 of it, so a scored token sees between 1 and L tokens of its own
    document and never another's (the paired bootstrap resamples documents). L is at most the trained
    context (`trained_context`); a document shorter than L is one window of its own length.

    `batches` groups windows of similar length into forwards, each trimmed to its longest window, so the
    padding a forward computes is small (`padding` measures it). Per-token results are laid out in window
    order: window w's predictions are positions offsets[w] .. offsets[w] + n[w] - 2.
    """

    def __init__(self, tok, docs: list[str], L: int):
        if not isinstance(L, int) or isinstance(L, bool) or L < 1:
            raise ValueError(f"window must be a positive int, got {L!r}")
        if not docs:
            raise ValueError("docs must hold at least one document")
        rows, n, doc = [], [], []
        streams = []
        for d, text in enumerate(docs):
            ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
            streams.append(ids)
            for s in range(0, max(len(ids) - 1, 0), L):
                piece = ids[s:s + L + 1]
                rows.append(piece + [0] * (L + 1 - len(piece)))
                n.append(len(piece))
                doc.append(d)
        self.ids = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), L + 1)
        self.n = torch.tensor(n, dtype=torch.int64)
        self.doc = torch.tensor(doc, dtype=torch.int64)
        self.docs = len(docs)
        self.L = L
        self.sha = token_sha([i for s in streams for i in s])

    @property
    def tokens(self) -> int:
        """Scored tokens (predictions)."""
        return int((self.n - 1).sum())

    @property
    def offsets(self) -> torch.Tensor:
        """int64 [W]: where each window's first prediction sits in the per-token layout (window order)."""
        return torch.cumsum(self.n - 1, 0) - (self.n - 1)

    def subset(self, stride: int) -> "Windows":
        """The windows of every stride-th document (doc % stride == 0), keeping their document indices."""
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
            raise ValueError(f"stride must be a positive int, got {stride!r}")
        keep = self.doc % stride == 0
        sub = object.__new__(Windows)
        sub.ids, sub.n, sub.doc, sub.L = self.ids[keep], self.n[keep], self.doc[keep], self.L
        sub.docs = int(keep.any() and len(torch.unique(self.doc[keep])))
        sub.sha = token_sha(torch.cat([self.ids[keep].flatten(), self.n[keep]]))
        return sub

    def __len__(self) -> int:
        return self.ids.shape[0]

    def scored_mask(self) -> torch.Tensor:
        """bool [W, L]: which predictions of each window are real (not padding)."""
        return torch.arange(self.L).unsqueeze(0) < (self.n - 1).unsqueeze(1)

    def batches(self, batch: int = 16, batch_tokens: int | None = None) -> list[torch.Tensor]:
        """int64 window indices, one tensor per forward: windows sorted by length, longest first (ties in
        window order), cut into runs of at most `batch` windows whose b x (longest window's inputs) stays
        within batch_tokens (None: no token bound); a window longer than batch_tokens is a forward alone.
        Every window is in exactly one batch."""
        for name, v in (("batch", batch), ("batch_tokens", batch_tokens)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        inputs = (self.n - 1).tolist()
        order = sorted(range(len(inputs)), key=lambda w: -inputs[w])
        out, cur = [], []
        for w in order:
            longest = inputs[cur[0]] if cur else inputs[w]          # sorted: the first is the longest
            if cur and (len(cur) >= batch or (batch_tokens and (len(cur) + 1) * longest > batch_tokens)):
                out.append(torch.tensor(cur, dtype=torch.int64))
                cur = []
            cur.append(w)
        if cur:
            out.append(torch.tensor(cur, dtype=torch.int64))
        return out

    def padding(self, batches: list[torch.Tensor]) -> dict:
        """What the forwards of `batches` compute beyond the scored tokens: {"batches", "inputs" (b x longest,
        summed), "tokens" (scored), "fraction" (1 - tokens / inputs), "longest" (the longest window's inputs)}."""
        computed = sum(len(b) * (int(self.n[b].max()) - 1) for b in batches)
        return {"batches": len(batches), "inputs": computed, "tokens": self.tokens,
                "fraction": 1 - self.tokens / computed if computed else 0.0,
                "longest": int(self.n.max()) - 1 if len(self) else 0}


def split_ids(tok, split: str = "train") -> torch.Tensor:
    """int64 [n]: a corpus split as one token stream."""
    from ..corpus import load_split
    return torch.tensor(tok(load_split(split), add_special_tokens=False, verbose=False)["input_ids"],
                        dtype=torch.int64)


def calibration_ids(tok, tokens: int, seq_len: int, seed: int = 0, split: str = "train",
                    stream: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [tokens // seq_len, seq_len]: sequences of consecutive tokens at seeded random starts in a split.

    Different seeds draw different calibration sets from the same text (the gate's calibration draws).
    stream: the split already tokenised (`split_ids`), to tokenise it once for several draws.
    """
    for name, v in (("tokens", tokens), ("seq_len", seq_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if tokens < seq_len:
        raise ValueError(f"tokens ({tokens}) must be at least seq_len ({seq_len})")
    ids = split_ids(tok, split) if stream is None else stream
    B = tokens // seq_len
    if ids.numel() < tokens:
        raise ValueError(f"split {split!r} has {ids.numel()} tokens, fewer than the {tokens} asked for")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len + 1, (B,), generator=g)
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])
