// v41 probe (notes/perf.md): the grouped W4A8 tile of grouped_mma.py hand-written in CUDA, for the maintainers'
// decision on issue 14 (is a CUDA kernel in scope?). Not a kernel of the library: scripts/probe_cuda_w4a8.py
// builds it on the GPU (torch.utils.cpp_extension.load_inline) and times it beside the Triton tile.
//
// Contract: gemm_int4_b32_grouped without split-K and without topk_w. out bf16 [L, N]: row r = order[...] of a
// tile of build_group_tiles(ids, E, 8 * NI) = x row r / rows_per_x times expert group[tile]'s weights.
// xq int8 [*, K] and xs float32 [*, K/32] as the library's quantisers give them, but the codes in quad order (per
// 128-wide chunk, lane t's 32 bytes contiguous: for blocks b = 0..3 the even-k then the odd-k bytes of 8t .. 8t + 7)
// and the scales divided by 16 (exact): quad_order_x() in the .py, which a quantiser for this kernel would emit
// at no cost. ws float16 [E, N, K/32]; w uint8 [E, N, K/2] in quad order: per weight row and 128-wide chunk c of
// K, 64 bytes that hold, for t = 0..3, the 32-bit word t of blocks 4c .. 4c + 3 (a lossless byte permutation of
// int4-b32, made once at load time: quad_order_w()). K % 128 == 0.
//
// Numerics are those of the Triton tile at block_k 128: per 32-block an exact int32 dot, scaled as
// d * (ws * xs) into one of four per-block-column float32 sums (column = block % 4), folded once as
// ((c0 + c1) + (c2 + c3)), rounded once to bf16.
//
// The tile (one warp): weights on the MMA's M side (mma.sync m16n8k32 s8), MI fragments of 16 weight rows, the
// tile's rows on the N side (NI fragments of 8). Why quad order: in m16n8k32 the lane (g = lane / 4, t = lane % 4)
// holds row g's and row g + 8's k = 4t..4t+3 and 4t+16..4t+19. Taking *logical* k 4t + i as physical k 8t + 2i
// (the low nibble of byte i of word t) and 4t + 16 + i as 8t + 2i + 1 (its high nibble), a lane's A operand for
// one block is one 32-bit word of each of its two rows, and in quad order four blocks of it are one 16-byte load.
// The activations take the same permutation (quad_order_x), so a lane's B operands of a chunk are two 16-byte loads.
// Decode: a nibble n moved to the top of its byte and its sign bit flipped is 16 (n - 8) as an int8, one LOP3
// (high nibbles) or SHF + LOP3 (low): the dot is 16 d, exact in int32 and in float32, and ws * (xs / 16) is
// exactly (ws * xs) / 16, so fma(16 d, ws * xs / 16, acc) has the Triton tile's bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace v41 {

__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// Weights are read once per tile: no L1 allocation (the activations, read by every warp, keep L1).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ uint2 ld_stream2(const void* p) {
  uint2 r;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

// cp.async: each lane copies only the bytes it will read itself, so a ring in shared memory needs no barrier,
// only the lane's own wait_group.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async8(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// (a & 0xF0F0F0F0) ^ 0x80808080 in one LOP3 (the compiler emits two: an instruction takes one immediate).
__device__ __forceinline__ uint32_t top_nibbles_signed(uint32_t a) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(r) : "r"(a), "r"(0xF0F0F0F0u), "r"(0x80808080u));
  return r;
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ float half_at(const uint2& v, int j) {
  const uint32_t w = j < 2 ? v.x : v.y;
  return __half2float(__ushort_as_half(static_cast<unsigned short>((j & 1) ? (w >> 16) : (w & 0xFFFF))));
}

