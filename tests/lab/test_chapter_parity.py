"""lab.chapters.parity: the stage-by-stage localisation chapter 04 uses for the decode instrument's parity."""
import pytest
import torch

import int4lab as il
from int4lab.gate import decode_windows, documents
from int4lab.models import load_tiny, load_tokenizer
from lab.chapters import parity


def test_localise_rows_and_the_chain():
    tok = load_tokenizer()
    w = decode_windows(tok, documents("test")[0], windows=1, prompt=4, steps=1)
    q, _ = il.quantize_model(load_tiny("olmoe", torch.float32, experts_implementation="eager"), progress=False)
    rows = parity.localise(q, w, 4)
    assert [(r["window"], r["step"], r["layer"]) for r in rows] == [(0, 0, layer) for layer in range(4)]
    for r in rows:
        assert r["h_values"] == 8 * 128 and r["block_values"] == 128          # top-8 rows of 2I = 128; H = 128
        assert r["h_ulps"] <= 1 and r["down_differ"] <= 1
        assert (r["block_differ"] > 0) == (r["codes_differ"] > 0)
    with pytest.raises(ValueError, match="no Int4Experts"):
        parity.localise(load_tiny("olmoe", torch.float32, experts_implementation="eager"), w, 4)
