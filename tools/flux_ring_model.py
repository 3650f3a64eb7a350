#!/usr/bin/env python3
"""Model check of flux_gemm_ws's shared-memory ring (src/backend/cuda/flux/flux.cu), off the GPU.

Random interleavings of the producer thread and the 8 consumer warps of one CTA (configurations
4-5) or of a cluster of 2 (configuration 6: shared w halves multicast into both CTAs, or each
its own), with mbarriers as PTX defines them (arrival count, transaction bytes, phases; a
try_wait.parity(P) succeeds once the phase of parity P is complete), TMA copies landing late and
in any order, chunk signals arriving late. Checks: every slice a consumer reads holds that
slice's x and w; no copy lands in a slot a warp still reads; no deadlock; (clusters) no remote
arrival or copy lands in a CTA that has left. Usage: tools/flux_ring_model.py (prints ok).
"""
import random
class Bar:
    def __init__(s, count): s.count=count; s.pending=count; s.tx=0; s.phase=0
    def arrive(s, tx=0):
        s.tx += tx; s.pending -= 1; s.check()
    def complete_tx(s, n): s.tx -= n; s.check()
    def check(s):
        assert s.pending >= 0
        if s.pending == 0 and s.tx == 0:
            s.phase += 1; s.pending = s.count
    def ready(s, parity): return (s.phase & 1) != parity