template <int MI>
__device__ __forceinline__ void load_w(uint4 (&A)[MI][2], uint2 (&S)[MI][2], const uint8_t* const (&wp)[MI],
                                       const __half* const (&sp)[MI], int c, size_t w8, size_t s8) {
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    A[i][0] = ld_stream(wp[i] + 64 * c);
    A[i][1] = ld_stream(wp[i] + w8 + 64 * c);
    S[i][0] = ld_stream2(sp[i] + 4 * c);
    S[i][1] = ld_stream2(sp[i] + s8 + 4 * c);
  }
}

// One 128-wide chunk c: the tile's x codes and scales, then per block b and fragment pair one MMA and its scaling.
template <int MI, int NI>
__device__ __forceinline__ void chunk(float (&acc)[MI][NI][4][4], const uint4 (&A)[MI][2], const uint2 (&S)[MI][2],
                                      const uint4* const (&xb)[NI], const float4* const (&xsc)[NI][2], int c) {
  uint4 X[NI][2];
  float4 XS[NI][2];
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    X[j][0] = xb[j][8 * c];                 // quad order: lane t's 32 bytes of the chunk are contiguous
    X[j][1] = xb[j][8 * c + 1];
    XS[j][0] = xsc[j][0][c];                // xs / 16
    XS[j][1] = xsc[j][1][c];
  }
#pragma unroll
  for (int b = 0; b < 4; ++b) {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const uint32_t wg = word(A[i][0], b), wh = word(A[i][1], b);
      const uint32_t a0 = top_nibbles_signed(wg << 4);   // 16 (n - 8), low nibbles, row g
      const uint32_t a1 = top_nibbles_signed(wh << 4);   // row g + 8
      const uint32_t a2 = top_nibbles_signed(wg);        // high nibbles, row g
      const uint32_t a3 = top_nibbles_signed(wh);
      const float sg = half_at(S[i][0], b), sh = half_at(S[i][1], b);
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        int d[4];
        mma_s8(d, a0, a1, a2, a3, word(X[j][b >> 1], 2 * (b & 1)), word(X[j][b >> 1], 2 * (b & 1) + 1));
        const float x0 = b == 0 ? XS[j][0].x : b == 1 ? XS[j][0].y : b == 2 ? XS[j][0].z : XS[j][0].w;
        const float x1 = b == 0 ? XS[j][1].x : b == 1 ? XS[j][1].y : b == 2 ? XS[j][1].z : XS[j][1].w;
        acc[i][j][0][b] = fmaf(static_cast<float>(d[0]), sg * x0, acc[i][j][0][b]);   // row g, col 2t
        acc[i][j][1][b] = fmaf(static_cast<float>(d[1]), sg * x1, acc[i][j][1][b]);   // row g, col 2t+1
        acc[i][j][2][b] = fmaf(static_cast<float>(d[2]), sh * x0, acc[i][j][2][b]);   // row g+8
        acc[i][j][3][b] = fmaf(static_cast<float>(d[3]), sh * x1, acc[i][j][3][b]);
      }
    }
  }
}

// Dynamic shared memory of one program: STAGES chunks of each warp's weight words (16 bytes) and scales (8 bytes)
// per lane, weight row half and fragment.
constexpr int ring_bytes(int mi, int warps, int stages) { return warps * stages * mi * 2 * 32 * (16 + 8); }

