"""Before/after of kernel libraries side by side: every layer matmul of a 0.5B-shaped pass (24
layers' distinct random weights, streamed from memory as in a real pass), then the output layer,
at each row count; the libraries interleaved rep by rep (a shared machine's noise hits them alike),
fastest rep per cell, process CPU clock; and whether their outputs are bit-identical.

Build a library from a source folder (the flags cpu_kernel.py uses):
    (cd SRC && gcc -O3 -mavx2 -mfma -fopenmp -ffp-contract=off -shared -fPIC \
        int8_mm.c a16_mm.c a8_mm.c mm.c qwen2_layer.c -o OUT.so -lm)
    python -m benchmarks.experiments kernel_ab OLD.so NEW.so     # env: SIZES=1,8 REPS=5 T=1 KIND=int8+avx512-vnni
    SHAPE=1536,8960,28,151936 ...                     # the 1.5B's shapes (H, intermediate, layers, vocab)
"""
import ctypes, sys, time, os, torch
from completiond.models.kernels import cpu_kernel
libs = {}
for p in sys.argv[1:]:
    lib = ctypes.CDLL(p)
    for name, (a, r) in cpu_kernel.SIGNATURES.items():
        f = getattr(lib, name); f.argtypes = a; f.restype = r
    libs[p] = lib
H, I, L, V = [int(x) for x in os.environ.get("SHAPE", "896,4864,24,151936").split(",")]
nq, nkv = H, 128 if H == 896 else 256  # the Qwen2.5-Coder 0.5B / 1.5B k+v widths
shapes = [(H, nq + 2 * nkv), (nq, H), (H, 2 * I), (I, H)]
g = torch.Generator().manual_seed(0)
W = [[(torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g), torch.rand(N) / 100) for K, N in shapes] for _ in range(L)]
head = (torch.randint(-127, 128, (V, H), dtype=torch.int8, generator=g), torch.rand(V) / 100)
kind = cpu_kernel.KINDS[os.environ.get("KIND", "int8+avx512-vnni")]
thr = int(os.environ.get("T", "1"))
sizes = [int(s) for s in os.environ.get("SIZES", "1,8").split(",")]
reps = int(os.environ.get("REPS", "5"))
clock = time.process_time if os.environ.get("CLOCK", "cpu") == "cpu" else time.perf_counter
res = {}
outs = {}
for rep in range(reps):
    for n in sizes:
        x = torch.randn(n, max(H, I), generator=torch.Generator().manual_seed(n))
        y = torch.empty(n, max(V, 2 * I))
        for p, lib in libs.items():
            t0 = clock()
            for l in range(L):
                for (K, N), (w, s) in zip(shapes, W[l]):
                    lib.completiond_mm(kind, x.data_ptr(), w.data_ptr(), s.data_ptr(), y.data_ptr(), n, K, N, thr)
            t1 = clock()
            lib.completiond_mm(kind, x.data_ptr(), head[0].data_ptr(), head[1].data_ptr(), y.data_ptr(), n, H, V, thr)
            t2 = clock()
            outs[(p, n)] = y[:, :V].clone()
            res.setdefault((p, n), []).append((t1 - t0, t2 - t1))
for n in sizes:
    for p in libs:
        lay = min(a for a, b in res[(p, n)]); hd = min(b for a, b in res[(p, n)])
        print(f"n={n:3d} {os.path.basename(p):12s} layers {lay*1000:7.1f} ms  head {hd*1000:6.1f} ms  total {1000*(lay+hd):7.1f}")
    ps = list(libs)
    for p in ps[1:]:
        print("   identical to first:", torch.equal(outs[(ps[0], n)], outs[(p, n)]))
print("load", os.getloadavg())
