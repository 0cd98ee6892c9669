// tileweave cuda-sim rendezvous (runtime.cpp only): block barriers, grid syncs and warp collectives
// completing, threads and blocks starting and finishing, spin-wait turns, and what a stuck launch reports.
#pragma once
#include "tw_state.h"

namespace {

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
    for (uint32_t& c : B->cover) c = B->ep;  // it counts every thread of the block
    for (Thread& t : B->threads) {
        if (t.state != AT_BARRIER) continue;
        join(B->vc, t.acq);
    }
    for (Thread& t : B->threads)
        if (t.state == AT_BARRIER) enqueue(&t);
    B->arrived = 0;
}

// Named barrier `id` of the block's first `count` threads completes (every running one arrived): it
// orders their accesses with each other only, and shares what they acquired among them only.
void release_named(Block* B, int id) {
    Block::Named& n = B->named[id];
    int first = -1, other = -1, n_first = 0;
    std::vector<uint32_t> acq;
    for (unsigned m = 0; m < n.count; ++m) {
        Thread& t = B->threads[m];
        if (t.state != AT_NAMED || t.named != id) continue;
        if (first < 0 || t.wait_line == first) first = t.wait_line, ++n_first;
        else other = t.wait_line;
        join(acq, t.acq);
    }
    if (other >= 0)
        add_finding(PARTIAL_BARRIER, first, nullptr, -1, other,
                    "named barrier %d at line %d (%d threads) and at line %d (the other %d) complete together: "
                    "a barrier in divergent code",
                    id, first, n_first, other, n.arrived - n_first);
    else if (n.alive < (int)n.count)
        add_finding(PARTIAL_BARRIER, first, nullptr, -1, 0,
                    "named barrier %d at line %d reached by %d of its %u threads of block %u; %d exited before it", id,
                    first, n.arrived, n.count, B->id, (int)n.count - n.alive);
    ++B->ep;
    for (unsigned m = 0; m < n.count; ++m) B->cover[m] = B->ep;
    for (unsigned m = 0; m < n.count; ++m) {
        Thread& t = B->threads[m];
        if (t.state != AT_NAMED || t.named != id) continue;
        join(t.acq, acq);
        enqueue(&t);
    }
    n.arrived = 0;
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
    for (int id = 1; id < NAMED_BARRIERS; ++id) {  // a named barrier it counted completes without it
        Block::Named& n = B->named[id];
        if (n.arrived > 0 && t->v.lin < n.count && --n.alive == n.arrived) release_named(B, id);
    }
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
    B->cover.assign(L.nthreads, 0);
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
        t.v.cover = B->cover.data();
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
        case AT_NAMED: return "a named barrier";
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
            if (t.state == AT_NAMED && kind == DEADLOCK) kind = PARTIAL_BARRIER, line = t.wait_line;
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