template <int MI, int NI, int WARPS, int STAGES>
__global__ void __launch_bounds__(32 * WARPS)
grouped_w4a8_tile(const int8_t* __restrict__ xq, const float* __restrict__ xs, const uint8_t* __restrict__ w,
                  const __half* __restrict__ ws, const int* __restrict__ order, const int* __restrict__ row0,
                  const int* __restrict__ rows, const int* __restrict__ group, __nv_bfloat16* __restrict__ out,
                  int N, int K, int E, int stride_x, int stride_xs, int rows_per_x) {
  const int tile = blockIdx.x;
  const int n_rows = rows[tile];
  if (n_rows == 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = (blockIdx.y * WARPS + warp) * 16 * MI;
  const int r0 = row0[tile];
  int e = group[tile];
  const bool valid = e < E;         // the invalid-id bucket: NaN rows, no expert memory read
  if (!valid) e = 0;
  const int KH = K / 2, KB = K / 32, KC = valid ? K / 128 : 0;

  // The tile's rows this lane multiplies (B column 8j + g) and owns in the output (C columns 8j + 2t + h).
  // A dead row multiplies x row 0 (the same lines for every lane); its sums are never written.
  const uint4* xb[NI];
  const float4* xsc[NI][2];
  int rc[NI][2];
#pragma unroll
  for (int j = 0; j < NI; ++j) {
    const int col = 8 * j + g;
    const int r = col < n_rows ? order[r0 + col] : 0;
    xb[j] = reinterpret_cast<const uint4*>(xq + static_cast<size_t>(r / rows_per_x) * stride_x + 32 * t);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int cc = 8 * j + 2 * t + h;
      rc[j][h] = cc < n_rows ? order[r0 + cc] : -1;
      xsc[j][h] = reinterpret_cast<const float4*>(xs + static_cast<size_t>(max(rc[j][h], 0) / rows_per_x) * stride_xs);
    }
  }
  const uint8_t* wp[MI];
  const __half* sp[MI];
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const size_t row = static_cast<size_t>(e) * N + n0 + 16 * i + g;
    wp[i] = w + row * KH + 16 * t;
    sp[i] = ws + row * KB;
  }
  const size_t w8 = static_cast<size_t>(8) * KH, s8 = static_cast<size_t>(8) * KB;

  float acc[MI][NI][4][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[i][j][q][b] = 0.f;

  if constexpr (STAGES == 0) {
    // One chunk ahead in registers: the weights and their scales of chunk c + 1 are asked before chunk c's MMAs.
    // Two register sets, unrolled by two so that neither is copied into the other.
    uint4 A0[MI][2], A1[MI][2];
    uint2 S0[MI][2], S1[MI][2];
    load_w<MI>(A0, S0, wp, sp, 0, w8, s8);
    int c = 0;
  #pragma unroll 1
    for (; c + 1 < KC; c += 2) {
      load_w<MI>(A1, S1, wp, sp, c + 1, w8, s8);
      chunk<MI, NI>(acc, A0, S0, xb, xsc, c);
      load_w<MI>(A0, S0, wp, sp, c + 2 < KC ? c + 2 : c + 1, w8, s8);   // past the end: ask again, an L2 hit
      chunk<MI, NI>(acc, A1, S1, xb, xsc, c + 1);
    }
    if (c < KC) chunk<MI, NI>(acc, A0, S0, xb, xsc, c);
  } else {
    // STAGES - 1 chunks ahead through a ring in shared memory (cp.async): more bytes in flight per warp than the
    // registers can hold.
    extern __shared__ uint4 smem[];
    uint4* ring_a = smem + warp * STAGES * MI * 2 * 32;
    uint2* ring_s = reinterpret_cast<uint2*>(smem + WARPS * STAGES * MI * 2 * 32) + warp * STAGES * MI * 2 * 32;
    auto issue = [&](int c, int slot) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          cp_async16(ring_a + ((slot * MI + i) * 2 + hh) * 32 + lane, wp[i] + hh * w8 + 64 * c);
          cp_async8(ring_s + ((slot * MI + i) * 2 + hh) * 32 + lane, sp[i] + hh * s8 + 4 * c);
        }
    };
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < KC) issue(st, st);
      cp_commit();
    }
    int slot = 0;
