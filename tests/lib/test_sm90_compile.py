"""Every kernel the fused decode layer adds compiles for an H100 / H200 (sm_90) on this machine, without a GPU.

The CPU interpreter accepts what the compiler refuses (a kernel that reads a module-level value that is not a
tl.constexpr runs in the interpreter and fails to compile), so the interpreter tests alone cannot catch it. Run in
a subprocess: compiling needs the interpreter off, and this process has it on."""
import os
import subprocess
import sys

from lab.paths import ROOT

SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from int4lab.kernels.norm import add_rms_norm_kernel, rms_norm_kernel
from int4lab.kernels.router import router_topk_kernel

def comp(fn, sig, cst):
    sig = dict(sig, **{k: "constexpr" for k in cst})
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cst), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4})

for out in (0, 1, 2):                      # float32, bfloat16, float16 outputs
    comp(router_topk_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", logits_ptr="*bf16", wts_ptr="*fp32",
                                  ids_ptr="*i64", cnt_ptr="*i32", stride_x="i32"),
         dict(H=2048, E=64, TOPK=8, KP=8, RENORM=True, BLOCK_E=4, BLOCK_H=1024, EP=64, E_TILES=16, LOGITS=out,
              WTS=out, USE_LIBDEVICE=True))
    comp(rms_norm_kernel, dict(x_ptr="*bf16", w_ptr="*bf16", y_ptr="*bf16", N="i32", stride_x="i32", eps="fp32"),
         dict(BLOCK=2048, OUT=out, USE_LIBDEVICE=True))
    comp(add_rms_norm_kernel, dict(x_ptr="*bf16", res_ptr="*bf16", w_ptr="*bf16", s_ptr="*bf16", y_ptr="*bf16",
                                   N="i32", stride_x="i32", stride_r="i32", eps="fp32"),
         dict(BLOCK=4096, OUT=out, USE_LIBDEVICE=True))
    print("compiled", out)
"""


def test_norm_and_router_kernels_compile_for_sm90():
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["compiled", "0", "compiled", "1", "compiled", "2"]


ATTENTION = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from int4lab.kernels.attention_kernel import decode_attention_kernel

SIG = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", cos_ptr="*bf16", sin_ptr="*bf16", qw_ptr="*bf16",
           kw_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", len_ptr="*i64", mask_ptr="*u8", out_ptr="*bf16",
           part_ptr="*fp32", cnt_ptr="*i32", stride_q="i32", stride_k="i32", stride_v="i32", stride_cs="i32",
           stride_mb="i32", stride_mc="i32", C="i32", scaling="fp32", eps_q="fp32", eps_k="fp32")
for name, hq, hkv, norm in (("olmoe", 16, 16, 2), ("qwen3_moe", 32, 4, 1), ("mixtral", 32, 8, 0)):
    for splits in (1, 16):
        cst = dict(HQ=hq, HKV=hkv, G=hq // hkv, GP=max(16, hq // hkv), D=128, DH=64, DHP=64, NORM=norm,
                   QNP=triton.next_power_of_2(hq * 128), KNP=triton.next_power_of_2(hkv * 128), BLOCK_N=64, SPL=256,
                   SPLITS=splits, HAS_MASK=True, USE_LIBDEVICE=True)
        triton.compile(ASTSource(fn=decode_attention_kernel, signature=dict(SIG, **{k: "constexpr" for k in cst}),
                                 constexprs=cst), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print("compiled", name)
"""


def test_decode_attention_kernel_compiles_for_sm90():
    """The three models' head layouts (OLMoE's whole-row q/k norm, Qwen3's per-head norm, Mixtral's none), one
    split and sixteen."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", ATTENTION], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["compiled", "olmoe", "compiled", "qwen3_moe", "compiled", "mixtral"]
