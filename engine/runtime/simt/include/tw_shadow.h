// tileweave cuda-sim: the shadow-memory checks behind every access (runtime.cpp only; kernels call them
// through tw_check_read/tw_check_write: inlining them into every access made kernels compile ~5x slower).
#pragma once
#include "tw_simt.h"

namespace tw {

// The highest thread an access stands for (several readers: the highest of them).
TW_HOT uint32_t highest(const Access& a) { return a.thread == MANY ? a.wep : a.thread; }

// Whether an earlier access is ordered before the running thread's current point.
TW_HOT bool ordered(const Access& a) {
    if (a.block == HOST || a.g != tw_g) return true;
    const ThreadView* t = tw_cur;
    if (a.block == t->block) {
        if (a.thread == t->lin) return true;  // program order
        // A barrier completed after the access that counted both threads: barriers count a prefix of the
        // block's threads (all of them for __syncthreads), so one that counted the higher counted both.
        const uint32_t hi = highest(a) > t->lin ? highest(a) : t->lin;
        if (t->cover[hi] > a.ep) return true;
        return (a.thread >> 5) == (t->lin >> 5) && a.wep != *t->wep;  // a __syncwarp between
    }
    return tw_ordered_across(a.block, a.ep);  // another block: only through release/acquire
}

TW_HOT Access me(int line) {
    const ThreadView* t = tw_cur;
    return Access{tw_g, t->block, *t->bep, (uint32_t)line, (uint16_t)t->lin, *t->wep};
}

// Bounds, counters and the shadow cells of one access of n bytes at p; false: out of range (not done).
template <bool WRITE>
TW_HOT bool check_impl(const Buffer* b, const void* p, int64_t n, int line) {
    if (!b) return true;  // a raw pointer (e.g. into a register array): unchecked
    const int64_t off = (const char*)p - b->base;
    if (off < 0 || off + n > b->size) {
        tw_report_oor(b, off, n, line, WRITE);
        return false;
    }
    tw_bytes[b->space * 2 + WRITE] += (uint64_t)n;
    Cell* c = b->shadow;
    if (!c) return true;
    Cell* end = c + ((off + n - 1) >> b->shift) + 1;
    for (c += off >> b->shift; c < end; ++c) {
        if (WRITE) {
            if (c->w.block != NOBODY && !ordered(c->w)) tw_report_race(b, off, &c->w, 1, 1, line);
            else if (c->r.block != NOBODY && !ordered(c->r)) tw_report_race(b, off, &c->r, 0, 1, line);
            c->w = me(line);
            c->r.block = NOBODY;
        } else {
            if (c->w.block == NOBODY) tw_report_uninit(b, off, line);
            else if (!ordered(c->w)) tw_report_race(b, off, &c->w, 1, 0, line);
            const ThreadView* t = tw_cur;
            const uint16_t lin = (uint16_t)t->lin;
            if (c->r.g == tw_g && c->r.block == t->block && c->r.ep == *t->bep) {
                // another read in this block and epoch (the common case: a tile read by many threads)
                if (c->r.thread == lin) continue;
                if (c->r.thread == MANY) {
                    if (c->r.wep < lin) c->r.wep = lin;
                } else if ((c->r.thread >> 5) == (lin >> 5) && c->r.wep != *t->wep) {
                    c->r = me(line);
                } else {
                    c->r.wep = c->r.thread > lin ? c->r.thread : lin;
                    c->r.thread = MANY;
                }
            } else if (c->r.block == NOBODY || ordered(c->r)) {
                c->r = me(line);
            } else if (c->r.g == tw_g && c->r.block == t->block) {
                // an earlier reader a named barrier left out: keep both, dated now (a later barrier that
                // counts the highest of them orders them all)
                const uint16_t hi = (uint16_t)highest(c->r);
                c->r.wep = hi > lin ? hi : lin;
                c->r.thread = MANY;
                c->r.ep = *t->bep;
            } else {
                c->r.wep = (uint16_t)highest(c->r);  // concurrent readers in different blocks: keep the first
                c->r.thread = MANY;                  // block's
            }
        }
    }
    return true;
}

}  // namespace tw
