// tileweave cuda-sim runtime: runs one kernel launch at a time with CUDA semantics on one host thread.
// Each CUDA thread is a stackful coroutine; barriers, warp collectives and grid syncs are rendezvous that
// suspend a thread until every participant arrives; atomics that change nothing (spin-waits) yield. Findings
// (deadlock, partial barrier/shuffle, out-of-range, never-written reads, races) are collected for Python.
#define TW_RUNTIME
#include "tw_simt.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

using namespace tw;

#pragma GCC visibility push(default)
extern "C" {
ThreadView* tw_cur = nullptr;
uint32_t tw_g = 1;
Dim3 tw_block_dim{1, 1, 1}, tw_grid_dim{1, 1, 1};
uint64_t tw_bytes[4] = {0, 0, 0, 0};
}
#pragma GCC visibility pop

namespace {

enum Kind : int { DEADLOCK, PARTIAL_BARRIER, PARTIAL_SHUFFLE, OUT_OF_RANGE, UNINITIALIZED, RACE, KINDS };
enum State : int { RUNNABLE, AT_BARRIER, AT_WARP, AT_GRID, DONE, STOPPED };
constexpr uint64_t CANARY = 0x7477736d63616e61ull;
constexpr int MAX_PER_KIND = 64;  // distinct (line, buffer) findings kept per kind and launch

// ---- coroutines -------------------------------------------------------------------------------------
struct Stack {
    char* map = nullptr;  // the mapping (guard page first when guarded)
    char* lo = nullptr;   // lowest usable byte (holds the canary)
    size_t size = 0;      // usable bytes
};

size_t g_stack_size = 256 * 1024;
size_t g_page = 4096;
std::vector<Stack> g_free_stacks;
size_t g_guarded = 0;  // guard pages split mappings: at most this many, so the map count stays in bounds
constexpr size_t MAX_GUARDED = 12000;
constexpr size_t MAX_POOLED_STACKS = 4096;

Stack get_stack() {
    if (!g_free_stacks.empty()) {
        Stack s = g_free_stacks.back();
        g_free_stacks.pop_back();
        return s;
    }
    const bool guard = g_guarded < MAX_GUARDED;
    const size_t total = g_stack_size + (guard ? g_page : 0);
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        std::fprintf(stderr, "tileweave cuda-sim: cannot map a %zu-byte thread stack\n", total);
        std::abort();
    }
    Stack s;
    s.map = (char*)m;
    s.lo = s.map + (guard ? g_page : 0);
    s.size = g_stack_size;
    if (guard) {
        mprotect(s.map, g_page, PROT_NONE);
        ++g_guarded;
    }
    return s;
}

struct Thread;
void thread_main(Thread* t);

#if defined(__x86_64__)
extern "C" void tw_ctx_switch(void** save, void* load) __attribute__((visibility("hidden")));
extern "C" void tw_ctx_start() __attribute__((visibility("hidden")));
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save, switches to
// `load` and restores the same from there (MXCSR and the x87 control word are left alone: nothing in a
// kernel changes them). A new stack starts in tw_ctx_start with the Thread* in rbx, the entry in r12.
asm(R"(
.text
.globl tw_ctx_switch
.hidden tw_ctx_switch
.type tw_ctx_switch,@function
tw_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size tw_ctx_switch,.-tw_ctx_switch
.globl tw_ctx_start
.hidden tw_ctx_start
.type tw_ctx_start,@function
tw_ctx_start:
    movq %rbx, %rdi
    callq *%r12
    ud2
.size tw_ctx_start,.-tw_ctx_start
)");

struct Context {
    void* sp = nullptr;
};

