"""Lane-level numpy emulation of src/backend/cuda/deberta/attention_rel.cu, for checking its index
arithmetic without a GPU (docs/deberta.md):
1. the bucket table: rows[d + sat] saturates past +-sat, is monotone, and every distance of a
   sequence no longer than max_seqlen lands in [r_lo, r_lo + W) (several bucket settings);
2. rel_proj_mma_kernel: ldmatrix.x4 and mma.m16n8k16 emulated per lane, the accumulator stored
   at the kernel's (token, table row), against A·Bᵀ (head sizes 32/64/128);
3. attention_rel_mma_kernel: the S accumulator element -> (query row, key), the bias gather from
   the [T, heads, W] scratch, the online softmax over 64-key tiles with quad reductions, against
   HF's formula written out (lengths 1 to 130, a graph's slack rows and rounded max_seqlen);
4. the tensor-core path (head sizes 32/64/128): the per-row windows of attention_rel_band_kernel and
   rel_proj_half_kernel's output staging (check_band).
Run: python3 scripts/emulate_attention_rel.py (prints the largest differences, ~1e-14)."""
import numpy as np

f32=np.float32
def bucket(rel,buckets,maxrel):
    if buckets<=0: return rel
    mid=buckets//2; a=abs(rel)
    if a<=mid: return rel
    lp=np.ceil(f32(np.log(f32(a)/f32(mid)))/f32(np.log(f32(np.float64(maxrel-1)/np.float64(mid))))*f32(mid-1))+f32(mid)
    return -int(lp) if rel<0 else int(lp)
def row(d,k,b,m):
    r=bucket(d,b,m)+k; return max(0,min(2*k-1,r))
