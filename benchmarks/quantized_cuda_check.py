"""The CUDA C++ of ``backends/cuda/quantized.py`` checked and timed on a GPU with CuPy
alone (no lazyx install needed on the GPU machine): every kernel (qmm_t, qmm_n, the
qmm_t4 fast path) against a NumPy product of the dequantized weights for each width
and mode, then the decode-shaped 4-bit product (1x4096 . 4096x4096, group 64) in GB/s.
Run from the repository root: ``python benchmarks/quantized_cuda_check.py``.
"""
import ast

import cupy as cp
import numpy as np

with open("backends/cuda/quantized.py") as f:
    src = f.read()
tree = ast.parse(src)
SOURCE = next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "_SOURCE")
FAST=[(2,0),(4,0),(8,0),(4,1),(8,2)]
mod = cp.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=[f"qmm_t4<{b}, {m}>" for b,m in FAST])
mod.compile()
FP4 = np.array([0,.5,1,1.5,2,3,4,6,-0.,-.5,-1,-1.5,-2,-3,-4,-6], np.float32)
def e4m3(c):
    c=c.astype(np.int32); e=(c>>3)&15; m=c&7
    v=np.where(e==0, np.ldexp(m.astype(np.float32),-9), np.ldexp(1+m/8.0,e-7)).astype(np.float32)
    return np.where(c&128,-v,v)
def pack(vals,bits):
    r,n=vals.shape
    b=((vals[...,None].astype(np.uint32)>>np.arange(bits,dtype=np.uint32))&1).astype(np.uint8).reshape(r,-1)
    return np.packbits(b,axis=-1,bitorder='little').view('<u4')
rng=np.random.default_rng(0)
ok=True
for mode,bits,gs in [(0,4,64),(0,2,32),(0,8,128),(0,3,32),(0,5,64),(0,6,32),(1,4,32),(2,8,32)]:
    for tr in [True,False]:
        P,M,K,N=3,2,256,128
        R,cols=(N,K) if tr else (K,N)
        codes=rng.integers(0,1<<bits,(2*R,cols)).astype(np.uint32)
        if mode==2: codes[(codes&127)==127]=0
        w=pack(codes,bits).reshape(2,R,-1)
        sc=rng.uniform(0.5,2,(2,R,cols//gs)).astype(np.float32); bi=rng.standard_normal(sc.shape).astype(np.float32)
        vals=codes.reshape(2,R,cols).astype(np.float32) if mode==0 else (FP4[codes] if mode==1 else e4m3(codes)).reshape(2,R,cols)
        deq=vals*np.repeat(sc,gs,-1)+(np.repeat(bi,gs,-1) if mode==0 else 0)
        x=rng.standard_normal((2,M,K)).astype(np.float32)
        xi=np.array([0,1,1]); wi=np.array([1,1,0])
        want=np.stack([x[a]@(deq[b].T if tr else deq[b]) for a,b in zip(xi,wi)])
        out=cp.empty((P,M,N),cp.float32)
        total=P*M*N; threads=total*32 if tr else total
        args=(cp.asarray(x),cp.asarray(w),cp.asarray(sc),cp.asarray(bi),cp.asarray(xi.astype(np.int64)),cp.asarray(wi.astype(np.int64)),out,
              np.int64(P),np.int64(M),np.int64(K),np.int64(N),np.int64(w.shape[-1]),np.int64(sc.shape[-1]),np.int32(bits),np.int32(gs),np.int32(mode),np.int64(2),np.int64(2),np.int32(mode==0))
        mod.get_function("qmm_t" if tr else "qmm_n")(((threads+255)//256,),(256,),args)
        err=float(np.abs(out.get()-want).max()/np.abs(want).max())
        print(mode,bits,gs,tr,"err %.2e"%err); ok&= err<1e-5
        if tr and (bits,mode) in FAST:
            out[...]=0
            mod.get_function(f"qmm_t4<{bits}, {mode}>")(((N+63)//64,P*M),(256,),args[:13]+(np.int32(gs),args[-1]),shared_mem=(K+sc.shape[-1])*4)
            err=float(np.abs(out.get()-want).max()/np.abs(want).max())
            print("  fast",mode,bits,gs,"err %.2e"%err); ok&= err<1e-5
print("ALL OK" if ok else "FAILED")
# decode-shaped speed: 1x4096 . 4096x4096 4-bit affine. One launch multiplies B such
# products with B distinct weight matrices (B * 8 MiB, far beyond L2), so the time per
# product is the kernel's, not Python's launch overhead.
K=N=4096; gs=64; B=32
w=cp.asarray(rng.integers(0,2**32,(B,N,K//8),dtype=np.uint64).astype(np.uint32)); sc=cp.ones((B,N,K//gs),cp.float32); bi=cp.zeros_like(sc)
x=cp.ones((B,1,K),cp.float32); out=cp.empty((B,1,N),cp.float32); z=cp.arange(B,dtype=cp.int64)
byt=N*K/2+N*K//gs*8+K*4+N*4
for name in ["qmm_t4<4, 0>", "qmm_t"]:
    f=mod.get_function(name)
    common=(x,w,sc,bi,z,z,out,np.int64(B),np.int64(1),np.int64(K),np.int64(N),np.int64(K//8),np.int64(K//gs))
    args=common+((np.int32(gs),np.int32(1)) if "4" in name else (np.int32(4),np.int32(gs),np.int32(0),np.int64(B),np.int64(B),np.int32(1)))
    g=((N+63)//64,B) if "4" in name else ((B*N*32+255)//256,)
    kw={"shared_mem":(K+K//gs)*4} if "4" in name else {}
    for _ in range(3): f(g,(256,),args,**kw)
    ts=[]
    for _ in range(20):
        s_=cp.cuda.Event(); e=cp.cuda.Event(); s_.record(); f(g,(256,),args,**kw); e.record(); e.synchronize(); ts.append(cp.cuda.get_elapsed_time(s_,e)/B)
    t=min(ts)
    print("%s qmv 4096x4096 4-bit: %.2f us per product, %.0f GB/s (H200 HBM3e ~4800 GB/s)"%(name, t*1e3, byt/t/1e6))
