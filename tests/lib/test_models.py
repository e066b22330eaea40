"""Tiny MoE configs, the tokenizer's BOS contract, the training script, and the committed checkpoints."""
# E = experts, N = out features, K = in features, H = hidden size, I = expert intermediate size
import hashlib
import json
import math

import pytest
import torch

from int4lab.corpus import load_split
from int4lab.models import ARCHS, TOKENIZER_DIR, expert_shapes, load_tiny, load_tokenizer, model_dir, tiny_config
from lab import train as tr
from lab.paths import RECEIPTS

# "Far below the unigram baseline": a model that only knew token frequencies would score the unigram
# perplexity; we ask for a fifth of it or less, which needs real use of context.
FAR_BELOW = 5.0


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def tok_bos():
    return load_tokenizer(add_bos=True)


# --- tokenizer ------------------------------------------------------------------------------------

def test_tokenizer_special_ids_and_size(tok):
    assert len(tok) == 4096
    assert (tok.bos_token, tok.bos_token_id) == ("<|bos|>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("<|eos|>", 1)
    assert tok.pad_token_id == tok.eos_token_id


@pytest.mark.parametrize("text", ["To be, or not to be: that is the question.\n",
                                  "  leading spaces, trailing tabs\t\n\n",
                                  "Ünïcödé — “quotes” and emoji 🙂 survive byte-level BPE", ""])
def test_tokenizer_round_trips(tok, text):
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text


def test_tokenizer_round_trips_real_text(tok):
    text = load_split("validation")[:20000]
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert 2.0 < len(text) / len(ids) < 5.0  # BPE actually merges (about 3 bytes a token here)


def test_bos_is_added_once_when_asked_and_never_by_default(tok, tok_bos):
    text = "Enter HAMLET"
    plain = tok(text)["input_ids"]
    assert tok.bos_token_id not in plain
    with_bos = tok_bos(text)["input_ids"]
    assert with_bos == [tok.bos_token_id] + plain
    assert tok_bos(text, add_special_tokens=False)["input_ids"] == plain
    batch = tok_bos([text, "Exit"])["input_ids"]
    assert [row.count(tok.bos_token_id) for row in batch] == [1, 1]


def test_lm_eval_rolling_windows_start_with_exactly_one_bos(tok):
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    ids = tok(load_split("validation")[:3000])["input_ids"]
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(ids, tok.bos_token_id, 256, 1)]
    first = windows[0][0] + windows[0][1]
    assert first[0] == tok.bos_token_id and first.count(tok.bos_token_id) == 1
    assert sum(len(w[1]) for w in windows) == len(ids)  # every token scored once


def test_load_tokenizer_missing_dir_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="--rebuild"):
        load_tokenizer(tmp_path)


def test_tokenizer_rebuild_is_deterministic(tmp_path):
    from int4lab.models.tokenizer import build_tokenizer
    build_tokenizer(load_split("train"), tmp_path)
    fresh = json.loads((tmp_path / "tokenizer.json").read_text())["model"]
    committed = json.loads((TOKENIZER_DIR / "tokenizer.json").read_text())["model"]
    assert fresh["vocab"] == committed["vocab"] and fresh["merges"] == committed["merges"]
    build = json.loads((TOKENIZER_DIR / "BUILD.json").read_text())
    assert build["tokenizer_json_sha256"] == hashlib.sha256((TOKENIZER_DIR / "tokenizer.json").read_bytes()).hexdigest()


# --- configs --------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_config_meets_the_issue(arch):
    from transformers import AutoModelForCausalLM
    cfg = tiny_config(arch)
    s = expert_shapes(cfg)
    want = {"mixtral": (8, 2), "olmoe": (32, 8), "qwen3_moe": (32, 8)}[arch]
    assert (s["experts"], s["top_k"]) == want
    assert s["hidden"] % 32 == 0 and s["intermediate"] % 32 == 0
    assert cfg.vocab_size == 4096 and cfg.max_position_embeddings == 512
    assert not cfg.tie_word_embeddings and not cfg.output_router_logits
    assert 2 <= cfg.num_hidden_layers <= 4 and cfg.num_attention_heads == 4
    if arch != "olmoe":
        assert cfg.num_key_value_heads < cfg.num_attention_heads  # grouped-query attention
    model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert 2_000_000 <= n <= 8_000_000, n
    ex = model.model.layers[0].mlp.experts
    E, I, H = s["experts"], s["intermediate"], s["hidden"]
    assert tuple(ex.gate_up_proj.shape) == (E, 2 * I, H)
    assert tuple(ex.down_proj.shape) == (E, H, I)
    assert tuple(model.model.layers[0].mlp.gate.weight.shape) == (E, H)


@pytest.mark.parametrize("bad", ["llama", "Mixtral", ""])
def test_unknown_arch_is_refused_everywhere(bad, tmp_path):
    with pytest.raises(ValueError, match="arch must be one of"):
        tiny_config(bad)
    with pytest.raises(ValueError, match="arch must be one of"):
        model_dir(bad)
    with pytest.raises(ValueError, match="arch must be one of"):
        load_tiny(bad, root=tmp_path)


def test_load_tiny_missing_checkpoint_and_bad_dtype(tmp_path):
    with pytest.raises(FileNotFoundError, match="lab.train --arch olmoe"):
        load_tiny("olmoe", root=tmp_path)
    with pytest.raises(TypeError, match="dtype"):
        load_tiny("olmoe", dtype=torch.int8, root=tmp_path)


# --- training-script pieces -----------------------------------------------------------------------

