// tileweave cuda-sim prelude: the CUDA built-ins that printed kernels use, defined for the host so the
// printed source compiles with g++ and runs as SIMT threads under the emulator runtime (runtime.cpp).
//
// Every pointer to a scalar type in the printed source is rewritten (transform.py) into tw::ptr<T>, a
// checked pointer that knows the buffer it points into; `p[i]` yields a tw::ref<T> whose reads and writes
// are checked (bounds, never-written memory, races) and counted, with the source line taken from the index
// conversion (__builtin_LINE() as a default argument). Register arrays stay plain C++ arrays.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// Checks sit in every kernel's innermost loops: GCC must inline them even into huge kernel functions.
#define TW_HOT __attribute__((always_inline)) inline

namespace tw {

constexpr uint32_t NOBODY = 0xFFFFFFFFu;  // a cell never written / without a reader
constexpr uint32_t HOST = 0xFFFFFFFEu;    // written before the launch (host copy, atomics): ordered with all
constexpr uint16_t MANY = 0xFFFFu;        // several threads read the cell in the same epoch

// One access as the race detector remembers it: grid epoch (kernel launch or grid sync), block, block
// barrier epoch (the block's count of completed barriers, __syncthreads and named), source line, thread
// within the block, warp epoch (__syncwarp) of that thread's warp. Reads by several threads (thread ==
// MANY) keep the highest reader's thread index in `wep` instead: a named barrier orders them only if it
// counts that thread (its participants are a prefix of the block's threads).
struct Access {
    uint32_t g, block, ep, line;
    uint16_t thread, wep;
};
struct Cell {
    Access w, r;  // last write, last read(s)
};

enum Space : int { GLOBAL = 0, SHARED = 1 };

// A region of memory a checked pointer may address. `shadow` (null for read-only, initialised buffers:
// inputs and weights) holds one Cell per granule of 2^shift bytes, starting at `base`.
struct Buffer {
    char* base;
    int64_t size;
    Cell* shadow;
    int shift;
    int space;
    const char* name;
    Buffer* whole;  // a shared-memory region: the block's whole dynamic shared memory (else itself)
};

struct Dim3 {
    unsigned x, y, z;
};

// What the inline checks need of the running thread; the runtime's Thread starts with this.
struct ThreadView {
    Dim3 tid, bid;
    uint32_t block;  // linear block index
    uint32_t lin;    // linear thread index in the block
    uint32_t* bep;   // the block's barrier epoch
    uint32_t* cover;  // per thread of the block: the epoch of the last barrier that counted it
    uint16_t* wep;   // the warp's __syncwarp epoch
    Buffer* smem;    // the block's dynamic shared memory
};

}  // namespace tw

#pragma GCC visibility push(default)  // the runtime defines these; kernel libraries are built hidden
extern "C" {
extern tw::ThreadView* tw_cur;  // the thread running now
extern uint32_t tw_g;           // grid epoch: +1 per launch and per grid sync
extern tw::Dim3 tw_block_dim, tw_grid_dim;
extern uint64_t tw_bytes[4];  // bytes loaded/stored: [space * 2 + is_store]
void tw_report_oor(const tw::Buffer* b, int64_t off, int64_t n, int line, int write);
void tw_report_misaligned(const tw::Buffer* b, int64_t off, int64_t n, int line, int write);
void tw_report_uninit(const tw::Buffer* b, int64_t off, int line);
void tw_report_race(const tw::Buffer* b, int64_t off, const tw::Access* prev, int prev_write, int write, int line);
int tw_ordered_across(uint32_t block, uint32_t ep);
const tw::Buffer* tw_narrow(const tw::Buffer* whole, const char* at, int line);
void tw_syncthreads(int line);
void tw_named_barrier(unsigned id, unsigned count, int line);
void tw_grid_sync(int line);
void tw_threadfence(void);
void tw_atomic_done(const tw::Buffer* b, const void* at, int64_t n, int changed, int line);
uint64_t tw_warp_op(int op, unsigned mask, uint64_t value, int arg, int width, int line);
float* tw_warp_scratch(int* lane);  // the running thread's warp's scratch (32 lanes x 6 floats), its lane
}
#pragma GCC visibility pop