void ctx_init(Context& c, const Stack& s, Thread* t) {
    uint64_t* top = (uint64_t*)(((uintptr_t)(s.lo + s.size)) & ~(uintptr_t)15);
    top[-1] = 0;
    top[-2] = 0;
    top[-3] = (uint64_t)&tw_ctx_start;  // ret lands here with rsp 16-byte aligned for the call
    top[-4] = 0;                        // rbp
    top[-5] = (uint64_t)t;              // rbx
    top[-6] = (uint64_t)&thread_main;   // r12
    top[-7] = 0;                        // r13
    top[-8] = 0;                        // r14
    top[-9] = 0;                        // r15
    c.sp = &top[-9];
}
Context g_sched;
inline void ctx_switch(Context& from, Context& to) { tw_ctx_switch(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};
void ctx_trampoline(unsigned hi, unsigned lo) { thread_main((Thread*)(((uintptr_t)hi << 32) | lo)); }
Context g_sched;
void ctx_init(Context& c, const Stack& s, Thread* t) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = s.lo;
    c.uc.uc_stack.ss_size = s.size;
    c.uc.uc_link = nullptr;
    const uintptr_t p = (uintptr_t)t;
    makecontext(&c.uc, (void (*)())ctx_trampoline, 2, (unsigned)(p >> 32), (unsigned)p);
}
inline void ctx_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- threads, warps, blocks -----------------------------------------------------------------------
struct Warp {
    uint16_t wep = 1;
    uint32_t arrived = 0;  // lanes waiting at a collective
    uint32_t exited = 0;   // lanes that exited (or do not exist: a partial last warp)
    struct Lane {
        int op, arg, width, line;
        unsigned mask;
        uint64_t val, out;
    } lane[32];
};

struct Block;
struct Thread {
    ThreadView v;  // first: tw_cur points here
    Block* B = nullptr;
    Warp* W = nullptr;
    int lane = 0;
    Context ctx;
    Stack stack;
    State state = RUNNABLE;
    int wait_line = 0;
    uint32_t fence_ep = 0;  // block epoch at this thread's last __threadfence (0: none)
    std::vector<uint32_t> acq, pending;  // acquired / read-but-not-yet-fenced release clocks
};

struct Block {
    uint32_t id = 0;
    uint32_t ep = 1;
    int nthreads = 0, alive = 0, exited = 0, arrived = 0;
    Buffer smem{};
    std::vector<Buffer> regions;
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    std::vector<uint32_t> vc;  // per block of the grid: accesses before that epoch are ordered before us
    std::vector<char> smem_data;
    std::vector<Cell> smem_shadow;
};

}  // namespace

extern "C" {
struct TwRegion {
    int32_t line;
    int32_t pad;
    int64_t offset, size;
    const char* name;
};
struct TwLaunch {
    void (*entry)(const Arg*);
    const Arg* args;
    uint32_t grid[3], block[3];
    int64_t smem_bytes;
    int32_t smem_shift, cooperative, resident, nregions;
    const TwRegion* regions;
    const char* kernel;
};
struct TwFinding {
    int32_t kind, line, prev_line, pad;
    int64_t count, offset;
    uint32_t block[3], thread[3];
    char buffer[64];
    char message[256];
};
}