def test_stream_nll_scores_every_token_once():
    V = 50
    stream = torch.randint(0, V, (23,))

    class Bigram(torch.nn.Module):  # a stand-in model whose logits depend on the current token only
        def __init__(self):
            super().__init__()
            self.table = torch.randn(V, V)

        def forward(self, input_ids):
            return type("Out", (), {"logits": self.table[input_ids]})

    m = Bigram()
    want = float(torch.nn.functional.cross_entropy(m.table[stream[:-1]], stream[1:], reduction="sum"))
    for seq_len, batch in ((5, 2), (22, 1), (7, 3), (100, 4)):
        got, n = tr.stream_nll(m, stream, seq_len, batch, "cpu")
        assert n == 22 and got == pytest.approx(want, rel=1e-5), (seq_len, batch)


def test_unigram_nll_matches_hand_count():
    train = torch.tensor([0, 0, 1, 2])
    target = torch.tensor([0, 3])
    counts = torch.tensor([2, 1, 1, 0]).double() + 1
    p = counts / counts.sum()
    assert tr.unigram_nll(train, target, 4) == pytest.approx(float(-(p[0].log() + p[3].log())))


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    lrs = [tr.lr_at(s, 200, 1.0, 20) for s in range(200)]
    assert lrs[0] == pytest.approx(1 / 20) and lrs[19] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[19:], lrs[20:]))
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)


def test_cli_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        tr.main(["--arch", "gpt2"])
    with pytest.raises(SystemExit):
        tr.main(["--arch", "mixtral", "--seq-len", "1024"])
    assert "seq-len" in capsys.readouterr().err


def test_three_step_cpu_training_gives_loadable_checkpoint_and_receipt(tmp_path):
    out, rec = tmp_path / "models", tmp_path / "receipts"
    tr.main(["--arch", "mixtral", "--steps", "3", "--seq-len", "16", "--batch", "2", "--train-tokens", "3000",
             "--eval-tokens", "128", "--val-every", "2", "--select-tokens", "64", "--log-every", "1",
             "--device", "cpu", "--out", str(out), "--receipts", str(rec)])
    r = json.loads((rec / "train_mixtral.json").read_text())
    assert json.loads((out / "mixtral" / "config.json").read_text())["trained_context"] == 16
    assert r["training"]["steps"] == 3 and len(r["loss_curve"]["rows"]) == 3
    assert all(math.isfinite(row[1]) for row in r["loss_curve"]["rows"])
    assert {"device", "torch", "commit", "date", "command"} <= set(r["provenance"])
    for split in ("validation", "test", "ood"):
        assert r["eval"][split]["tokens"] == 128 and r["eval"][split]["ppl"] > 1
    for name, digest in r["checkpoint"]["sha256"].items():
        assert hashlib.sha256((out / "mixtral" / name).read_bytes()).hexdigest() == digest
    model = load_tiny("mixtral", root=out)
    assert type(model).__name__ == "MixtralForCausalLM" and not model.training
    assert model.model.layers[0].mlp.experts.gate_up_proj.dtype == torch.float32


# --- the committed checkpoints --------------------------------------------------------------------

def _committed(arch):
    if not (model_dir(arch) / "model.safetensors").exists():
        pytest.skip(f"no committed checkpoint for {arch}: train with python -m lab.train")


@pytest.mark.parametrize("arch", ARCHS)
def test_committed_receipt_matches_files_and_beats_unigram(arch):
    _committed(arch)
    if not (RECEIPTS / f"train_{arch}.json").exists():
        pytest.skip(f"no training receipt train_{arch}.json: python -m lab.train writes it with the checkpoint")
    r = json.loads((RECEIPTS / f"train_{arch}.json").read_text())
    for name, digest in r["checkpoint"]["sha256"].items():
        assert hashlib.sha256((model_dir(arch) / name).read_bytes()).hexdigest() == digest, name
    val = r["eval"]["validation"]
    assert val["tokens"] > 100_000  # the whole validation split, not a slice
    assert val["ppl"] * FAR_BELOW < val["unigram_ppl"], val
    assert r["final_val_ppl"] == val["ppl"]
    assert r["training"]["steps"] >= 500 and r["params"] == sum(
        p.numel() for p in load_tiny(arch).parameters())


@pytest.mark.parametrize("arch", ARCHS)
def test_committed_checkpoint_loads_and_predicts(arch, tok):
    _committed(arch)
    from safetensors import safe_open
    with safe_open(str(model_dir(arch) / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    model = load_tiny(arch)
    s = expert_shapes(model.config)
    assert tuple(model.model.layers[0].mlp.experts.down_proj.shape) == (s["experts"], s["hidden"], s["intermediate"])
    # Re-measure on a slice here, on the CPU: far below the unigram baseline on the same tokens.
    stream = tr.token_stream(load_split("validation"), tok)[:1025]
    nll, n = tr.stream_nll(model, stream, 256, 4, "cpu")
    train = tr.token_stream(load_split("train"), tok)
    uni = tr.unigram_nll(train, stream[1:], len(tok))
    assert math.exp(nll / n) * FAR_BELOW < math.exp(uni / n)
    assert model.config.trained_context == 256 <= model.config.max_position_embeddings   # the gate's longest window


def test_lm_eval_rolling_loglikelihood_equals_our_stream_nll(tok):
    """lm-eval's perplexity path (BOS prefix, each token once) and the receipts' method agree."""
    if not (model_dir("mixtral") / "model.safetensors").exists():
        pytest.skip("no committed mixtral checkpoint")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    model = load_tiny("mixtral")
    text = load_split("test")[:1000]
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1, max_length=512)
    (ll,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    stream = tr.token_stream(text, tok)
    assert stream.numel() <= 512
    nll, _ = tr.stream_nll(model, stream, 512, 1, "cpu")
    assert -ll == pytest.approx(nll, rel=1e-4)
