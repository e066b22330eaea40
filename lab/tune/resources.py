"""Compile the GEMV and grouped kernels (plan rows and their neighbours) for a GPU target without a GPU and
report what the compiler did with each.

    TRITON_INTERPRET=0 python -m lab.tune.resources [--arch 90] [--out resources_sm90.json]

For each launch-plan variant: registers per thread and spill bytes (ptxas -v, run on Triton's PTX with
Triton's bundled ptxas), shared memory, and a count of the SASS instructions that matter here: the MMAs
(HGMMA/IGMMA = Hopper warpgroup MMA, IMMA = mma.sync on int8), local-memory traffic (LDL/STL, i.e. spills),
barriers and shuffles (cross-thread reductions), CALLs (the IEEE-division slow path of div_rn), and the split-K
finish's memory ordering (MEMBAR = a fence that waits for this thread's stores to reach L2, ATOMG, CCTL = an L1
invalidate). Counts are
static (instructions in the binary), not executed instructions. No GPU needed: it answers "did the tile spill, is the
MMA the one we meant" before a timing run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

SASS_OPS = ("HGMMA", "IGMMA", "IMMA", "HMMA", "LDL", "STL", "BAR", "SHFL", "LDS", "STS", "LDG", "IMAD", "IDP", "LOP3",
            "PRMT", "FFMA", "MUFU", "CALL", "MEMBAR", "ATOMG", "CCTL")

# (label, block_n, block_k, num_warps, num_stages, prefetch, x_mode, split_k)
VARIANTS = [("dp4a sm90 big row bn16 bk2048 w4, fused quant", 16, 2048, 4, 2, False, 1, 1),
            ("dp4a sm90 small row bn8 bk2048 w4, fused quant", 8, 2048, 4, 2, False, 1, 1),
            ("dp4a sm90 routed row bn32 bk1024 w4, SwiGLU + combine", 32, 1024, 4, 2, False, 2, 1),
            ("dp4a bn16 bk2048 w4, codes in, split 4", 16, 2048, 4, 2, False, 0, 4),
            ("dp4a bn16 bk1024 w4 prefetch, fused quant", 16, 1024, 4, 2, True, 1, 1)]


# Grouped kernels: (label, kind, block_m, block_n, block_k, num_warps, split_k, topk, tile_major[, half_tiles])
GROUPED_VARIANTS = [
    ("grouped dp4a bm1 bn32 bk512 w4 tile-major (sm90 table, < 4 rows)", "dp4a", 1, 32, 512, 4, 1, 1, True),
    ("grouped dp4a bm1 bn32 bk1024 w4 (the routed row's tile)", "dp4a", 1, 32, 1024, 4, 1, 1, False),
    ("grouped dp4a bm4 bn32 bk512 w4, split 2", "dp4a", 4, 32, 512, 4, 2, 1, False),
    ("grouped dp4a bm8 bn16 bk512 w4, combine", "dp4a", 8, 16, 512, 4, 1, 8, False),
    ("grouped mma bm8 bn64 bk128 w4 tile-major (sm90 table, >= 4 rows)", "mma", 8, 64, 128, 4, 1, 1, True),
    ("grouped mma bm16 bn64 bk128 w4 tile-major (sm90 table, >= 8 rows)", "mma", 16, 64, 128, 4, 1, 1, True),
    ("grouped mma bm32 bn64 bk128 w4 tile-major (sm90 table, >= 16 rows)", "mma", 32, 64, 128, 4, 1, 1, True),
    ("grouped mma bm16 bn64 bk32 w4 (one block per step)", "mma", 16, 64, 32, 4, 1, 1, False),
    ("grouped mma bm16 bn64 bk128 w4, combine", "mma", 16, 64, 128, 4, 1, 8, True),
    ("grouped mma bm16 bn64 bk128 w4 tile-major, half loops (sm90 table)", "mma", 16, 64, 128, 4, 1, 1, True, True)]

def _tool(name):
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def compile_variant(bn, bk, nw, ns, prefetch, x_mode, split_k, arch=90):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from int4lab.kernels.gemv_dp4a import gemv_dp4a_kernel
    x_ty = "*i32" if x_mode == 0 else "*bf16"
    sig = {"x_ptr": x_ty, "xs_ptr": "*fp32", "w_ptr": "*i32", "ws_ptr": "*fp16",
           "eid_ptr": "*i32", "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32", "tw_ptr": "*fp32",
           "R": "i32", "N": "i32", "K": "i32", "E": "i32", "stride_x": "i32", "stride_xs": "i32",
           # strides of a K = 4096 row: multiples of 16, as Triton specialises them at run time
           "stride_we": "i32", "KW": "i32", "stride_se": "i32", "KB": "i32"}
    cst = {"X_MODE": x_mode, "ROWS_PER_X": 1, "TILES_PER_SPLIT": 2, "SPLIT_K": split_k,
           "TOPK": 8 if x_mode == 2 else 1, "BLOCK_N": bn, "BLOCK_K": bk, "HAS_EIDS": x_mode == 2,
           "HAS_W": x_mode == 2, "USE_ASM": True, "PREFETCH": prefetch}
    sig.update({k: "constexpr" for k in cst})
    fn = gemv_dp4a_kernel
    # What Triton infers at run time: pointers from torch are 16-byte aligned; integer arguments that are
    # multiples of 16 are specialised as such (the strides of a K = 4096 row).
    names = list(sig)
    aligned = [k for k, t in sig.items() if t.startswith("*")] + ["stride_we", "KW", "stride_se", "KB"]
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in aligned}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=cst, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": nw, "num_stages": ns})


def compile_grouped(kind, bm, bn, bk, nw, split_k, topk, tile_major, half_tiles=False, arch=90, fn=None,
                    w_tma=False, maxnreg=None):
    """The grouped kernel (int4lab.kernels.grouped_kernel) for `arch`. fn: a variant of it instead of the tree's; w_tma:
    the weights as a TensorDescriptor of a [bn, bk / 2] box (the sm_90 table's path, where the kernel has it);
    maxnreg: a cap on registers per thread (ptxas spills what does not fit)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from int4lab.kernels.grouped_kernel import grouped_kernel
    dp4a = kind == "dp4a"
    sig = {"x_ptr": "*i32" if dp4a else "*i8", "xs_ptr": "*fp32", "w_ptr": "*i32" if dp4a else "*u8",
           "ws_ptr": "*fp16", "order_ptr": "*i32", "row0_ptr": "*i32", "rows_ptr": "*i32", "group_ptr": "*i32",
           "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32", "tw_ptr": "*fp32", "L": "i32", "N": "i32",
           "E": "i32", "stride_x": "i32", "stride_xs": "i32", "stride_we": "i32", "KW": "i32",
           "stride_se": "i32", "KB": "i32"}
    cst = {"ROWS_PER_X": 1, "TILES_PER_SPLIT": 2, "SPLIT_K": split_k, "TOPK": topk, "BLOCK_M": bm, "BLOCK_N": bn,
           "BLOCK_K": bk, "HAS_W": topk > 1}
    cst["TILE_MAJOR"] = tile_major
    cst["USE_ASM"] = True
    cst["MMA"] = not dp4a
    if half_tiles:
        cst["HALF_TILES"] = True
    if w_tma:
        cst["W_TMA"] = True
        sig["w_ptr"] = f"tensordesc<u8[{bn}, {bk // 2}]>"
    sig.update({k: "constexpr" for k in cst})
    names = list(sig)
    aligned = [k for k, t in sig.items() if t.startswith("*")] + ["stride_x", "stride_we", names[18], "stride_se", "KB"]
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in aligned}
    fn = fn or grouped_kernel
    return triton.compile(ASTSource(fn=fn, signature=sig,
                                    constexprs=cst, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": nw, "maxnreg": maxnreg,
                                                                       "num_stages": 2 if dp4a else 3})


