#!/usr/bin/env python3
"""Model check of flux_gemm_ws's shared-memory ring (src/backend/cuda/flux/flux.cu), off the GPU.

Random interleavings of the producer thread and the 8 consumer warps of one CTA (configurations
2-3), with mbarriers as PTX defines them (arrival count, transaction bytes, phases; a
try_wait.parity(P) succeeds once the phase of parity P is complete), TMA copies landing late and
in any order, chunk signals arriving late. Checks: every slice a consumer reads holds that
slice's x and w; no copy lands in a slot a warp still reads; no deadlock. (The cluster form of
the deleted configuration 6 was checked here too: git show b6128f6.) Usage:
tools/flux_ring_model.py (prints ok).
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

if __name__ == "__main__":
    for seed in range(3000):
        r = random.Random(seed)
        STAGES = r.choice([4, 6]); KT = r.choice([1, 2, 3, 4, 5, 6, 7, 16]); tiles = r.randrange(1, 5)
        delays = [r.choice([0, 0, 5, 40]) for _ in range(tiles)]
        run_single(seed, STAGES, KT, tiles, lambda t: delays[t])
    print("ok: 3000 single-CTA runs")