#pragma unroll 1
    for (int c = 0; c < KC; ++c) {
      cp_wait<STAGES - 2>();                               // this lane's copies of chunk c have landed
      if (c + STAGES - 1 < KC) issue(c + STAGES - 1, slot == 0 ? STAGES - 1 : slot - 1);   // the slot read last
      cp_commit();
      uint4 A[MI][2];
      uint2 S[MI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          A[i][hh] = ring_a[((slot * MI + i) * 2 + hh) * 32 + lane];
          S[i][hh] = ring_s[((slot * MI + i) * 2 + hh) * 32 + lane];
        }
      chunk<MI, NI>(acc, A, S, xb, xsc, c);
      slot = slot + 1 == STAGES ? 0 : slot + 1;
    }
  }
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int h = q & 1;
        if (rc[j][h] < 0) continue;
        const float* a = acc[i][j][q];
        const float y = valid ? (a[0] + a[1]) + (a[2] + a[3]) : __int_as_float(0x7FC00000);
        out[static_cast<size_t>(rc[j][h]) * N + n0 + 16 * i + g + 8 * (q >> 1)] = __float2bfloat16_rn(y);
      }
}

}  // namespace v41

// The instantiations the probe times: (MI, NI, WARPS, STAGES); STAGES 0: one chunk ahead in registers.
#define V41_CONFIGS(X)                                                                                           \
  X(1, 1, 4, 0) X(2, 1, 4, 0) X(2, 2, 4, 0) X(2, 1, 2, 0) X(2, 1, 4, 4) X(2, 1, 4, 6) X(2, 1, 2, 8) X(1, 1, 4, 6)  \
  X(1, 1, 8, 4) X(2, 2, 4, 4) X(2, 2, 4, 6) X(1, 2, 4, 6)

#ifdef V41_TORCH
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <torch/extension.h>

// grid (T, N / (16 MI WARPS)); checks of shapes and alignment are the Python wrapper's.
void grouped_w4a8(torch::Tensor xq, torch::Tensor xs, torch::Tensor w, torch::Tensor ws, torch::Tensor order,
                  torch::Tensor row0, torch::Tensor rows, torch::Tensor group, torch::Tensor out, int64_t rows_per_x,
                  int64_t mi, int64_t ni, int64_t warps, int64_t stages) {
  const int E = w.size(0), N = w.size(1), K = w.size(2) * 2, T = row0.size(0);
  auto stream = at::cuda::getCurrentCUDAStream();
  bool launched = false;
#define V41_LAUNCH(MI_, NI_, W_, S_)                                                                              \
  if (!launched && mi == MI_ && ni == NI_ && warps == W_ && stages == S_) {                                       \
    dim3 grid(T, N / (16 * MI_ * W_));                                                                            \
    const int smem = S_ ? v41::ring_bytes(MI_, W_, S_) : 0;                                                      \
    if (smem > 48 * 1024)                                                                                          \
      C10_CUDA_CHECK(cudaFuncSetAttribute(v41::grouped_w4a8_tile<MI_, NI_, W_, S_>,                               \
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));                    \
    v41::grouped_w4a8_tile<MI_, NI_, W_, S_><<<grid, 32 * W_, smem, stream>>>(                                    \
        xq.data_ptr<int8_t>(), xs.data_ptr<float>(), w.data_ptr<uint8_t>(),                                       \
        reinterpret_cast<const __half*>(ws.data_ptr<at::Half>()), order.data_ptr<int>(), row0.data_ptr<int>(),    \
        rows.data_ptr<int>(), group.data_ptr<int>(), reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>()), \
        N, K, E, xq.stride(0), xs.stride(0), rows_per_x);                                                          \
    launched = true;                                                                                               \
  }
  V41_CONFIGS(V41_LAUNCH)
#undef V41_LAUNCH
  TORCH_CHECK(launched, "no instantiation for (mi, ni, warps, stages) = (", mi, ", ", ni, ", ", warps, ", ", stages, ")");
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
#else
// For the compiler report (nvcc -cubin, no torch): every configuration instantiated.
#define V41_INST(MI_, NI_, W_, S_)                                                                              \
  template __global__ void v41::grouped_w4a8_tile<MI_, NI_, W_, S_>(const int8_t*, const float*, const uint8_t*,     \
      const __half*, const int*, const int*, const int*, const int*, __nv_bfloat16*, int, int, int, int, int, int);
V41_CONFIGS(V41_INST)
#endif