namespace {

struct Launch {
    const TwLaunch* L = nullptr;
    uint32_t nblocks = 0, next_block = 0;
    int resident = 1, nthreads = 0;
    std::map<uint32_t, std::unique_ptr<Block>> live;
    std::deque<Thread*> runq;
    int live_blocks = 0;
    int64_t grid_alive = 0, grid_arrived = 0, grid_exited = 0;
    uint64_t idle_spins = 0;
    bool stopped = false;
    std::unordered_map<const void*, std::vector<uint32_t>> release;  // atomic location -> release clock
    std::unordered_map<int, std::vector<int>> regions_at_line;
};

Launch* g_L = nullptr;
Thread* g_running = nullptr;
std::vector<TwFinding> g_findings;
const void* g_store_value = nullptr;  // the bytes the write being checked stores
int64_t g_store_n = 0;
std::map<std::tuple<int, int, std::string>, size_t> g_finding_at;
int g_kind_count[KINDS] = {};

void join(std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
    if (b.empty()) return;
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (size_t i = 0; i < b.size(); ++i) a[i] = std::max(a[i], b[i]);
}

void add_finding(int kind, int line, const char* buffer, int64_t offset, int prev_line, const char* fmt, ...) {
    const std::string buf = buffer ? buffer : "";
    auto key = std::make_tuple(kind, line, buf);
    auto it = g_finding_at.find(key);
    if (it != g_finding_at.end()) {
        ++g_findings[it->second].count;
        return;
    }
    if (g_kind_count[kind] >= MAX_PER_KIND) return;
    ++g_kind_count[kind];
    TwFinding f{};
    f.kind = kind;
    f.line = line;
    f.prev_line = prev_line;
    f.count = 1;
    f.offset = offset;
    if (g_running) {
        f.block[0] = g_running->v.bid.x, f.block[1] = g_running->v.bid.y, f.block[2] = g_running->v.bid.z;
        f.thread[0] = g_running->v.tid.x, f.thread[1] = g_running->v.tid.y, f.thread[2] = g_running->v.tid.z;
    }
    std::snprintf(f.buffer, sizeof f.buffer, "%s", buf.c_str());
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(f.message, sizeof f.message, fmt, ap);
    va_end(ap);
    g_finding_at[key] = g_findings.size();
    g_findings.push_back(f);
}

void progress() { g_L->idle_spins = 0; }

void enqueue(Thread* t) {
    t->state = RUNNABLE;
    g_L->runq.push_back(t);
}

// Suspend the running thread (its state says why) and resume the scheduler.
void suspend(Thread* t) {
    ctx_switch(t->ctx, g_sched);
    tw_cur = &t->v;
    g_running = t;
}

// Stop the launch from inside a thread: the scheduler never resumes any thread of it.
[[noreturn]] void stop_from_thread(Thread* t) {
    g_L->stopped = true;
    t->state = STOPPED;
    ctx_switch(t->ctx, g_sched);
    std::abort();  // unreachable: a stopped launch resumes no thread
}

const char* buffer_name(const Buffer* b) { return b && b->name ? b->name : "?"; }

void release_barrier(Block* B) {
    int first = -1, other = -1, n_first = 0;
    for (Thread& t : B->threads) {
        if (t.state != AT_BARRIER) continue;
        if (first < 0 || t.wait_line == first) first = t.wait_line, ++n_first;
        else other = t.wait_line;
    }
    if (other >= 0)
        add_finding(PARTIAL_BARRIER, first, nullptr, -1, other,
                    "__syncthreads at line %d (%d threads) and at line %d (the other %d) complete together: "
                    "a barrier in divergent code",
                    first, n_first, other, B->arrived - n_first);
    else if (B->exited > 0)
        add_finding(PARTIAL_BARRIER, first, nullptr, -1, 0,
                    "__syncthreads at line %d reached by %d of %d threads of block %u; %d exited before it", first,
                    B->arrived, B->nthreads, B->id, B->exited);
    ++B->ep;
    for (Thread& t : B->threads) {
        if (t.state != AT_BARRIER) continue;
        join(B->vc, t.acq);
    }
    for (Thread& t : B->threads)
        if (t.state == AT_BARRIER) enqueue(&t);
    B->arrived = 0;
}

void release_grid() {
    Launch& L = *g_L;
    int line = -1;
    for (auto& kv : L.live)
        for (Thread& t : kv.second->threads)
            if (t.state == AT_GRID && line < 0) line = t.wait_line;
    if (L.grid_exited > 0)
        add_finding(PARTIAL_BARRIER, line, nullptr, -1, 0,
                    "grid sync at line %d reached by %lld of %lld threads; %lld exited before it", line,
                    (long long)L.grid_arrived, (long long)(L.grid_arrived + L.grid_exited),
                    (long long)L.grid_exited);
    ++tw_g;  // everything before the grid sync is ordered before everything after it
    for (auto& kv : L.live) {
        ++kv.second->ep;
        for (Thread& t : kv.second->threads)
            if (t.state == AT_GRID) enqueue(&t);
    }
    L.grid_arrived = 0;
}

// Complete the collective of the lanes in `mask` (all arrived or exited).
void complete_warp_op(Warp* W, unsigned mask) {
    const unsigned lanes = mask & W->arrived;
    int lead = __builtin_ctz(lanes);
    const Warp::Lane& L0 = W->lane[lead];
    for (unsigned m = lanes; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        const Warp::Lane& X = W->lane[l];
        if (X.mask != L0.mask)
            add_finding(PARTIAL_SHUFFLE, X.line, nullptr, -1, L0.line,
                        "warp collective at line %d: lane %d passes mask 0x%08x, lane %d 0x%08x", X.line, l, X.mask,
                        lead, L0.mask);
        else if (X.op != L0.op || X.line != L0.line)
            add_finding(PARTIAL_SHUFFLE, X.line, nullptr, -1, L0.line,
                        "lanes of one warp meet at different collectives (line %d and line %d)", X.line, L0.line);
    }
    unsigned ballot = 0;
    for (unsigned m = lanes; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        if (W->lane[l].val) ballot |= 1u << l;
    }
    for (unsigned m = lanes; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        Warp::Lane& X = W->lane[l];
        const int w = (X.width > 0 && X.width <= 32 && !(X.width & (X.width - 1))) ? X.width : 32;
        const int seg = l & ~(w - 1);
        int src = l;
        switch (X.op) {
            case SHFL_IDX: src = seg + (X.arg & (w - 1)); break;
            case SHFL_UP: src = (l - seg) >= X.arg ? l - X.arg : l; break;
            case SHFL_DOWN: src = (l - seg) + X.arg < w ? l + X.arg : l; break;
            case SHFL_XOR: src = ((l ^ X.arg) & ~(w - 1)) == seg ? (l ^ X.arg) : l; break;
            default: break;
        }
        switch (X.op) {
            case SHFL_IDX:
            case SHFL_UP:
            case SHFL_DOWN:
            case SHFL_XOR:
                if (src < 0 || src > 31 || !(lanes & (1u << src))) {
                    add_finding(PARTIAL_SHUFFLE, X.line, nullptr, -1, 0,
                                "lane %d reads lane %d, which is %s", l, src,
                                (src >= 0 && src < 32 && (W->exited & (1u << src))) ? "not running (exited)"
                                                                                     : "not in the shuffle's mask");
                    X.out = X.val;
                } else {
                    X.out = W->lane[src].val;
                }
                break;
            case BALLOT: X.out = ballot; break;
            case ANY: X.out = ballot != 0; break;
            case ALL: X.out = ballot == lanes; break;
            default: X.out = 0; break;
        }
    }
    if (L0.op == SYNCWARP) ++W->wep;
    W->arrived &= ~lanes;
    Block* B = g_running->B;
    Thread* lane0 = &B->threads[(size_t)(W - B->warps.data()) * 32];  // a warp's threads are consecutive
    for (unsigned m = lanes; m; m &= m - 1)
        if (lane0[__builtin_ctz(m)].state == AT_WARP) enqueue(&lane0[__builtin_ctz(m)]);
}

// A lane left: collectives waiting on it can complete without it (a finding).
void check_warp_after_exit(Warp* W) {
    for (unsigned m = W->arrived; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        const unsigned mask = W->lane[l].mask;
        if (mask & ~(W->arrived | W->exited)) continue;
        if ((W->arrived & mask) == 0) continue;
        add_finding(PARTIAL_SHUFFLE, W->lane[l].line, nullptr, -1, 0,
                    "warp collective at line %d with mask 0x%08x: lanes 0x%08x exited without reaching it",
                    W->lane[l].line, mask, mask & W->exited);
        complete_warp_op(W, mask);
        return;
    }
}

void finish_thread(Thread* t) {
    Block* B = t->B;
    Launch& L = *g_L;
    --B->alive;
    ++B->exited;
    --L.grid_alive;
    ++L.grid_exited;
    progress();
    t->W->exited |= 1u << t->lane;
    if (B->arrived > 0 && B->arrived == B->alive) release_barrier(B);
    if (t->W->arrived) check_warp_after_exit(t->W);
    if (L.grid_arrived > 0 && L.grid_arrived == L.grid_alive) release_grid();
}

void thread_main(Thread* t) {
    tw_cur = &t->v;
    g_running = t;
    g_L->L->entry(g_L->L->args);
    finish_thread(t);
    t->state = DONE;
    ctx_switch(t->ctx, g_sched);
    std::abort();  // a finished thread is never resumed
}

std::vector<std::vector<char>> g_smem_pool;
std::vector<std::vector<Cell>> g_shadow_pool;

void start_block(uint32_t id) {
    Launch& L = *g_L;
    const TwLaunch& P = *L.L;
    auto B = std::make_unique<Block>();
    B->id = id;
    const Dim3 bid{id % P.grid[0], (id / P.grid[0]) % P.grid[1], id / (P.grid[0] * P.grid[1])};
    B->nthreads = L.nthreads;
    B->alive = L.nthreads;
    if (!g_smem_pool.empty()) {
        B->smem_data = std::move(g_smem_pool.back());
        g_smem_pool.pop_back();
        B->smem_shadow = std::move(g_shadow_pool.back());
        g_shadow_pool.pop_back();
    }
    // Fresh shared memory is garbage (NaN bytes) and never written.
    B->smem_data.assign((size_t)P.smem_bytes, (char)0xFF);
    const size_t cells = P.smem_bytes > 0 ? (size_t)((P.smem_bytes - 1) >> P.smem_shift) + 1 : 0;
    Cell never;
    std::memset(&never, 0xFF, sizeof never);
    B->smem_shadow.assign(cells, never);
    B->smem = Buffer{B->smem_data.data(), P.smem_bytes, B->smem_shadow.data(), P.smem_shift, SHARED,
                     "shared memory", nullptr};
    B->smem.whole = &B->smem;
    for (int r = 0; r < P.nregions; ++r) {
        const TwRegion& R = P.regions[r];
        B->regions.push_back(Buffer{B->smem_data.data() + R.offset, R.size,
                                    B->smem_shadow.data() + (R.offset >> P.smem_shift), P.smem_shift, SHARED,
                                    R.name, &B->smem});
    }
    B->warps.resize((L.nthreads + 31) / 32);
    if (L.nthreads % 32) B->warps.back().exited = ~0u << (L.nthreads % 32);  // lanes that do not exist
    B->threads.resize(L.nthreads);
    for (int i = 0; i < L.nthreads; ++i) {
        Thread& t = B->threads[i];
        t.v.tid = Dim3{i % P.block[0], (i / P.block[0]) % P.block[1], i / (P.block[0] * P.block[1])};
        t.v.bid = bid;
        t.v.block = id;
        t.v.lin = i;
        t.v.bep = &B->ep;
        t.W = &B->warps[i / 32];
        t.lane = i % 32;
        t.v.wep = &t.W->wep;
        t.v.smem = &B->smem;
        t.B = B.get();
        t.stack = get_stack();
        *(uint64_t*)t.stack.lo = CANARY;
        ctx_init(t.ctx, t.stack, &t);
        enqueue(&t);
    }
    L.grid_alive += L.nthreads;
    ++L.live_blocks;
    progress();
    L.live[id] = std::move(B);
}

void retire_block(Block* B) {
    for (Thread& t : B->threads) g_free_stacks.push_back(t.stack);
    g_smem_pool.push_back(std::move(B->smem_data));
    g_shadow_pool.push_back(std::move(B->smem_shadow));
    --g_L->live_blocks;
    g_L->live.erase(B->id);
}

const char* state_name(State s) {
    switch (s) {
        case AT_BARRIER: return "__syncthreads";
        case AT_WARP: return "a warp collective";
        case AT_GRID: return "grid sync";
        case RUNNABLE: return "a spin-wait";
        default: return "?";
    }
}

// Describe where the unfinished threads wait: "12 at __syncthreads line 40, 4 at a warp collective line 51".
std::string where_threads_wait() {
    std::map<std::pair<int, int>, int> at;
    for (auto& kv : g_L->live)
        for (Thread& t : kv.second->threads)
            if (t.state != DONE) ++at[{t.state, t.state == RUNNABLE ? 0 : t.wait_line}];
    std::string out;
    for (auto& kv : at) {
        char part[96];
        if (kv.first.first == RUNNABLE)
            std::snprintf(part, sizeof part, "%s%d in a spin-wait", out.empty() ? "" : ", ", kv.second);
        else
            std::snprintf(part, sizeof part, "%s%d at %s line %d", out.empty() ? "" : ", ", kv.second,
                          state_name((State)kv.first.first), kv.first.second);
        out += part;
    }
    const uint32_t waiting = g_L->nblocks - g_L->next_block;
    if (waiting) {
        char part[128];
        std::snprintf(part, sizeof part, "; %u block(s) not resident (at most %d resident)", waiting, g_L->resident);
        out += part;
    }
    return out;
}

// Nothing can run but threads are unfinished: report why and stop the launch.
void diagnose_stuck() {
    Launch& L = *g_L;
    int kind = DEADLOCK, line = 0;
    for (auto& kv : L.live) {
        Block* B = kv.second.get();
        for (Thread& t : B->threads) {
            if (t.state == AT_WARP && kind != PARTIAL_SHUFFLE) kind = PARTIAL_SHUFFLE, line = t.wait_line;
            if (t.state == AT_BARRIER && kind == DEADLOCK && B->arrived < B->alive)
                kind = PARTIAL_BARRIER, line = t.wait_line;
        }
    }
    const std::string where = where_threads_wait();
    Thread* keep = g_running;
    g_running = nullptr;
    if (kind == PARTIAL_SHUFFLE)
        add_finding(kind, line, nullptr, -1, 0, "warp collective at line %d never completes: %s", line, where.c_str());
    else if (kind == PARTIAL_BARRIER)
        add_finding(kind, line, nullptr, -1, 0, "barrier at line %d never completes: %s", line, where.c_str());
    else
        add_finding(kind, line, nullptr, -1, 0, "no thread can make progress: %s", where.c_str());
    g_running = keep;
    L.stopped = true;
}

void spin_turn(Thread* t, int line) {
    Launch& L = *g_L;
    ++L.idle_spins;
    t->wait_line = line;
    if (L.idle_spins > 2 * (L.runq.size() + 1) + 16) {
        const std::string where = where_threads_wait();
        add_finding(DEADLOCK, line, nullptr, -1, 0,
                    "deadlock: every runnable thread spins on an atomic with no progress (line %d); %s", line,
                    where.c_str());
        stop_from_thread(t);
    }
    enqueue(t);
    suspend(t);
}

}  // namespace