def check_table():
    for (b,m,k) in [(256,512,256),(8,64,8),(-1,5,5),(16,40,16),(32,256,32),(4,7,4),(-1,24,24),(8,96,8),(-1,12,12)]:
        sat=0
        while row(sat,k,b,m)!=2*k-1 or row(-sat,k,b,m)!=0: sat+=1
        tab=[row(d,k,b,m) for d in range(-sat,sat+1)]
        assert all(tab[i]<=tab[i+1] for i in range(len(tab)-1)), (b,m,k)
        for d in range(-3000,3001):
            dd=max(-sat,min(sat,d)); assert tab[dd+sat]==row(d,k,b,m)
        for max_len in [1,2,37,64,512,576]:
            rlo=row(-(max_len-1),k,b,m); W=row(max_len-1,k,b,m)-rlo+1
            assert 1<=W<=min(2*max_len-1,2*k)
            for L in [1,max_len//2+1,max_len]:
                for dist in range(-(L-1),L):
                    r=tab[max(-sat,min(sat,dist))+sat]-rlo
                    assert 0<=r<W
        print('table buckets %d max_rel %d k %d: sat %d, every lookup in range' % (b, m, k, sat))

def ldmatrix_x4(smem, LDS, addr_of_lane):
    # returns regs[lane][j] = (lo, hi)
    regs=[[None]*4 for _ in range(32)]
    rows=[addr_of_lane(i) for i in range(32)]  # flat element offsets
    for j in range(4):
        for t in range(32):
            base=rows[j*8 + t//4]
            regs[t][j]=(smem[base+2*(t%4)], smem[base+2*(t%4)+1])
    return regs
def mma(c, a, b0, b1):
    # c[lane][4], a[lane][4] pairs, b0/b1[lane] pairs
    A=np.zeros((16,16)); B=np.zeros((16,8))
    for l in range(32):
        g,cc=l//4,l%4
        A[g,2*cc:2*cc+2]=a[l][0]; A[g+8,2*cc:2*cc+2]=a[l][1]; A[g,2*cc+8:2*cc+10]=a[l][2]; A[g+8,2*cc+8:2*cc+10]=a[l][3]
        B[2*cc:2*cc+2,g]=b0[l]; B[2*cc+8:2*cc+10,g]=b1[l]
    C=A@B
    for l in range(32):
        g,cc=l//4,l%4
        c[l][0]+=C[g,2*cc]; c[l][1]+=C[g,2*cc+1]; c[l][2]+=C[g+8,2*cc]; c[l][3]+=C[g+8,2*cc+1]
def check_projection():
    rng=np.random.default_rng(3)
    for D in (32,64,128):
        ROWS=64; LDS=D+8; KQ=D//16; NT=8
        Am=rng.standard_normal((ROWS,D)); Bm=rng.standard_normal((ROWS,D))
        sA=np.zeros(ROWS*LDS); sB=np.zeros(ROWS*LDS)
        for r in range(ROWS): sA[r*LDS:r*LDS+D]=Am[r]; sB[r*LDS:r*LDS+D]=Bm[r]
        out=np.full((ROWS,ROWS),np.nan)
        for warp in range(4):
            acc=[[ [0.0]*4 for _ in range(32)] for _ in range(NT)]
            for kk in range(KQ):
                a=ldmatrix_x4(sA,LDS,lambda lane:(warp*16+(lane&15))*LDS+kk*16+(lane>>4)*8)
                for nn in range(NT//2):
                    b=ldmatrix_x4(sB,LDS,lambda lane:(nn*16+(lane&7)+(lane>>4)*8)*LDS+kk*16+((lane>>3)&1)*8)
                    mma(acc[2*nn], a, [b[l][0] for l in range(32)], [b[l][1] for l in range(32)])
                    mma(acc[2*nn+1], a, [b[l][2] for l in range(32)], [b[l][3] for l in range(32)])
            for t in range(NT):
                for lane in range(32):
                    for e in range(4):
                        tok=warp*16+lane//4+(e>>1)*8; r=t*8+(lane&3)*2+(e&1)
                        out[tok,r]=acc[t][lane][e]
        err=np.abs(out-Am@Bm.T).max()
        print('projection d=%d: max |emulated - A Bt| %.1e' % (D, err))
        assert err < 1e-9

rng=np.random.default_rng(1)
rowf=row
def run(lens,heads,D,k,b,m,c2p_on,p2c_on,extra_rows=0,round_max=False):
    cu=np.concatenate([[0],np.cumsum(lens)]); T=cu[-1]+extra_rows; H=heads*D
    qkv=rng.uniform(-1,1,(T,3,heads,D)); pk=rng.uniform(-1,1,(2*k,heads,D)); pq=rng.uniform(-1,1,(2*k,heads,D))
    max_len=max(lens); 
    if round_max: max_len=(max_len+63)//64*64
    sat=0
    while rowf(sat,k,b,m)!=2*k-1 or rowf(-sat,k,b,m)!=0: sat+=1
    tab=np.array([rowf(d,k,b,m) for d in range(-sat,sat+1)])
    rlo=rowf(-(max_len-1),k,b,m); W=rowf(max_len-1,k,b,m)-rlo+1
    # projection kernel: dst[t,h,r] = a[t,h] . table[rlo+r, h]
    c2p=np.einsum('thd,rhd->thr',qkv[:,0],pk[rlo:rlo+W]) if c2p_on else None
    p2c=np.einsum('thd,rhd->thr',qkv[:,1],pq[rlo:rlo+W]) if p2c_on else None
    scale=1/np.sqrt(D*3); out=np.full((T,heads,D),np.nan)
    BM=BN=64
    for s in range(len(lens)):
        start=cu[s]; L=lens[s]
        for h in range(heads):
            for mb in range((max_len+BM-1)//BM):
                m0=mb*BM
                if m0>=L: continue
                for warp in range(4):
                    mrun=np.full((32,2),-np.inf); lrun=np.zeros((32,2)); o=np.zeros((32,2,D))
                    for j in range((L+BN-1)//BN):
                        n0=j*BN
                        S=np.zeros((32,8,4))
                        for lane in range(32):
                            for t in range(8):
                                for e in range(4):
                                    col=n0+t*8+(lane&3)*2+(e&1); r=m0+warp*16+lane//4+(e>>1)*8
                                    qv=qkv[start+r,0,h] if r<L else np.zeros(D)
                                    kv=qkv[start+col,1,h] if col<L else np.zeros(D)
                                    sc=qv@kv
                                    if col>=L: sc=-np.inf
                                    elif r<L:
                                        dist=max(-sat,min(sat,r-col)); rr=tab[dist+sat]-rlo; rr=max(0,min(W-1,rr))
                                        bb=0
                                        if c2p is not None: bb+=c2p[start+r,h,rr]
                                        if p2c is not None: bb+=p2c[start+col,h,rr]
                                        sc+=bb
                                    S[lane,t,e]=sc
                        for lane in range(32):
                            for rI in range(2):
                                # quad max over lanes lane&~3 .. +3
                                q0=lane&~3
                                mx=max(S[q0+i,:,2*rI:2*rI+2].max() for i in range(4))
                                mnew=max(mrun[lane,rI],mx); alpha=np.exp2((mrun[lane,rI]-mnew)*scale*np.log2(np.e))
                                p=np.exp((S[lane,:,2*rI:2*rI+2]-mnew)*scale)
                                mrun[lane,rI]=mnew; lrun[lane,rI]=lrun[lane,rI]*alpha+p.sum()
                                o[lane,rI]*=alpha
                                # P V: this lane's p entries at keys n0+t*8+(lane&3)*2+{0,1}; sum over quad later
                                for t in range(8):
                                    for e2 in range(2):
                                        col=n0+t*8+(lane&3)*2+e2
                                        v=qkv[start+col,2,h] if col<L else np.zeros(D)
                                        o[lane,rI]+=p[t,e2]*v
                    for lane in range(0,32,4):
                        for rI in range(2):
                            r=m0+warp*16+lane//4+rI*8
                            l=lrun[lane:lane+4,rI].sum(); ov=o[lane:lane+4,rI].sum(0)/l
                            if r<L: out[start+r,h]=ov
    # direct reference
    ref=np.full_like(out,np.nan)
    for s in range(len(lens)):
        start=cu[s]; L=lens[s]
        for h in range(heads):
            q=qkv[start:start+L,0,h]; kk=qkv[start:start+L,1,h]; v=qkv[start:start+L,2,h]
            sc=q@kk.T
            for i in range(L):
                for j in range(L):
                    if c2p_on: sc[i,j]+=q[i]@pk[rowf(i-j,k,b,m),h]
                    if p2c_on: sc[i,j]+=kk[j]@pq[rowf(i-j,k,b,m),h]
            sc*=scale; p=np.exp(sc-sc.max(1,keepdims=True)); p/=p.sum(1,keepdims=True)
            ref[start:start+L,h]=p@v
    n=cu[-1]
    return np.abs(out[:n]-ref[:n]).max()

def check_band():
    """The tensor-core path (head sizes 32/64/128): fp16 scratch [T, heads, Wp] read through
    attention_rel_band_kernel's per-row windows (band_load: sR, sB, at most 9 chunks of 8 a row) against
    the direct lookup scratch[token, row(i - j) - r_lo], for every in-sequence pair of every
    (64-query tile, 64-key tile); pad columns and unloaded chunks are NaN so a stray read shows.
    The scratch is written only in the projection tiles some token reads (proj_tile_needed, a
    packed stream of two sequences). Also rel_proj_half_kernel's output staging: accumulator (lane, n-tile, e) -> sO[token][col] ->
    16-byte chunk (row, ch) of the scratch."""
    WIN_CH, WIN_COLS = 9, 72
    for (b,m,k) in [(256,512,256),(8,64,8),(-1,5,5),(16,40,16),(32,256,32),(4,7,4),(-1,24,24),(256,140,256)]:
        sat=0
        while row(sat,k,b,m)!=2*k-1 or row(-sat,k,b,m)!=0: sat+=1
        tab=[row(d,k,b,m) for d in range(-sat,sat+1)]
        for max_len in [1,37,64,300,512,576]:
            rlo=row(-(max_len-1),k,b,m); W=row(max_len-1,k,b,m)-rlo+1; Wp=(W+7)//8*8
            def col(d): return max(0,min(W-1,tab[max(-sat,min(sat,d))+sat]-rlo))
            for L in sorted({1,max_len//2+1,max_len}):
                # a packed stream: a sequence of 37 tokens, then this one (start 37); rel_proj_half_kernel
                # writes only the (64-token, 64-column) tiles a token reads (proj_tile_needed), the rest
                # of the scratch stays NaN
                pre=37; seqs=[(0,pre),(pre,L)]; T=pre+L
                full=np.arange(T*W,dtype=float).reshape(T,W)
                Sc=np.full((T,Wp),np.nan); Sp=np.full((T,Wp),np.nan)
                for term,Sx in ((0,Sc),(1,Sp)):
                    for t0 in range(0,T,64):
                        for r0 in range(0,Wp,64):
                            hit=False
                            for t in range(t0,min(t0+64,T)):
                                st,ln=[q for q in seqs if q[0]<=t<q[0]+q[1]][0]; pp=t-st
                                lo=col(pp-(ln-1) if term==0 else -pp); hi=col(pp if term==0 else ln-1-pp)
                                hit|=lo<r0+64 and hi>=r0
                            if hit:
                                Sx[t0:t0+64,r0:min(r0+64,W)]=full[t0:t0+64,r0:min(r0+64,W)]
                                Sx[t0:t0+64,W:Wp]=0
                Sc=Sc[pre:]; Sp=Sp[pre:]; S=full[pre:]
                fallback=tiles=0
                for m0 in range(0,L,64):
                    for n0 in range(0,L,64):
                        tiles+=1
                        dlo=m0-n0-63
                        sR=[col(dlo+t) for t in range(127)]
                        sB=[0]*128; sN=[0]*128; wide=False
                        for tid in range(128):
                            lo_d=dlo+tid if tid<64 else m0-n0-(tid-64)
                            lo=col(lo_d); hi=col(lo_d+63); base=lo&~7
                            sB[tid]=base; sN[tid]=(hi-base)//8+1
                            wide|=hi-base>=WIN_COLS
                        if wide:
                            fallback+=1; continue
                        sC=np.full((64,WIN_COLS),np.nan); sP=np.full((64,WIN_COLS),np.nan)
                        for i in range(2*64*WIN_CH):
                            which=i//(64*WIN_CH); rem=i%(64*WIN_CH); r=rem//WIN_CH; ch=rem%WIN_CH
                            if ch>=sN[which*64+r]: continue
                            r0=n0 if which else m0; c0=sB[which*64+r]+ch*8
                            assert c0+8<=Wp
                            if r0+r<L: (sP if which else sC)[r,ch*8:ch*8+8]=(Sp if which else Sc)[r0+r,c0:c0+8]
                        for lane in range(32):
                            for w in range(4):
                                qw=w*16+lane//4; bq=[sB[qw],sB[qw+8]]
                                for t in range(8):
                                    kc0=t*8+(lane&3)*2; bk=[sB[64+kc0],sB[65+kc0]]
                                    for e in range(4):
                                        kc=kc0+(e&1); qr=qw+(e>>1)*8
                                        i=m0+qr; j=n0+kc
                                        if i>=L or j>=L: continue
                                        bb=sR[qr-kc+63]
                                        assert 0<=bb-bq[e>>1]<WIN_COLS and 0<=bb-bk[e&1]<WIN_COLS
                                        assert sC[qr,bb-bq[e>>1]]==S[i,col(i-j)], (b,m,k,L,m0,n0,qr,kc)
                                        assert sP[kc,bb-bk[e&1]]==S[j,col(i-j)], (b,m,k,L,m0,n0,qr,kc)
                if max_len==512 and L==512:
                    print('band buckets %4d max_rel %3d k %3d L %d: W %d, %d of %d tiles from the band, the rest '
                          'gathered' % (b,m,k,L,W,tiles-fallback,tiles))
    # the projection's output staging (one 64 x 64 tile)
    acc=np.zeros((64,64)); sO=np.full((64,72),np.nan)
    for w in range(4):
        for lane in range(32):
            for t in range(8):
                for e in range(4):
                    tok=w*16+lane//4+(e>>1)*8; r=t*8+(lane&3)*2+(e&1)
                    acc[tok,r]=tok*1000+r
                    # the kernel writes (e0, e1) at [tok][col], (e2, e3) at [tok + 8][col]
                    tk=w*16+lane//4+(8 if e>=2 else 0); cl=t*8+(lane&3)*2+(e&1)
                    sO[tk,cl]=acc[tok,r]
    out=np.full((64,64),np.nan)
    for tid in range(128):
        for i in range(4):
            c=tid+i*128; rr=c//8; ch=c%8
            out[rr,ch*8:ch*8+8]=sO[rr,ch*8:ch*8+8]
    assert np.array_equal(out,acc)
    print('band: every lookup equal to the direct one; projection staging exact')

if __name__ == '__main__':
    check_band()
    check_table()
    check_projection()
    for args, kw in [(([1,70,130],2,16,8,8,64,1,1), {}), (([3,65],1,8,5,-1,5,1,0), dict(extra_rows=5, round_max=True)),
                     (([64,20],2,8,16,16,40,0,1), {})]:
        err = run(*args, **kw)
        print('attention lengths %s: max |emulated - reference| %.1e' % (args[0], err))
        assert err < 1e-9
