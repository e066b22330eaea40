"""float32 -> bfloat16 round-to-nearest-even done with integer ops, identical on GPU and interpreter.

Why not `x.to(tl.bfloat16)`: Triton 3.6's CPU interpreter truncates that cast (and its "rtne" mode
drops the carry into the exponent), so interpreter results would differ from torch's `.to(bfloat16)`
by an ulp in about half the elements. The bit trick below is the textbook RNE and costs a few integer
ops per output element, nothing next to the weight stream.
"""
import triton
import triton.language as tl


@triton.jit
def to_bf16_rne(x):
    """float32 tensor -> bfloat16 tensor, round-to-nearest-even; NaN stays NaN, inf stays inf."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)               # carries into the exponent on purpose
    hi = tl.where(x != x, 0x7FC0, rounded >> 16)               # keep NaN a (quiet) NaN
    return hi.to(tl.uint16).to(tl.bfloat16, bitcast=True)
