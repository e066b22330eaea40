"""Bad inputs to the quantised models and their checkpoints: one behaviour per input on every path, and a refused
load leaves the model as it was (tests/test_bad_inputs.py holds the first round of cases)."""
import json

import pytest
import torch
from torch import nn

import int4lab as il
from int4lab.quantize import Int4Experts, load_quantized, quantize_model, read_metadata, save_quantized
from int4lab.quantize.prefill import prefill_experts

from test_quantize import tiny_model


# ---------------------------------------------------------------------------------------------- expert ids

def _experts(E=4, H=64, I=32, device="cpu"):
    gu = il.pack_int4_b32(torch.randn(E, 2 * I, H) * 0.1)
    dn = il.pack_int4_b32(torch.randn(E, H, I) * 0.1)
    return Int4Experts(tuple(t.to(device) for t in gu), tuple(t.to(device) for t in dn), nn.SiLU(), "int8")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("bad", [-1, 4, 9])
@pytest.mark.parametrize("path", ["reference", "kernels", "prefill"])
def test_out_of_range_expert_ids_one_rule_on_every_path(device, bad, path):
    """An id outside [0, E): refused by name where the ids are on the host (the CPU reference, the kernels in the
    interpreter, the prefill path), a NaN row for that token only on a GPU (no read-back; as under capture).
    E itself, transformers' expert-parallel padding, is refused as well: an int4 model is never expert-parallel."""
    mod = _experts(device=device)
    mod.kernels = path != "reference"
    mod.prefill_min_rows = 0 if path == "prefill" else None
    x = torch.randn(3, 64, device=device).bfloat16()
    ids = torch.tensor([[0, 1], [bad, 2], [3, 0]], device=device)
    w = torch.full((3, 2), 0.5, device=device)
    if device == "cpu":
        with pytest.raises(ValueError, match=rf"top_k_index must lie in \[0, E\) = \[0, 4\), got values in "
                                             rf"\[{min(bad, 0)}, {max(bad, 3)}\]"):
            mod(x, ids, w)
    else:
        assert mod(x, ids, w).float().isnan().any(1).tolist() == [False, True, False]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_prefill_and_reference_give_the_gpu_rule_without_a_read_back():
    """What the GPU paths compute, checked on the host: the prefill path's mask and the reference loop's weights
    make the bad token's row NaN and leave the others as they were."""
    mod = _experts()
    x = torch.randn(3, 64).bfloat16()
    ids = torch.tensor([[0, 1], [7, 2], [3, 0]])
    w = torch.full((3, 2), 0.5)
    y = prefill_experts(mod, x, ids, w)
    assert y.float().isnan().any(1).tolist() == [False, True, False]
    good = torch.tensor([[0, 1], [1, 2], [3, 0]])
    mod.kernels = False
    ref = mod(x, good, w)
    assert torch.equal(ref[[0, 2]], mod(x[[0, 2]], good[[0, 2]], w[[0, 2]]))