// ---- calls from kernels (tw_simt.h) -----------------------------------------------------------------
#pragma GCC visibility push(default)
extern "C" {

void tw_report_oor(const Buffer* b, int64_t off, int64_t n, int line, int write) {
    const int64_t elems = n > 0 ? b->size / n : b->size;
    add_finding(OUT_OF_RANGE, line, buffer_name(b), off, 0, "%s of %s[%lld] outside its %lld elements",
                write ? "write" : "read", buffer_name(b), (long long)(off >= 0 ? off / n : -((-off + n - 1) / n)),
                (long long)elems);
}

void tw_report_uninit(const Buffer* b, int64_t off, int line) {
    add_finding(UNINITIALIZED, line, buffer_name(b), off, 0, "read of %s at byte %lld, never written", buffer_name(b),
                (long long)off);
}

void tw_report_race(const Buffer* b, int64_t off, const Access* prev, int prev_write, int write, int line) {
    char who[64];
    if (prev->thread == MANY) std::snprintf(who, sizeof who, "several threads of block %u", prev->block);
    else std::snprintf(who, sizeof who, "thread %u of block %u", prev->thread, prev->block);
    const bool same_block = g_running && prev->block == g_running->v.block;
    const bool same_value = write && prev_write && g_store_value && off >= 0 &&
                            std::memcmp(b->base + off, g_store_value, (size_t)g_store_n) == 0;
    add_finding(RACE, line, buffer_name(b), off, (int)prev->line,
                "%s of %s at byte %lld races with a %s at line %u by %s (%s)%s", write ? "write" : "read",
                buffer_name(b), (long long)off, prev_write ? "write" : "read", prev->line, who,
                same_block ? "no __syncthreads between" : "another block, no grid sync or release/acquire between",
                same_value ? "; both store the same value" : "");
}

int tw_ordered_across(uint32_t block, uint32_t ep) {
    Thread* t = g_running;
    uint32_t v = 0;
    if (block < t->B->vc.size()) v = t->B->vc[block];
    if (block < t->acq.size()) v = std::max(v, t->acq[block]);
    return v > ep;
}

const Buffer* tw_narrow(const Buffer* whole, const char* at, int line) {
    Launch& L = *g_L;
    auto it = L.regions_at_line.find(line);
    if (it == L.regions_at_line.end()) return whole;
    Block* B = g_running->B;
    for (int r : it->second)
        if (whole->base + L.L->regions[r].offset == at) return &B->regions[r];
    return whole;
}

void tw_syncthreads(int line) {
    Thread* t = g_running;
    Block* B = t->B;
    t->state = AT_BARRIER;
    t->wait_line = line;
    ++B->arrived;
    progress();
    if (B->arrived == B->alive) release_barrier(B);
    suspend(t);
}

void tw_grid_sync(int line) {
    Thread* t = g_running;
    Launch& L = *g_L;
    if (!L.L->cooperative)
        add_finding(DEADLOCK, line, nullptr, -1, 0, "grid sync at line %d in a launch that is not cooperative", line);
    t->state = AT_GRID;
    t->wait_line = line;
    ++L.grid_arrived;
    progress();
    if (L.grid_arrived == L.grid_alive && L.next_block >= L.nblocks) release_grid();
    suspend(t);
}

void tw_threadfence(void) {
    Thread* t = g_running;
    join(t->acq, t->pending);
    t->pending.clear();
    t->fence_ep = t->B->ep;
}

void tw_atomic_done(const Buffer* b, const void* at, int64_t n, int changed, int line) {
    Thread* t = g_running;
    Launch& L = *g_L;
    if (b) {
        tw_bytes[b->space * 2] += n;
        tw_bytes[b->space * 2 + 1] += n;
        if (b->shadow) {
            const int64_t off = (const char*)at - b->base;
            Cell* c = b->shadow + (off >> b->shift);
            Cell* end = b->shadow + ((off + n - 1) >> b->shift) + 1;
            for (; c < end; ++c) {
                if (c->w.block == NOBODY) tw_report_uninit(b, off, line);
                c->w.block = HOST;  // atomics order themselves; they are never a race with each other
            }
        }
    }
    auto it = L.release.find(at);
    if (it != L.release.end()) join(t->pending, it->second);  // acquire once this thread fences
    if (t->fence_ep) {  // fence then atomic: a release of the block's accesses before the fence's epoch
        std::vector<uint32_t>& rel = L.release[at];
        join(rel, t->B->vc);
        join(rel, t->acq);
        if (rel.size() < L.nblocks) rel.resize(L.nblocks, 0);
        rel[t->B->id] = std::max(rel[t->B->id], t->fence_ep);
    }
    if (changed) progress();
    else spin_turn(t, line);
}

uint64_t tw_warp_op(int op, unsigned mask, uint64_t value, int arg, int width, int line) {
    Thread* t = g_running;
    Warp* W = t->W;
    const unsigned bit = 1u << t->lane;
    if (!(mask & bit)) {
        add_finding(PARTIAL_SHUFFLE, line, nullptr, -1, 0, "lane %d calls a warp collective whose mask 0x%08x excludes it",
                    t->lane, mask);
        mask |= bit;
    }
    W->lane[t->lane] = Warp::Lane{op, arg, width, line, mask, value, 0};
    W->arrived |= bit;
    t->state = AT_WARP;
    t->wait_line = line;
    progress();
    if (mask & W->exited & ~W->arrived)
        add_finding(PARTIAL_SHUFFLE, line, nullptr, -1, 0,
                    "warp collective at line %d with mask 0x%08x: lanes 0x%08x exited or do not exist", line, mask,
                    mask & W->exited);
    if ((mask & ~(W->arrived | W->exited)) == 0) complete_warp_op(W, mask);
    suspend(t);
    return W->lane[t->lane].out;
}

int tw_check_read(const Buffer* b, const void* p, int64_t n, int line) { return check_impl<false>(b, p, n, line); }
int tw_check_write(const Buffer* b, const void* p, int64_t n, int line, const void* value) {
    g_store_value = value;
    g_store_n = n;
    const int ok = check_impl<true>(b, p, n, line);
    g_store_value = nullptr;
    return ok;
}

// ---- the Python side (ctypes) ---------------------------------------------------------------------
int tw_cell_size(void) { return (int)sizeof(Cell); }

void tw_set_stack_size(int64_t bytes) {
    const size_t size = ((size_t)bytes + 4095) & ~(size_t)4095;
    if (size != g_stack_size) {  // stacks of the old size are not reused
        for (Stack& s : g_free_stacks) {
            if (s.lo != s.map) --g_guarded;
            munmap(s.map, (size_t)(s.lo - s.map) + s.size);
        }
        g_free_stacks.clear();
        g_stack_size = size;
    }
}

Buffer* tw_buffer_new(void* base, int64_t size, void* shadow, int shift, int space, const char* name) {
    char* copy = new char[std::strlen(name) + 1];
    std::strcpy(copy, name);
    Buffer* b = new Buffer{(char*)base, size, (Cell*)shadow, shift, space, copy, nullptr};
    b->whole = b;
    return b;
}

void tw_buffer_free(Buffer* b) {
    delete[] b->name;
    delete b;
}

void tw_stats(uint64_t* out) {
    for (int i = 0; i < 4; ++i) out[i] = tw_bytes[i];
}

int tw_findings(TwFinding* out, int cap) {
    const int n = std::min<int>(cap, (int)g_findings.size());
    for (int i = 0; i < n; ++i) out[i] = g_findings[i];
    g_findings.clear();
    g_finding_at.clear();
    for (int& k : g_kind_count) k = 0;
    return n;
}

// Run one launch to completion; 0: every thread finished, 1: stopped (deadlock, barrier never completing).
int tw_launch(const TwLaunch* P) {
    Launch L;
    L.L = P;
    L.nblocks = P->grid[0] * P->grid[1] * P->grid[2];
    L.nthreads = (int)(P->block[0] * P->block[1] * P->block[2]);
    L.resident = P->cooperative ? (int)L.nblocks : std::max(1, P->resident);
    for (int r = 0; r < P->nregions; ++r) L.regions_at_line[P->regions[r].line].push_back(r);
    g_L = &L;
    ++tw_g;
    for (uint64_t& x : tw_bytes) x = 0;
    tw_block_dim = Dim3{P->block[0], P->block[1], P->block[2]};
    tw_grid_dim = Dim3{P->grid[0], P->grid[1], P->grid[2]};
    while (L.next_block < L.nblocks && L.live_blocks < L.resident) start_block(L.next_block++);
    while (!L.stopped) {
        if (L.runq.empty()) {
            if (L.live_blocks == 0 && L.next_block >= L.nblocks) break;
            diagnose_stuck();
            break;
        }
        Thread* t = L.runq.front();
        L.runq.pop_front();
        if (t->state != RUNNABLE) continue;
        g_running = t;
        tw_cur = &t->v;
        ctx_switch(g_sched, t->ctx);
        g_running = nullptr;
        if (*(uint64_t*)t->stack.lo != CANARY) {
            std::fprintf(stderr, "tileweave cuda-sim: thread stack overflow in %s (set TILEWEAVE_SIM_STACK)\n",
                         P->kernel);
            std::abort();
        }
        if (t->state == DONE) {
            Block* B = t->B;
            if (B->alive == 0) {
                retire_block(B);
                while (L.next_block < L.nblocks && L.live_blocks < L.resident) start_block(L.next_block++);
                // a grid sync waits for blocks that were not resident yet
                if (L.grid_arrived > 0 && L.grid_arrived == L.grid_alive && L.next_block >= L.nblocks) release_grid();
            }
        }
    }
    const int stopped = L.stopped ? 1 : 0;
    std::vector<Block*> left;
    for (auto& kv : L.live) left.push_back(kv.second.get());
    for (Block* B : left) retire_block(B);
    g_L = nullptr;
    tw_cur = nullptr;
    ++tw_g;
    // A big cooperative grid leaves many stacks behind: keep enough for ordinary launches, unmap the rest.
    while (g_free_stacks.size() > MAX_POOLED_STACKS) {
        Stack& s = g_free_stacks.back();
        if (s.lo != s.map) --g_guarded;
        munmap(s.map, (size_t)(s.lo - s.map) + s.size);
        g_free_stacks.pop_back();
    }
    if (g_smem_pool.size() > 64) g_smem_pool.resize(64), g_shadow_pool.resize(64);
    return stopped;
}

}  // extern "C"
#pragma GCC visibility pop
