// tileweave cuda-sim runtime: runs one kernel launch at a time with CUDA semantics on one host thread.
// Each CUDA thread is a stackful coroutine; barriers, warp collectives and grid syncs are rendezvous that
// suspend a thread until every participant arrives; atomics that change nothing (spin-waits) yield. Findings
// (deadlock, partial barrier/shuffle, out-of-range, never-written reads, races) are collected for Python.
#include "tw_sync.h"

#pragma GCC visibility push(default)
extern "C" {
ThreadView* tw_cur = nullptr;
uint32_t tw_g = 1;
Dim3 tw_block_dim{1, 1, 1}, tw_grid_dim{1, 1, 1};
uint64_t tw_bytes[4] = {0, 0, 0, 0};
}
#pragma GCC visibility pop

// ---- calls from kernels (tw_simt.h) -----------------------------------------------------------------
#pragma GCC visibility push(default)
extern "C" {

void tw_report_oor(const Buffer* b, int64_t off, int64_t n, int line, int write) {
    const int64_t elems = n > 0 ? b->size / n : b->size;
    add_finding(OUT_OF_RANGE, line, buffer_name(b), off, 0, "%s of %s[%lld] outside its %lld elements",
                write ? "write" : "read", buffer_name(b), (long long)(off >= 0 ? off / n : -((-off + n - 1) / n)),
                (long long)elems);
}

void tw_report_misaligned(const Buffer* b, int64_t off, int64_t n, int line, int write) {
    add_finding(MISALIGNED, line, buffer_name(b), off, 0, "%lld-byte %s of %s at byte %lld, not %lld-byte aligned",
                (long long)n, write ? "write" : "read", buffer_name(b), (long long)off, (long long)n);
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
                same_block ? "no __syncthreads between, nor a named barrier counting both"
                           : "another block, no grid sync or release/acquire between",
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

void tw_named_barrier(unsigned id, unsigned count, int line) {
    Thread* t = g_running;
    Block* B = t->B;
    if (id == 0 || id >= NAMED_BARRIERS) {
        add_finding(PARTIAL_BARRIER, line, nullptr, -1, 0,
                    "named barrier %u at line %d: ids are 1..%d (0 is __syncthreads')", id, line, NAMED_BARRIERS - 1);
        return;
    }
    if (count == 0 || count % 32 || count > (unsigned)B->nthreads) {
        add_finding(PARTIAL_BARRIER, line, nullptr, -1, 0,
                    "named barrier %u at line %d counts %u threads: whole warps, at most the block's %d", id, line,
                    count, B->nthreads);
        return;
    }
    Block::Named& n = B->named[id];
    if (n.arrived > 0 && count != n.count) {
        add_finding(PARTIAL_BARRIER, line, nullptr, -1, n.line,
                    "named barrier %u: thread %u passes %u threads at line %d, the threads waiting at line %d passed %u",
                    id, t->v.lin, count, line, n.line, n.count);
        count = n.count;  // the barrier in progress keeps its count
    } else if (t->v.lin >= count) {
        add_finding(PARTIAL_BARRIER, line, nullptr, -1, 0,
                    "thread %u of block %u reaches named barrier %u at line %d, which counts threads 0..%u only",
                    t->v.lin, B->id, id, line, count - 1);
    }
    if (t->v.lin >= count) return;  // not one of its threads: it does not wait
    if (n.arrived == 0) {
        n.count = count;
        n.line = line;
        n.alive = 0;
        for (unsigned m = 0; m < count; ++m) n.alive += B->threads[m].state != DONE;
    }
    t->state = AT_NAMED;
    t->wait_line = line;
    t->named = (int)id;
    ++n.arrived;
    progress();
    if (n.arrived == n.alive) release_named(B, (int)id);
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
    t->fenced = true;
    // Releases what the whole block did before its last barrier that counted every thread (a named
    // barrier since then orders only its own threads' accesses before this one).
    t->fence_ep = t->B->cover.back();
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
    if (t->fenced) {  // fence then atomic: a release of the block's accesses before the fence's epoch
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

float* tw_warp_scratch(int* lane) {
    *lane = g_running->lane;
    return g_running->W->scratch;
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