#define threadIdx (tw_cur->tid)
#define blockIdx (tw_cur->bid)
#define blockDim (tw_block_dim)
#define gridDim (tw_grid_dim)
#define warpSize 32
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__
#define __syncthreads() tw_syncthreads(__LINE__)

#pragma GCC visibility push(default)
extern "C" int tw_check_read(const tw::Buffer* b, const void* p, int64_t n, int line);
extern "C" int tw_check_write(const tw::Buffer* b, const void* p, int64_t n, int line, const void* value);
#pragma GCC visibility pop

namespace tw {

// `value`: the bytes a write stores (a write-write race that stores the value already there says so).
template <bool WRITE>
TW_HOT bool check(const Buffer* b, const void* p, int64_t n, int line, const void* value = nullptr) {
    if (!b) return true;  // a raw pointer (e.g. into a register array): unchecked
    return WRITE ? tw_check_write(b, p, n, line, value) : tw_check_read(b, p, n, line);
}

template <class T>
struct ref;

// A vector access (float2/float4) must be aligned to its size, as on a GPU (where a misaligned one faults):
// tensors and shared buffers start aligned (256 B / 16 B), so the offset into the buffer decides. A
// misaligned access is reported and not performed.
template <class T>
TW_HOT bool aligned(const Buffer* b, const void* p, int line, int write) {
    if constexpr (alignof(T) <= 4) return true;
    if (!b) return true;
    const int64_t off = (const char*)p - b->base;
    if (off % (int64_t)alignof(T) == 0) return true;
    tw_report_misaligned(b, off, sizeof(T), line, write);
    return false;
}

// The index of p[i] with the line of the expression that converted it.
struct Idx {
    int64_t v;
    int line;
    template <class I, class = std::enable_if_t<std::is_integral_v<I> || std::is_enum_v<I>>>
    Idx(I i, int l = __builtin_LINE()) : v((int64_t)i), line(l) {}
    template <class U>
    Idx(const ref<U>& r, int l = __builtin_LINE());
};

template <class T>
struct ptr {
    using element = T;
    T* p = nullptr;
    const Buffer* b = nullptr;

    ptr() = default;
    ptr(std::nullptr_t) {}
    ptr(T* raw) : p(raw) {}  // a pointer the emulator did not hand out: unchecked
    ptr(T* raw, const Buffer* buf) : p(raw), b(buf) {}
    template <class U, class = std::enable_if_t<std::is_convertible_v<U*, T*>>>
    ptr(const ptr<U>& o) : p(o.p), b(o.b) {}  // float* -> const float*
    // Casts, e.g. (float*)(smem + 64): a cast of the whole dynamic shared memory at a line where a block
    // buffer is declared is bounded to that buffer's region (tw_narrow).
    template <class U, class = std::enable_if_t<!std::is_convertible_v<U*, T*>>, class = void>
    explicit ptr(const ptr<U>& o, int line = __builtin_LINE())
        : p((T*)(void*)o.p), b(o.b && o.b->space == SHARED && o.b->whole == o.b ? tw_narrow(o.b, (const char*)o.p, line)
                                                                                : o.b) {}
    template <class U>
    explicit ptr(const ref<ptr<U>>& r, int line = __builtin_LINE());

    TW_HOT ref<T> operator[](Idx i) const { return ref<T>(p + i.v, b, i.line); }
    ref<T> operator*() const { return ref<T>(p, b, 0); }
    ptr operator+(int64_t n) const { return ptr(p + n, b); }
    ptr operator-(int64_t n) const { return ptr(p - n, b); }
    int64_t operator-(const ptr& o) const { return p - o.p; }
    ptr& operator+=(int64_t n) { p += n; return *this; }
    ptr& operator-=(int64_t n) { p -= n; return *this; }
    ptr& operator++() { ++p; return *this; }
    ptr& operator--() { --p; return *this; }
    ptr operator++(int) { ptr o = *this; ++p; return o; }
    ptr operator--(int) { ptr o = *this; --p; return o; }
    explicit operator bool() const { return p != nullptr; }
    bool operator==(const ptr& o) const { return p == o.p; }
    bool operator!=(const ptr& o) const { return p != o.p; }
    bool operator<(const ptr& o) const { return p < o.p; }
};

template <class T>
inline ptr<T> operator+(int64_t n, const ptr<T>& q) { return q + n; }

template <class T>
struct ref {
    using V = std::remove_cv_t<T>;
    T* p;
    const Buffer* b;
    int line;

