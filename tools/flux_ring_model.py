#!/usr/bin/env python3
"""Model check of flux_gemm_ws's shared-memory ring (src/backend/cuda/flux/flux.cu), off the GPU.

Random interleavings of the producer thread and the 8 consumer warps of one CTA (configurations
2-3), with mbarriers as PTX defines them (arrival count, transaction bytes, phases; a
try_wait.parity(P) succeeds once the phase of parity P is complete), TMA copies landing late and
in any order, chunk signals arriving late. A tile is KT slices, then, for a local
ReduceScatter tile, the peers' partial boxes: PER_SLOT boxes a slot (the x part of the slot one,
the w part the rest: 3 for 128x256 with 4 stages, 2 for 128x128 with 6), the last slot maybe
part full, each source's signal arriving late. Checks: every slice a consumer reads holds that
slice's x and w, every partial slot the boxes of that tile and slot (and no stale one past a
part-full slot's boxes is read); no copy lands in a slot a warp still reads; no deadlock. (The
cluster form of the deleted configuration 6 was checked here too: git show b6128f6.) And
add_box's ldmatrix addresses against wgmma's accumulator layout (check_box_fragments). Usage:
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

def run_single(seed, STAGES, PER_SLOT, KT, tiles, signal_delay, box_delay):
    """tiles: per tile (col_boxes, sources): 0 sources for a tile without partials (AllGather,
    a remote ReduceScatter tile), else W - 1 sources of col_boxes boxes each."""
    rnd = random.Random(seed)
    full = [Bar(1) for _ in range(STAGES)]; empty = [Bar(8) for _ in range(STAGES)]
    slot = [[None] * PER_SLOT for _ in range(STAGES)]  # what each box position holds
    held = [set() for _ in range(STAGES)]  # warps that may still read the slot
    inflight = []  # (slot, positions, tag, bytes)
    BOX = 16; A_BYTES, B_BYTES = BOX, BOX * (PER_SLOT - 1)
    def boxes(tile):
        col_boxes, sources = tiles[tile]; return col_boxes, col_boxes * sources
    def producer():
        g = 0
        for tile in range(len(tiles)):
            ahead = min(KT, STAGES)
            for kt in range(ahead):
                gk = g + kt; s = gk % STAGES
                if gk >= STAGES:
                    while not empty[s].ready(((gk // STAGES) + 1) & 1): yield
                full[s].arrive(A_BYTES + B_BYTES)
                inflight.append((s, range(1, PER_SLOT), (tile, kt, 'w'), B_BYTES)); yield
            for _ in range(signal_delay(tile)): yield   # the chunk's signal
            for kt in range(KT):
                s = g % STAGES
                if kt >= ahead:
                    if g >= STAGES:
                        while not empty[s].ready(((g // STAGES) + 1) & 1): yield
                    full[s].arrive(A_BYTES + B_BYTES)
                    inflight.append((s, range(1, PER_SLOT), (tile, kt, 'w'), B_BYTES)); yield
                inflight.append((s, range(0, 1), (tile, kt, 'x'), A_BYTES)); yield
                g += 1
            # the partial boxes, as flux_gemm_ws's producer issues them
            col_boxes, nb = boxes(tile); acquired = 0
            for i0 in range(0, nb, PER_SLOT):
                s = g % STAGES; n = min(PER_SLOT, nb - i0); last = (i0 + n - 1) // col_boxes
                while acquired <= last:
                    for _ in range(box_delay(tile, acquired)): yield   # source's signal
                    acquired += 1
                if g >= STAGES:
                    while not empty[s].ready(((g // STAGES) + 1) & 1): yield
                full[s].arrive(n * BOX)
                for k in range(n):
                    inflight.append((s, range(k, k + 1), (tile, 'p', i0 + k), BOX)); yield
                g += 1
    def consumer(w):
        g = 0
        for tile in range(len(tiles)):
            for kt in range(KT):
                s = g % STAGES
                while not full[s].ready((g // STAGES) & 1): yield
                want = [(tile, kt, 'x')] + [(tile, kt, 'w')] * (PER_SLOT - 1)
                assert slot[s] == want, (w, tile, kt, slot[s])
                held[s].add(w); yield   # wgmma issued; reads s until the next wait<1>
                if kt > 0:
                    p = (g - 1) % STAGES; held[p].discard(w); empty[p].arrive()
                g += 1
            s = (g - 1) % STAGES; held[s].discard(w); empty[s].arrive()
            col_boxes, nb = boxes(tile)
            for i0 in range(0, nb, PER_SLOT):
                s = g % STAGES
                while not full[s].ready((g // STAGES) & 1): yield
                held[s].add(w)
                for k in range(min(PER_SLOT, nb - i0)):   # the boxes read: exactly those loaded
                    assert slot[s][k] == (tile, 'p', i0 + k), (w, tile, i0, k, slot[s])
                    yield   # ldmatrix and adds
                held[s].discard(w); empty[s].arrive()   # after __syncwarp
                g += 1
            for _ in range(rnd.randrange(3)): yield   # epilogue
    actors = [producer()] + [consumer(w) for w in range(8)]
    alive = list(actors); steps = 0
    while alive or inflight:
        steps += 1; assert steps < 10**6, "deadlock"
        if inflight and (not alive or rnd.random() < 0.3):
            i = rnd.randrange(len(inflight)); s, pos, tag, n = inflight.pop(i)
            assert not held[s], ("overwrite while read", s, held[s])
            for k in pos: slot[s][k] = tag
            full[s].complete_tx(n); continue
        a = rnd.choice(alive)
        try: next(a)
        except StopIteration: alive.remove(a)
    assert all(not h for h in held)
    return True

def check_box_fragments():
    """add_box's addresses, simulated: a 128 x 64 box as TMA writes it (128-byte swizzle: 16-byte
    piece c of row r at c ^ (r % 8)), read by ldmatrix.x4 at add_box's lane addresses (lanes
    8m..8m+7 give matrix m's rows; lane l gets row l/4, elements 2(l%4), 2(l%4)+1 of each), put
    where add_box puts them; each lane's d[4j + 2h + e] must be wgmma's accumulator element (row
    r0 + l/4 + 8h, column 8j + 2(l%4) + e) for every column box and warp."""
    mem = {r * 128 + (((c // 8) ^ (r % 8)) * 16) + (c % 8) * 2: (r, c) for r in range(128) for c in range(64)}
    for cb in range(4):
        for r0 in range(0, 128, 16):
            got = {}
            for jj in range(0, 8, 2):
                addr = []
                for lane in range(32):
                    row = r0 + (lane & 7) + ((lane >> 3) & 1) * 8
                    addr.append(row * 128 + (((jj + (lane >> 4)) ^ (row & 7)) << 4))
                for lane in range(32):
                    for m in range(4):
                        base = addr[8 * m + lane // 4] + (lane % 4) * 4
                        at = 4 * (8 * cb + jj + (m >> 1)) + 2 * (m & 1)
                        got[(lane, at)], got[(lane, at + 1)] = mem[base], mem[base + 2]
            for lane in range(32):
                for j in range(8 * cb, 8 * cb + 8):
                    for h in range(2):
                        for e in range(2):
                            want = (r0 + lane // 4 + 8 * h, 8 * j + 2 * (lane % 4) + e - 64 * cb)
                            assert got[(lane, 4 * j + 2 * h + e)] == want, (cb, r0, lane, j, h, e)

if __name__ == "__main__":
    check_box_fragments()
    RUNS = 4000
    for seed in range(RUNS):
        r = random.Random(seed)
        STAGES, PER_SLOT, COLS = r.choice([(4, 3, 4), (6, 2, 2)])  # 128x256 and 128x128
        KT = r.choice([1, 2, 3, 4, 5, 6, 7, 16]); n_tiles = r.randrange(1, 5)
        # ReduceScatter: the local chunk's tiles last, W - 1 = 0..7 sources; AllGather: none
        rs = r.random() < 0.8; W = r.randrange(1, 9); n_local = r.randrange(0, n_tiles + 1) if rs else 0
        tiles = [(0, 0)] * (n_tiles - n_local) + [(r.randrange(1, COLS + 1), W - 1) for _ in range(n_local)]
        delays = [r.choice([0, 0, 5, 40]) for _ in range(n_tiles)]
        src_delays = {(t, i): r.choice([0, 0, 3, 30]) for t in range(n_tiles) for i in range(8)}
        run_single(seed, STAGES, PER_SLOT, KT, tiles, lambda t: delays[t], lambda t, i: src_delays[(t, i)])
    print("ok: add_box's fragments; %d single-CTA runs (slices and partial boxes)" % RUNS)