def run_single(seed, STAGES, KT, n_tiles, signal_delay):
    rnd = random.Random(seed)
    full = [Bar(1) for _ in range(STAGES)]; empty = [Bar(8) for _ in range(STAGES)]
    slotA = [None]*STAGES; slotB = [None]*STAGES
    held = [set() for _ in range(STAGES)]  # warps that may still read the slot
    inflight = []  # (slot, part, tag, bytes)
    A_BYTES, B_BYTES = 16, 32
    def producer():
        g = 0
        for tile in range(n_tiles):
            ahead = min(KT, STAGES)
            for kt in range(ahead):
                gk = g + kt; s = gk % STAGES
                if gk >= STAGES:
                    while not empty[s].ready(((gk // STAGES) + 1) & 1): yield
                full[s].arrive(A_BYTES + B_BYTES)
                inflight.append((s, 'B', (tile, kt), B_BYTES)); yield
            for _ in range(signal_delay(tile)): yield   # the chunk's signal
            for kt in range(KT):
                s = g % STAGES
                if kt >= ahead:
                    if g >= STAGES:
                        while not empty[s].ready(((g // STAGES) + 1) & 1): yield
                    full[s].arrive(A_BYTES + B_BYTES)
                    inflight.append((s, 'B', (tile, kt), B_BYTES)); yield
                inflight.append((s, 'A', (tile, kt), A_BYTES)); yield
                g += 1
    def consumer(w):
        g = 0
        for tile in range(n_tiles):
            for kt in range(KT):
                s = g % STAGES
                while not full[s].ready((g // STAGES) & 1): yield
                assert slotA[s] == (tile, kt) and slotB[s] == (tile, kt), (w, tile, kt, slotA[s], slotB[s])
                held[s].add(w); yield   # wgmma issued; reads s until the next wait<1>
                if kt > 0:
                    p = (g - 1) % STAGES; held[p].discard(w); empty[p].arrive()
                g += 1
            s = (g - 1) % STAGES; held[s].discard(w); empty[s].arrive()
            for _ in range(rnd.randrange(3)): yield   # epilogue
    actors = [producer()] + [consumer(w) for w in range(8)]
    alive = list(actors); steps = 0
    while alive or inflight:
        steps += 1; assert steps < 10**6, "deadlock"
        if inflight and (not alive or rnd.random() < 0.3):
            i = rnd.randrange(len(inflight)); s, part, tag, n = inflight.pop(i)
            assert not held[s], ("overwrite while read", s, held[s])
            if part == 'A': slotA[s] = tag
            else: slotB[s] = tag
            full[s].complete_tx(n); continue
        a = rnd.choice(alive)
        try: next(a)
        except StopIteration: alive.remove(a)
    return True

def run_cluster(seed, STAGES, KT, n_tiles, share_of):
    rnd = random.Random(seed)
    C = 2
    full = [[Bar(1) for _ in range(STAGES)] for _ in range(C)]
    empty = [[Bar(16) for _ in range(STAGES)] for _ in range(C)]
    slot = [[{} for _ in range(STAGES)] for _ in range(C)]   # part -> tag
    held = [[set() for _ in range(STAGES)] for _ in range(C)]
    exited = [False, False]; alive_threads = [9, 9]
    inflight = []
    n_units = (n_tiles + 1) // 2
    def tile_of(c, u):
        t = 2*u + c
        return (t, False) if t < n_tiles else (2*u, True)
    def producer(c):
        g = 0
        for u in range(n_units):
            t, _ = tile_of(c, u); share = share_of(u)
            def load_w(s, kt):
                if share:
                    for dst in range(C): inflight.append((dst, s, 'B%d' % c, (u, kt), 16))
                else:
                    inflight.append((c, s, 'B0', (u, kt, c), 16)); inflight.append((c, s, 'B1', (u, kt, c), 16))
            ahead = min(KT, STAGES)
            for kt in range(ahead):
                gk = g + kt; s = gk % STAGES
                if gk >= STAGES:
                    while not empty[c][s].ready(((gk // STAGES) + 1) & 1): yield
                full[c][s].arrive(48); load_w(s, kt); yield
            for _ in range(rnd.choice([0, 0, 3, 20])): yield
            for kt in range(KT):
                s = g % STAGES
                if kt >= ahead:
                    if g >= STAGES:
                        while not empty[c][s].ready(((g // STAGES) + 1) & 1): yield
                    full[c][s].arrive(48); load_w(s, kt); yield
                inflight.append((c, s, 'A', (t, kt), 16)); yield
                g += 1
        for s in range(min(STAGES, g)):
            last = s + (g - 1 - s) // STAGES * STAGES
            while not empty[c][s].ready((last // STAGES) & 1): yield
    def consumer(c, w):
        g = 0
        for u in range(n_units):
            t, dummy = tile_of(c, u); share = share_of(u)
            for kt in range(KT):
                s = g % STAGES
                while not full[c][s].ready((g // STAGES) & 1): yield
                sl = slot[c][s]
                assert sl['A'] == (t, kt), (c, w, sl, t, kt)
                if share: assert sl['B0'] == (u, kt) and sl['B1'] == (u, kt), (sl, u, kt)
                else: assert sl['B0'] == (u, kt, c) and sl['B1'] == (u, kt, c), (sl, u, kt, c)
                held[c][s].add(w); yield
                if kt > 0:
                    p = (g - 1) % STAGES; held[c][p].discard(w)
                    empty[c][p].arrive(); assert not exited[1 - c], "arrive on exited CTA"; empty[1 - c][p].arrive()
                g += 1
            p = (g - 1) % STAGES; held[c][p].discard(w)
            empty[c][p].arrive(); assert not exited[1 - c], "arrive on exited CTA"; empty[1 - c][p].arrive()
            for _ in range(rnd.randrange(3)): yield
    actors = [(c, producer(c)) for c in range(C)] + [(c, consumer(c, w)) for c in range(C) for w in range(8)]
    alive = list(actors); steps = 0
    while alive or inflight:
        steps += 1; assert steps < 10**6, "deadlock"
        if inflight and (not alive or rnd.random() < 0.3):
            i = rnd.randrange(len(inflight)); dst, s, part, tag, n = inflight.pop(i)
            assert not exited[dst], "TMA into exited CTA"
            assert not held[dst][s], ("overwrite while read", dst, s)
            slot[dst][s][part] = tag; full[dst][s].complete_tx(n); continue
        a = rnd.choice(alive)
        try: next(a[1])
        except StopIteration:
            alive.remove(a); alive_threads[a[0]] -= 1
            if alive_threads[a[0]] == 0: exited[a[0]] = True
    return True


if __name__ == "__main__":
    for seed in range(3000):
        r = random.Random(seed)
        STAGES = r.choice([4, 6]); KT = r.choice([1, 2, 3, 4, 5, 6, 7, 16]); tiles = r.randrange(1, 5)
        delays = [r.choice([0, 0, 5, 40]) for _ in range(tiles)]
        run_single(seed, STAGES, KT, tiles, lambda t: delays[t])
    for seed in range(3000):
        r = random.Random(seed)
        KT = r.choice([1, 2, 3, 4, 5, 7, 16]); tiles = r.randrange(1, 8)
        shares = [r.random() < 0.6 for _ in range(tiles)]
        run_cluster(seed, 4, KT, tiles, lambda u: shares[u])
    print("ok: 3000 single-CTA and 3000 cluster runs")