    ref(T* at, const Buffer* buf, int l) : p(at), b(buf), line(l) {}
    ref(const ref&) = default;
    TW_HOT V load() const {
        V v;
        if (aligned<V>(b, p, line, 0) && check<false>(b, p, sizeof(T), line)) std::memcpy((void*)&v, (const void*)p, sizeof(T));
        else std::memset((void*)&v, 0, sizeof(T));
        return v;
    }
    TW_HOT void store(const V& v) const {
        if (aligned<V>(b, p, line, 1) && check<true>(b, p, sizeof(T), line, &v)) std::memcpy((void*)p, (const void*)&v, sizeof(T));
    }
    TW_HOT operator V() const { return load(); }
    TW_HOT const ref& operator=(const V& v) const { store(v); return *this; }
    TW_HOT const ref& operator=(const ref& o) const { store(o.load()); return *this; }
    template <class X> const ref& operator+=(const X& x) const { store(load() + x); return *this; }
    template <class X> const ref& operator-=(const X& x) const { store(load() - x); return *this; }
    template <class X> const ref& operator*=(const X& x) const { store(load() * x); return *this; }
    template <class X> const ref& operator/=(const X& x) const { store(load() / x); return *this; }
    template <class X> const ref& operator|=(const X& x) const { store(load() | x); return *this; }
    template <class X> const ref& operator&=(const X& x) const { store(load() & x); return *this; }
    const ref& operator++() const { store(load() + 1); return *this; }
    const ref& operator--() const { store(load() - 1); return *this; }
    V operator++(int) const { V v = load(); store(v + 1); return v; }
    V operator--(int) const { V v = load(); store(v - 1); return v; }
    ptr<T> operator&() const { return ptr<T>(p, b); }
};

template <class U>
Idx::Idx(const ref<U>& r, int l) : v((int64_t)r.load()), line(l) {}

template <class T>
template <class U>
ptr<T>::ptr(const ref<ptr<U>>& r, int) {
    const ptr<U> q = r.load();  // a pointer read from memory (the persistent kernel's buffer table)
    p = (T*)(void*)q.p;
    b = q.b;
}

template <class T>
struct plain { using type = T; };
template <class T>
struct plain<ref<T>> { using type = std::remove_cv_t<T>; };
template <class T>
using plain_t = typename plain<std::decay_t<T>>::type;

// The block's dynamic shared memory (`extern __shared__ T name[]` becomes a use of this).
template <class T>
inline ptr<T> dynamic_shared() { return ptr<T>((T*)(void*)tw_cur->smem->base, tw_cur->smem); }

template <class T>
inline uint64_t to_bits(const T& v) {
    static_assert(sizeof(T) <= 8, "warp collectives move at most 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

enum WarpOp : int { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR, SYNCWARP, BALLOT, ANY, ALL };

// An atomic read-modify-write: checked like a read and a write, never a race with another atomic;
// `changed` tells the scheduler whether it moved anything (an unchanged result is a spin-wait turn).
template <class T, class F>
inline T atomic_rmw(ptr<T> a, F f, int line) {
    if (a.b) {
        const int64_t off = (const char*)a.p - a.b->base;
        if (off < 0 || off + (int64_t)sizeof(T) > a.b->size) {
            tw_report_oor(a.b, off, sizeof(T), line, 1);
            return T();
        }
    }
    T old;
    std::memcpy(&old, (const void*)a.p, sizeof(T));
    const T now = f(old);
    std::memcpy((void*)a.p, &now, sizeof(T));
    tw_atomic_done(a.b, a.p, sizeof(T), std::memcmp(&old, &now, sizeof(T)) != 0, line);
    return old;
}

}  // namespace tw

// ---- half precision ------------------------------------------------------------------------------------
struct __half {
    uint16_t bits;
    __half() = default;
    __half(float f) { _Float16 h = (_Float16)f; std::memcpy(&bits, &h, 2); }
    operator float() const { _Float16 h; std::memcpy(&h, &bits, 2); return (float)h; }
};
typedef __half half;
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __hadd(__half a, __half b) { return __half((float)a + (float)b); }
inline __half __hmul(__half a, __half b) { return __half((float)a * (float)b); }
inline __half __hsub(__half a, __half b) { return __half((float)a - (float)b); }

// ---- bfloat16 (cuda_bf16.h): the bits, widened exactly and narrowed to nearest even as the device's
// cvt.rn.bf16.f32 does; NaN narrows to the canonical 0x7fff (cuda_bf16.hpp's host path does the same).
struct __nv_bfloat16 {
    uint16_t bits;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        bits = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)0x7fffu : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    operator float() const {
        const uint32_t u = (uint32_t)bits << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};
typedef __nv_bfloat16 nv_bfloat16;
inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }

// ---- vector types (the GEMM's staging loads) ----------------------------------------------------------
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// ---- math ---------------------------------------------------------------------------------------------
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __powf(float a, float b) { return powf(a, b); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float exp10f(float x) { return powf(10.0f, x); }
using std::isinf;  // CUDA declares isnan and isinf globally; C++'s <cmath> in namespace std
using std::isnan;
template <class T>
inline tw::plain_t<T> __ldg(const tw::ptr<T>& p) { return p[0]; }

// ---- synchronisation ----------------------------------------------------------------------------------
inline void __threadfence() { tw_threadfence(); }
inline void __threadfence_block() { tw_threadfence(); }
// `bar.sync id, count`: named barrier `id` (1..15) of the block's first `count` threads (sm_30_intrinsics.h).
inline void __barrier_sync_count(unsigned id, unsigned count, int line = __builtin_LINE()) {
    tw_named_barrier(id, count, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
    tw_warp_op(tw::SYNCWARP, mask, 0, 0, 32, line);
}
template <class T>
inline tw::plain_t<T> __shfl_sync(unsigned mask, const T& v, int src, int width = 32, int line = __builtin_LINE()) {
    using V = tw::plain_t<T>;
    return tw::from_bits<V>(tw_warp_op(tw::SHFL_IDX, mask, tw::to_bits<V>(v), src, width, line));
}
template <class T>
inline tw::plain_t<T> __shfl_up_sync(unsigned mask, const T& v, unsigned d, int width = 32, int line = __builtin_LINE()) {
    using V = tw::plain_t<T>;
    return tw::from_bits<V>(tw_warp_op(tw::SHFL_UP, mask, tw::to_bits<V>(v), (int)d, width, line));
}
template <class T>
inline tw::plain_t<T> __shfl_down_sync(unsigned mask, const T& v, unsigned d, int width = 32,
                                        int line = __builtin_LINE()) {
    using V = tw::plain_t<T>;
    return tw::from_bits<V>(tw_warp_op(tw::SHFL_DOWN, mask, tw::to_bits<V>(v), (int)d, width, line));
}
template <class T>
inline tw::plain_t<T> __shfl_xor_sync(unsigned mask, const T& v, int lm, int width = 32, int line = __builtin_LINE()) {
    using V = tw::plain_t<T>;
    return tw::from_bits<V>(tw_warp_op(tw::SHFL_XOR, mask, tw::to_bits<V>(v), lm, width, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    return (unsigned)tw_warp_op(tw::BALLOT, mask, pred != 0, 0, 32, line);
}
inline int __any_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    return (int)tw_warp_op(tw::ANY, mask, pred != 0, 0, 32, line);
}
inline int __all_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    return (int)tw_warp_op(tw::ALL, mask, pred != 0, 0, 32, line);
}

// ---- tensor cores ---------------------------------------------------------------------------------------
// The printed tw_mma_m16n8k8_tf32 is inline PTX (mma.sync) under #ifndef TW_CUDA_SIM; here it is a warp
// collective: every lane deposits its A and B fragments, rounded to TF32 as cvt.rna.tf32.f32 rounds
// (to nearest, ties away from zero, 10 mantissa bits kept), in its warp's scratch; the warp synchronises;
// each lane computes its own four accumulators from the whole tile; the warp synchronises again before the
// scratch is reused. Fragment layouts as the PTX ISA gives them for m16n8k8 .tf32 (Printer.mma_accumulate).
#define TW_CUDA_SIM 1
inline float tw_tf32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;  // inf / NaN pass unchanged
    std::memcpy(&x, &u, 4);
    return x;
}
inline void tw_mma_m16n8k8_tf32(float& d0, float& d1, float& d2, float& d3, float a0, float a1, float a2, float a3,
                                float b0, float b1, int line = __builtin_LINE()) {
    int lane = 0;
    float* s = tw_warp_scratch(&lane);
    float* mine = s + lane * 6;
    mine[0] = tw_tf32(a0), mine[1] = tw_tf32(a1), mine[2] = tw_tf32(a2), mine[3] = tw_tf32(a3);
    mine[4] = tw_tf32(b0), mine[5] = tw_tf32(b1);
    tw_warp_op(tw::SYNCWARP, 0xffffffffu, 0, 0, 32, line);
    float* d[4] = {&d0, &d1, &d2, &d3};
    const int grp = lane >> 2, tig = lane & 3;
    for (int c = 0; c < 4; ++c) {
        const int row = grp + (c >> 1) * 8, col = tig * 2 + (c & 1);
        float acc = *d[c];
        for (int k = 0; k < 8; ++k) {
            // A(row, k) is a{(row >= 8) + 2 (k >= 4)} of lane 4 (row % 8) + k % 4; B(k, col) is b{k >= 4} of lane 4 col + k % 4.
            const float a = s[((row & 7) * 4 + (k & 3)) * 6 + (row >> 3) + 2 * (k >> 2)];
            const float b = s[(col * 4 + (k & 3)) * 6 + 4 + (k >> 2)];
            acc += a * b;  // exact product: two 11-bit significands
        }
        *d[c] = acc;
    }
    tw_warp_op(tw::SYNCWARP, 0xffffffffu, 0, 0, 32, line);
}

// tw_mma_m16n8k16_f16 (mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32) the same way: each lane deposits
// its four A and two B .f16x2 registers (tw_pack_half2: the lower-numbered element in the low half); each
// lane then sums its four accumulators over k = 0..15 in order from the whole tile in fp32 (the operands
// are fp16 values already: a product of two 11-bit significands is exact in fp32). Fragment layouts of
// PTX ISA 9.7.14.5.8 (Printer.mma_accumulate_f16): A(row, k) is half k & 1 of register (row >= 8) +
// 2 (k >= 8) of lane 4 (row % 8) + (k % 8) / 2; B(k, col) half k & 1 of register k >= 8 of lane 4 col + (k % 8) / 2.
inline unsigned tw_pack_half2(__half lo, __half hi) { return (unsigned)lo.bits | ((unsigned)hi.bits << 16); }
inline float tw_half_of(unsigned reg, int hi) {
    __half h;
    h.bits = (uint16_t)(hi ? reg >> 16 : reg & 0xffffu);
    return (float)h;
}
// The k16 collective over two-element registers whose halves `Of` widens to fp32 (fp16 or bf16 bits).
template <float (*Of)(unsigned, int)>
inline void tw_mma_m16n8k16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2,
                            unsigned a3, unsigned b0, unsigned b1, int line) {
    int lane = 0;
    float* s = tw_warp_scratch(&lane);
    const unsigned regs[6] = {a0, a1, a2, a3, b0, b1};
    std::memcpy(s + lane * 6, regs, sizeof regs);
    tw_warp_op(tw::SYNCWARP, 0xffffffffu, 0, 0, 32, line);
    unsigned tile[32 * 6];
    std::memcpy(tile, s, sizeof tile);
    float* d[4] = {&d0, &d1, &d2, &d3};
    const int grp = lane >> 2, tig = lane & 3;
    for (int c = 0; c < 4; ++c) {
        const int row = grp + (c >> 1) * 8, col = tig * 2 + (c & 1);
        float acc = *d[c];
        for (int k = 0; k < 16; ++k) {
            const float a = Of(tile[((row & 7) * 4 + (k & 7) / 2) * 6 + (row >> 3) + 2 * (k >> 3)], k & 1);
            const float b = Of(tile[(col * 4 + (k & 7) / 2) * 6 + 4 + (k >> 3)], k & 1);
            acc += a * b;
        }
        *d[c] = acc;
    }
    tw_warp_op(tw::SYNCWARP, 0xffffffffu, 0, 0, 32, line);
}
inline void tw_mma_m16n8k16_f16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2,
                                unsigned a3, unsigned b0, unsigned b1, int line = __builtin_LINE()) {
    tw_mma_m16n8k16<tw_half_of>(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, line);
}

