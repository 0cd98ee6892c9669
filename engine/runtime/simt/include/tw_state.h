// tileweave cuda-sim runtime state (runtime.cpp only): emulated threads, warps, blocks and the launch,
// the C structures Python passes (TwLaunch, TwRegion) and reads (TwFinding), and the findings list.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tw_coroutine.h"
#include "tw_shadow.h"

using namespace tw;

namespace {

enum Kind : int { DEADLOCK, PARTIAL_BARRIER, PARTIAL_SHUFFLE, OUT_OF_RANGE, UNINITIALIZED, RACE, MISALIGNED, KINDS };
enum State : int { RUNNABLE, AT_BARRIER, AT_WARP, AT_GRID, DONE, STOPPED, AT_NAMED };
constexpr int NAMED_BARRIERS = 16;  // bar.sync ids; 0 is __syncthreads
constexpr uint64_t CANARY = 0x7477736d63616e61ull;
constexpr int MAX_PER_KIND = 64;  // distinct (line, buffer) findings kept per kind and launch

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
    float scratch[32 * 6];  // tensor-core fragments of a warp-wide mma (tw_mma_m16n8k8_tf32 / _m16n8k16_f16)
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
    int named = 0;  // the named barrier it waits at (AT_NAMED)
    bool fenced = false;    // this thread ran a __threadfence
    uint32_t fence_ep = 0;  // then: the epoch of the block's last barrier that counted all of its threads
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
    std::vector<uint32_t> cover;  // per thread: the epoch of the last barrier that counted it (ThreadView)
    // A named barrier in progress: the count its first thread passed, its line, participants (threads
    // below count) arrived and still running.
    struct Named {
        int arrived = 0, alive = 0, line = 0;
        unsigned count = 0;
    } named[NAMED_BARRIERS];
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

}  // namespace
