"""Hand-written CUDA kernels for the emulator's own tests: each correct kernel beside a deliberately broken
one. `// BAD` marks the line a finding must name (`bad_line`)."""

from __future__ import annotations

REVERSE = r"""
extern "C" __global__ void reverse(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = x[i];  // WRITE
    __syncthreads();
    y[i] = s[blockDim.x - 1 - threadIdx.x];  // READ
}
"""
REVERSE_NO_BARRIER = REVERSE.replace("    __syncthreads();\n", "")

SCALE_TAIL = r"""
extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < 100) y[i] = 2.0f * x[i];
}
"""
SCALE_OFF_BY_ONE = SCALE_TAIL.replace("if (i < 100) y[i] = 2.0f * x[i];", "if (i <= 100) y[i] = 2.0f * x[i];  // BAD")

# Phase 1 writes t, phase 2 reads another block's part of t: only a grid sync orders them.
ROTATE = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void rotate(const float* __restrict__ x, float* __restrict__ t, float* __restrict__ y) {
    const int n = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 256; i += n) t[i] = x[i] * 2.0f;
    cg::this_grid().sync();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < 256; i += n) y[i] = t[(i + 32) % 256];  // BAD
}
"""
ROTATE_NO_GRID_SYNC = ROTATE.replace("    cg::this_grid().sync();\n", "")

DIVERGENT_BARRIER = r"""
extern "C" __global__ void halves(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    s[threadIdx.x] = x[threadIdx.x];
    if (threadIdx.x < 16) {
        __syncthreads();  // BAD
    }
    __syncthreads();
    y[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
"""

EARLY_EXIT_BARRIER = r"""
extern "C" __global__ void early(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    if (threadIdx.x >= 60) return;
    s[threadIdx.x] = x[threadIdx.x];
    __syncthreads();  // BAD
    y[threadIdx.x] = s[59 - threadIdx.x];
}
"""

WARP_SUM = r"""
extern "C" __global__ void warp_sum(const float* __restrict__ x, float* __restrict__ y) {
    float v = x[threadIdx.x];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off, 32);
    if ((threadIdx.x & 31) == 0) y[threadIdx.x >> 5] = v;
}
"""
PARTIAL_SHUFFLE = r"""
extern "C" __global__ void half_warp(const float* __restrict__ x, float* __restrict__ y) {
    float v = x[threadIdx.x];
    if (threadIdx.x < 16) v += __shfl_down_sync(0xffffffffu, v, 8, 32);  // BAD
    y[threadIdx.x] = v;
}
"""

UNWRITTEN_OUTPUT = r"""
extern "C" __global__ void accumulate(const float* __restrict__ x, float* __restrict__ y) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] + y[i];  // BAD
}
"""

# Block 0 waits for block 1's result through a flag: fine when both are resident, a deadlock when only
# one block is; without the acquiring fence, block 0's reads race with block 1's writes.
HANDOFF = r"""
extern "C" __global__ void handoff(float* __restrict__ y, unsigned* __restrict__ flag) {
    if (blockIdx.x == 0) {
        if (threadIdx.x == 0)
            while (atomicAdd(&flag[0], 0u) == 0u) { }  // SPIN
        __threadfence();  // ACQUIRE
        __syncthreads();
        y[threadIdx.x] = y[blockDim.x + threadIdx.x] + 1.0f;  // READ
    } else {
        y[blockDim.x + threadIdx.x] = 2.0f * threadIdx.x;
        __syncthreads();
        if (threadIdx.x == 0) { __threadfence(); atomicAdd(&flag[0], 1u); }
    }
}
"""
HANDOFF_NO_ACQUIRE = HANDOFF.replace("        __threadfence();  // ACQUIRE\n", "")

HALF_ROUND_TRIP = r"""
#include <cuda_fp16.h>
extern "C" __global__ void halves_out(const float* __restrict__ x, __half* __restrict__ h, float* __restrict__ y) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    h[i] = __float2half(x[i]);
    y[i] = __half2float(h[i]) + rsqrtf(fabsf(x[i]) + 1.0f);
}
"""

# A task of 64 threads in a 128-thread block (as in the persistent kernel): its warps synchronise on named
# barrier 1 of 64 threads while the other warps wait at the __syncthreads after it.
NAMED_TASK = r"""
extern "C" __global__ void task(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x < 64) {
        s[threadIdx.x] = x[i];
        __barrier_sync_count(1, 64);
        y[i] = s[63 - threadIdx.x] * s[0];
        __barrier_sync_count(1, 64);
        s[threadIdx.x] = 2.0f * x[i];
    }
    __syncthreads();
    if (threadIdx.x >= 64) y[i] = s[127 - threadIdx.x];
}
"""
# Threads 64.. write what the task's threads read after a barrier that does not count the writers (the
# __syncwarp lets them run first, so the write precedes the barrier in the emulator's order too).
NAMED_LEAVES_OUT = r"""
extern "C" __global__ void leave_out(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (threadIdx.x < 64) {
        __syncwarp();
        __barrier_sync_count(1, 64);
        y[i] = s[64 + threadIdx.x];  // BAD
    } else {
        s[threadIdx.x] = x[i];  // WRITE
    }
    __syncthreads();
    if (threadIdx.x >= 64) y[i] = s[threadIdx.x];
}
"""
# Every thread reads s[0] (threads 64.. too before the barrier, in the emulator's order: the __syncwarp lets
# them run); after a barrier of the first 64 threads, thread 0 rewrites it, unordered with their reads.
NAMED_SHARED_READ = r"""
extern "C" __global__ void shared_read(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = x[i];
    __syncthreads();
    const float v = s[0];
    if (threadIdx.x < 64) {
        __syncwarp();
        __barrier_sync_count(1, 64);
        if (threadIdx.x == 0) s[0] = 2.0f * v;  // BAD
    }
    __syncthreads();
    y[i] = v + s[threadIdx.x];
}
"""
_NAMED_MISUSE = r"""
extern "C" __global__ void misuse(const float* __restrict__ x, float* __restrict__ y) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    BARRIER  // BAD
    y[i] = x[i];
}
"""
NAMED_OUTSIDER = _NAMED_MISUSE.replace("BARRIER", "if (threadIdx.x < 96) __barrier_sync_count(1, 64);")
NAMED_COUNTS_DISAGREE = _NAMED_MISUSE.replace(
    "BARRIER", "if (threadIdx.x < 64) __barrier_sync_count(1, threadIdx.x < 32 ? 64 : 96);")
NAMED_PART_WARP = _NAMED_MISUSE.replace("BARRIER", "if (threadIdx.x < 48) __barrier_sync_count(1, 48);")
NAMED_EARLY_EXIT = EARLY_EXIT_BARRIER.replace("__syncthreads();  // BAD", "__barrier_sync_count(1, 64);  // BAD")
NAMED_NEVER_COMPLETES = r"""
extern "C" __global__ void stuck(const float* __restrict__ x, float* __restrict__ y) {
    if (threadIdx.x < 32) __barrier_sync_count(1, 64);  // BAD
    __syncthreads();
    y[threadIdx.x] = x[threadIdx.x];
}
"""


def bad_line(source: str, tag: str = "BAD") -> int:
    """1-based line of the line marked `// TAG`."""
    return next(n for n, text in enumerate(source.splitlines(), 1) if text.rstrip().endswith(f"// {tag}"))

# float4 loads and stores through global and shared memory; the broken one reads one float past alignment.
COPY4 = r"""
extern "C" __global__ void copy4(const float* __restrict__ x, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    const float4 a = ((const float4*)(x + 4 * v))[0];
    ((float4*)s)[threadIdx.x] = make_float4(a.w, a.z, a.y, a.x);
    __syncthreads();
    const float4 b = ((const float4*)s)[threadIdx.x];
    ((float4*)(y + 4 * v))[0] = b;
}
"""
COPY4_MISALIGNED = COPY4.replace("((const float4*)(x + 4 * v))[0];", "((const float4*)(x + 4 * v + 1))[0];  // BAD")