// tw_mma_m16n8k16_bf16 (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32): the same collective over
// .bf16x2 registers (the same fragment layout, PTX ISA 9.7.14.5.8); a product of two 8-bit significands is
// exact in fp32.
inline unsigned tw_pack_bf162(__nv_bfloat16 lo, __nv_bfloat16 hi) {
    return (unsigned)lo.bits | ((unsigned)hi.bits << 16);
}
inline float tw_bf16_of(unsigned reg, int hi) {
    const uint32_t u = (hi ? reg >> 16 : reg & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline void tw_mma_m16n8k16_bf16(float& d0, float& d1, float& d2, float& d3, unsigned a0, unsigned a1, unsigned a2,
                                 unsigned a3, unsigned b0, unsigned b1, int line = __builtin_LINE()) {
    tw_mma_m16n8k16<tw_bf16_of>(d0, d1, d2, d3, a0, a1, a2, a3, b0, b1, line);
}

// ---- atomics (the second operand is not deduced, so atomicAdd(&done[i], 1u) binds T from the pointer) ---
template <class T>
struct tw_same { using type = T; };
#define TW_ATOMIC(NAME, EXPR)                                                                        \
    template <class T>                                                                               \
    inline T NAME(tw::ptr<T> a, typename tw_same<T>::type v, int line = __builtin_LINE()) {         \
        return tw::atomic_rmw(a, [&](T old) { return (T)(EXPR); }, line);                          \
    }
TW_ATOMIC(atomicAdd, old + v)
TW_ATOMIC(atomicSub, old - v)
TW_ATOMIC(atomicExch, v)
TW_ATOMIC(atomicMax, old < v ? v : old)
TW_ATOMIC(atomicMin, v < old ? v : old)
TW_ATOMIC(atomicOr, old | v)
TW_ATOMIC(atomicAnd, old & v)
TW_ATOMIC(atomicXor, old ^ v)
TW_ATOMIC(atomicInc, old >= v ? 0 : old + 1)
TW_ATOMIC(atomicDec, (old == 0 || old > v) ? v : old - 1)
#undef TW_ATOMIC
template <class T>
inline T atomicCAS(tw::ptr<T> a, typename tw_same<T>::type cmp, typename tw_same<T>::type v,
                   int line = __builtin_LINE()) {
    return tw::atomic_rmw(a, [&](T old) { return old == cmp ? v : old; }, line);
}

namespace cooperative_groups {
struct grid_group {
    void sync(int line = __builtin_LINE()) const { tw_grid_sync(line); }
    bool is_valid() const { return true; }
    unsigned long long size() const {
        return (unsigned long long)tw_grid_dim.x * tw_grid_dim.y * tw_grid_dim.z * tw_block_dim.x * tw_block_dim.y *
               tw_block_dim.z;
    }
};
inline grid_group this_grid() { return grid_group{}; }
struct thread_block {
    void sync(int line = __builtin_LINE()) const { tw_syncthreads(line); }
};
inline thread_block this_thread_block() { return thread_block{}; }
}  // namespace cooperative_groups

// ---- kernel entry: every parameter of a printed kernel is a pointer, handed over as (address, buffer) ----
namespace tw {
struct Arg {
    void* p;
    const Buffer* b;
};
template <class... P, std::size_t... I>
inline void invoke_with(void (*k)(P...), const Arg* args, std::index_sequence<I...>) {
    k(ptr<typename std::decay_t<P>::element>((typename std::decay_t<P>::element*)args[I].p, args[I].b)...);
}
template <class... P>
inline void invoke(void (*k)(P...), const Arg* args) {
    invoke_with(k, args, std::index_sequence_for<P...>{});
}
}  // namespace tw