def loops(sass: str) -> list[list[str]]:
    """The opcodes (no predicate, no modifiers) of every loop body in one function's SASS: from a backward branch's
    target to the branch. The compiler reports of the kernel notes count instructions per K step this way."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in
           re.finditer(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?[A-Z0-9.]+[^;]*);", sass)]
    out = []
    for addr, op in ins:
        t = re.search(r"BRA.*?0x([0-9a-f]+)", op)
        if t and int(t.group(1), 16) < addr:
            out.append([re.sub(r"^@!?U?P\w+\s+", "", o).split()[0].split(".")[0] for a, o in ins
                        if int(t.group(1), 16) <= a <= addr])
    return out


def report(kernel, arch=90) -> dict:
    with tempfile.TemporaryDirectory() as d:
        ptx, cubin = Path(d) / "k.ptx", Path(d) / "k.cubin"
        ptx.write_text(kernel.asm["ptx"])
        cubin.write_bytes(kernel.asm["cubin"])
        v = subprocess.run([str(_tool("ptxas")), f"-arch=sm_{arch}a" if arch >= 90 else f"-arch=sm_{arch}", "-v",
                            str(ptx), "-o", str(Path(d) / "v.cubin")], capture_output=True, text=True).stderr
        sass = subprocess.run([str(_tool("cuobjdump")), "--dump-sass", str(cubin)], capture_output=True,
                              text=True).stdout
    regs = re.search(r"Used (\d+) registers", v)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", v)
    inst = re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9.]+)", sass)    # /*addr*/ [@P] OP.mod
    full = [m.group(1) for m in inst]
    ops = Counter(op.split(".")[0] for op in full)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spill.group(1)) if spill else None,
            "spill_load_bytes": int(spill.group(2)) if spill else None,
            "shared_bytes": kernel.metadata.shared,
            "sass_counts": {k: ops.get(k, 0) for k in SASS_OPS},
            "ldg_128": sum(op.startswith("LDG") and op.endswith(".128") for op in full)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="compute capability to compile for (90 = H100/H200)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as JSON here")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("set TRITON_INTERPRET=0: this compiles for a GPU target instead of interpreting")
    from int4lab.files import cli_out_ok
    if args.out and not cli_out_ok(args.out):             # before anything compiles
        return 2
    rows = []
    todo = [(label, compile_variant, cfg) for label, *cfg in VARIANTS]
    todo += [(label, compile_grouped, cfg) for label, *cfg in GROUPED_VARIANTS]
    for label, build, cfg in todo:
        r = {"variant": label, **report(build(*cfg, arch=args.arch), args.arch)}
        rows.append(r)
        c = r["sass_counts"]
        print(f"{label:44s} regs {r['registers']!s:>4} spill st/ld {r['spill_store_bytes']!s:>5}/"
              f"{r['spill_load_bytes']!s:<5} smem {r['shared_bytes']:6d}  " +
              " ".join(f"{k} {c[k]}" for k in ("IGMMA", "IMMA", "LDL", "STL", "BAR", "SHFL", "IDP", "PRMT", "CALL", "MEMBAR",
                                                   "ATOMG", "CCTL")) +
              f" LDG.128 {r['ldg_128']}",
              flush=True)
    if args.out:
        import triton
        from int4lab.files import write_text_atomic
        write_text_atomic(args.out, json.dumps({"arch": args.arch, "triton": triton.__version__,
                                        "command": "TRITON_INTERPRET=0 python -m lab.tune.resources",
                                        "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
