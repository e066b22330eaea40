"""A 4096-token byte-level BPE tokenizer trained offline on the training split only.

    tok = load_tokenizer()                  # transformers PreTrainedTokenizerFast, works offline
    tok("To be")["input_ids"]               # no special tokens
    load_tokenizer(add_bos=True)("To be")   # exactly one <|bos|> in front

BOS is decided once, here: the saved tokenizer adds NO special tokens by default, so BOS is inserted by
whoever knows a document starts — the training script puts one <|bos|> before each play, and lm-eval's
rolling perplexity prepends its prefix token (our bos_token_id) once. Asking for it
(`add_bos=True`, or transformers' `add_bos_token=True`) makes the post-processor add exactly one.
Either way never two: do not combine lm-eval's `add_bos_token=True` with its rolling perplexity, which
also prepends the prefix token.

Ids 0 and 1 are <|bos|> and <|eos|>; pad is <|eos|>. Byte-level means every string round-trips exactly.
Rebuild with `python -m int4lab.models.tokenizer --rebuild`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from .checkpoints import TOKENIZER_DIR

BOS, EOS = "<|bos|>", "<|eos|>"
VOCAB_SIZE = 4096


def build_tokenizer(text: str, out_dir=TOKENIZER_DIR, vocab_size: int = VOCAB_SIZE):
    """Train byte-level BPE on `text`, save tokenizer.json + tokenizer_config.json to out_dir; return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + 2:
        raise ValueError(f"vocab_size must be at least 258 (256 bytes + 2 specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # trim_offsets=False: offsets are not used, and a plain ByteLevel post-processor keeps encode() free
    # of special tokens.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer=trainer, length=1)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS,
                                   add_bos_token=False, add_eos_token=False, model_max_length=512)
    out_dir = Path(out_dir)
    fast.save_pretrained(out_dir)
    return fast


def load_tokenizer(path=None, add_bos: bool = False):
    """The saved tokenizer (default data/tokenizer/) as a PreTrainedTokenizerFast; `add_bos` adds one BOS."""
    from transformers import AutoTokenizer

    path = Path(path) if path is not None else TOKENIZER_DIR
    if not (path / "tokenizer.json").exists():
        raise FileNotFoundError(f"no tokenizer at {path}: build it with `python -m int4lab.models.tokenizer "
                                f"--rebuild` (needs data/corpus/train.txt)")
    return AutoTokenizer.from_pretrained(path, add_bos_token=add_bos, add_eos_token=False)


def main(argv=None) -> int:
    from ..corpus import CORPUS_DIR, load_split, sha256

    ap = argparse.ArgumentParser(prog="python -m int4lab.models.tokenizer",
                                 description="Train the byte-level BPE tokenizer on data/corpus/train.txt.")
    ap.add_argument("--rebuild", action="store_true", help="retrain and overwrite data/tokenizer/")
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="merges + 256 bytes + 2 specials")
    ap.add_argument("--out", type=Path, default=TOKENIZER_DIR)
    args = ap.parse_args(argv)
    if not args.rebuild:
        try:
            tok = load_tokenizer(args.out)
        except FileNotFoundError as e:
            print(f"error: --out: {e}", file=sys.stderr)
            return 2
        print(f"{args.out}: {len(tok)} tokens, bos={tok.bos_token_id}, eos={tok.eos_token_id}")
        return 0
    tok = build_tokenizer(load_split("train"), args.out, args.vocab_size)
    build = {"trained_on": "data/corpus/train.txt", "train_sha256": sha256(CORPUS_DIR / "train.txt"),
             "vocab_size": len(tok), "model": "byte-level BPE, min_frequency=2", "specials": [BOS, EOS],
             "tokenizer_json_sha256": hashlib.sha256((Path(args.out) / "tokenizer.json").read_bytes()).hexdigest(),
             "command": f"python -m int4lab.models.tokenizer --rebuild --vocab-size {args.vocab_size}"}
    (Path(args.out) / "BUILD.json").write_text(json.dumps(build, indent=1) + "\n")
    print(f"{args.out}: {len(tok)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
