"""Builds of the kernel library side by side in one process, rep by rep: one Qwen2 decoder layer
(the 0.5B's or the 1.5B's shapes, random int8 weights, a bf16 cache with bf16 scores as on an
AVX512-BF16 CPU), n rows attending over `keys` cache slots (a causal chain at the end), 2 threads.
Prints each build's fastest ms and the median of its per-rep ratio to the first build (the order
alternates rep by rep). docs/kernels.md "Attention" measured attention's parts with it: builds that
skip one part each (wrong outputs, timing only) against the whole.

    for c in old new; do mkdir -p /tmp/ab/$c; cp completiond/models/kernels/*.[ch] /tmp/ab/$c/; done
    # edit /tmp/ab/new, then in each:
    (cd /tmp/ab/$c && gcc -O3 -mavx2 -mfma -fopenmp -ffp-contract=off -shared -fPIC -o lib.so \
        int8_mm.c a16_mm.c a8_mm.c w4_mm.c mm.c qwen2_layer.c)
    REPS=60 LIBS=old,new python -m benchmarks.experiments layer_build_ab 0.5b 1,4,8 1536
"""
import ctypes
import os
import sys
import time

import torch
from completiond.models.kernels import cpu_kernel as ck
torch.set_num_threads(2)
names = os.environ.get("LIBS", "old,new").split(",")
libs = {n: ctypes.CDLL(f'/tmp/ab/{n}/lib.so') for n in names}
for lib in libs.values():
    for name_, (args, res) in ck.SIGNATURES.items():
        if not hasattr(lib, name_): continue
        fn = getattr(lib, name_); fn.argtypes, fn.restype = args, res
    lib.completiond_zmm(1); lib.completiond_w4_zmm_rows(3)
H, heads, kv, d, inter = {"0.5b": (896, 14, 2, 64, 4864), "1.5b": (1536, 12, 2, 128, 8960)}[sys.argv[1]]
g = torch.Generator().manual_seed(0)
nqkv = (heads + 2 * kv) * d
def w(n, k): return torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g), torch.rand(n, generator=g) * 0.01
wqkv, sqkv = w(nqkv, H); wo, so = w(H, heads * d); wgu, sgu = w(2 * inter, H); wd, sd = w(H, inter)
bqkv = torch.randn(nqkv, generator=g) * 0.1
norm = torch.ones(H)
cap = 4096
kc = (torch.randn(kv, cap, d, generator=g)).to(torch.bfloat16); vc = torch.randn(kv, cap, d, generator=g).to(torch.bfloat16)
kind = ck.KINDS["int8+avx512-vnni"]
reps = int(os.environ.get("REPS", 30))
for keys_total in [int(k) for k in sys.argv[3].split(",")]:
    for n in [int(r) for r in sys.argv[2].split(",")]:
        begin = keys_total - n
        mask = torch.zeros(n, keys_total, dtype=torch.uint8)
        for r in range(n): mask[r, :begin + r + 1] = 1
        cos = torch.randn(n, d, generator=g); sin = torch.randn(n, d, generator=g)
        h0 = torch.randn(n, H, generator=g)
        best, times = {}, {nm: [] for nm in libs}
        for rep in range(reps):
            for nm, lib in (list(libs.items()) if rep % 2 else list(libs.items())[::-1]):
                work = torch.empty(lib.completiond_qwen2_work(n, H, inter, heads, kv, d, keys_total, 2))
                h = h0.clone()
                t0 = time.perf_counter()
                lib.completiond_qwen2_layer(h.data_ptr(), n, H, norm.data_ptr(), norm.data_ptr(), 1e-6, wqkv[0].data_ptr(), sqkv.data_ptr(),
                    bqkv.data_ptr(), wo[0].data_ptr(), so.data_ptr(), wgu[0].data_ptr(), sgu.data_ptr(), inter, wd[0].data_ptr(), sd.data_ptr(),
                    cos.data_ptr(), sin.data_ptr(), kc.data_ptr(), vc.data_ptr(), 2, cap, begin, keys_total, mask.data_ptr(), heads, kv, d,
                    d ** -0.5, work.data_ptr(), kind, kind, 2)
                ms = (time.perf_counter() - t0) * 1000
                best[nm] = min(best.get(nm, 1e9), ms); times[nm].append(ms)
        first = names[0]
        ratios = {nm: round(sorted(a / b for a, b in zip(times[nm], times[first]))[reps // 2], 3) for nm in names[1:]}
        print(f"keys {keys_total} rows {n}:", {k: round(v, 3) for k, v in best.items()}, "median ratio to", first, ratios, flush=True)
