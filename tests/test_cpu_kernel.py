"""completiond's own int8 kernel (models/kernels/int8_mm.c): batch invariance, accuracy, build and fallback."""

import ctypes
import itertools
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

from completiond.models import device, quant
from completiond.models.kernels import cpu_kernel
from completiond.models.quant import QuantLinear
from completiond.models.device import cpu_flags

needs_kernel = pytest.mark.skipif(not cpu_kernel.wanted(), reason="no x86 CPU with AVX2 + FMA here")


def operands(m: int, k: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g), torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g),
            torch.rand(n, generator=g) / 64)


KINDS_HERE = cpu_kernel.kinds_here() if cpu_kernel.wanted() else ()
W4_HERE = tuple(k for k in KINDS_HERE if k.startswith("w4"))  # int4 weights: w4_mm, tests at the end
KINDS_HERE = tuple(k for k in KINDS_HERE if k not in W4_HERE)  # int8 weights: int8_mm


@needs_kernel
@pytest.mark.parametrize("kind", KINDS_HERE)  # every matmul kind this CPU runs
@pytest.mark.parametrize("k,n", [(896, 200), (37, 19), (64, 16), (1003, 131), (300, 40), (4864, 23)])  # K tails, N off 16
def test_rows_are_bit_identical_alone_and_in_any_batch(k, n, kind):
    """The property greedy identity rests on: a row's output does not depend on which rows share
    the call (trees of 1..70 nodes, every tile shape of the kernel), bit for bit."""
    assert cpu_kernel.library() is not None, "AVX2 + FMA and a compiler are here, but the kernel did not build"
    x, q, s = operands(70, k, n)
    whole = cpu_kernel.int8_mm(x, q, s, kind=kind)
    for a, b in [(0, 1), (5, 6), (3, 10), (0, 64), (13, 70), (7, 9), (1, 4), (2, 5), (0, 5), (4, 15), (9, 13),
                 (20, 36), (40, 48)]:
        assert torch.equal(cpu_kernel.int8_mm(x[a:b], q, s, kind=kind), whole[a:b]), (a, b)


@needs_kernel
@pytest.mark.parametrize("kind", KINDS_HERE)
def test_thread_count_does_not_change_results(kind):
    x, q, s = operands(9, 896, 300)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_kernel.int8_mm(x, q, s, kind=kind)
        torch.set_num_threads(max(2, before))
        assert torch.equal(cpu_kernel.int8_mm(x, q, s, kind=kind), one)
    finally:
        torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("acts", ["int16", "int8"])
@pytest.mark.parametrize("k,n", [(896, 200), (37, 19), (4864, 64), (1003, 131), (300, 40), (150, 33), (64, 5)])
def test_every_integer_path_gives_the_avx2_bits(acts, k, n):
    """Where the CPU has AVX512-VNNI (or AVX-VNNI), the integer sums run wider: folded to the AVX2
    loop's lanes they are the same integers, so every output is the same bits (one model on every
    CPU), for every tile shape and K's tails."""
    wider = [kd for kd in KINDS_HERE if kd.startswith(acts + "+")]
    if not wider:
        pytest.skip(f"no wider {acts} path on this CPU")
    x, q, s = operands(70, k, n)
    narrow = cpu_kernel.int8_mm(x, q, s, kind=acts)
    for kind in wider:
        for a, b in [(0, 70), (0, 1), (3, 10), (13, 17), (5, 7), (20, 23)]:
            assert torch.equal(cpu_kernel.int8_mm(x[a:b], q, s, kind=kind), narrow[a:b]), (kind, a, b)


def test_kinds_follow_the_cpu():
    """kind_of picks the widest sums this CPU has and the AVX2 loop when asked; unknown activations
    and kinds this CPU lacks are errors, not illegal instructions."""
    with pytest.raises(ValueError, match="unknown activations"):
        cpu_kernel.kind_of("int4")
    if not cpu_kernel.wanted():
        return
    assert cpu_kernel.kind_of("int8", wide=False) == "int8" and cpu_kernel.kind_of("float32") == "float32"
    if cpu_kernel.AVX512_VNNI <= cpu_flags():
        assert cpu_kernel.kind_of("int8") == "int8+avx512-vnni" and cpu_kernel.kind_of("int16") == "int16+avx512-vnni"
    lacking = [k for k in cpu_kernel.KINDS if k not in KINDS_HERE and not k.startswith("w4")]
    x, q, s = operands(2, 64, 8)
    for kind in lacking:
        with pytest.raises(ValueError, match="does not run on this CPU"):
            cpu_kernel.int8_mm(x, q, s, kind=kind)
    lib = cpu_kernel.library()
    y = torch.zeros(2, 8)
    assert lib.completiond_mm(len(cpu_kernel.KINDS), x.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(),
                              2, 64, 8, 1) == -1  # an unknown kind writes nothing
    assert not y.any()


@needs_kernel
@pytest.mark.parametrize("acts,levels", [("int16", 32767), ("int8", 127)])
def test_rounded_activations_stay_within_their_bound_and_keep_non_finite_rows_apart(acts, levels):
    """Rounding per block (of 128): each activation moves by at most half its block's step
    (block max / levels), so an output moves by at most half the steps times |w| (+ float32 sums),
    outliers included (one activation 50x the rest every 97); a row holding inf gives nan there
    and leaves the other rows as they were."""
    x, q, s = operands(6, 4864, 300)
    x[:, ::97] *= 50
    ref = (x.double() @ q.double().T) * s.double()
    got = cpu_kernel.int8_mm(x, q, s, kind=acts)
    step = x.double().abs().view(6, -1, 128).amax(-1) / levels  # [rows, blocks]
    w_abs = (q.double().abs() * s.double()[:, None]).view(300, -1, 128).sum(-1)  # [n, blocks]
    bound = 0.5 * step @ w_abs.T * (1 + 1e-6) + 1e-5 * ref.abs().max()
    assert ((got.double() - ref).abs() <= bound).all()
    assert (got.double() - ref).abs().max() > 0  # it does round: this is not the float kernel
    x[2, 10] = float("inf")
    bad = cpu_kernel.int8_mm(x, q, s, kind=acts)
    assert bad[2].isnan().all() and torch.equal(bad[[0, 1, 3, 4, 5]], got[[0, 1, 3, 4, 5]])


@needs_kernel
def test_int8_activations_error_vs_float():
    """On activations shaped like a transformer's (mostly small, a few large channels), the int8 path's
    outputs stay within 3 % of the output scale of the float product, and int16's within 0.01 %."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 896, generator=g)
    x[:, [5, 300, 700]] *= 20
    _, q, s = operands(1, 896, 512)
    ref = cpu_kernel.int8_mm(x, q, s, kind="float32")
    for acts, tol in (("int16", 1e-4), ("int8", 3e-2)):
        err = (cpu_kernel.int8_mm(x, q, s, kind=acts) - ref).abs().max() / ref.abs().max()
        assert err < tol, (acts, float(err))


def test_the_header_states_every_exported_function_and_ctypes_agrees():
    """completiond_kernels.h is the C API: every function the library exports is declared there (and
    nothing else is exported), and cpu_kernel's ctypes signatures match the declarations."""
    import re
    header = cpu_kernel.HEADERS[0].read_text()
    assert cpu_kernel.HEADERS[0].name == "completiond_kernels.h"
    public = header.split("// ---- internal")[0]
    ctype = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float, "void": None}
    declared = {}
    for ret, fname, params in re.findall(r"^(\w+)\s+(completiond_\w+)\(([^)]*)\);", public, re.M | re.S):
        types = []
        for p in (p.strip() for p in params.split(",") if p.strip() not in ("", "void")):
            t = ctypes.c_void_p if "*" in p else ctype[p.replace("const ", "").split()[0]]
            types.append(t)
        declared[fname] = (types, ctype[ret])
    assert declared.keys() == cpu_kernel.SIGNATURES.keys()
    for fname, (args, res) in cpu_kernel.SIGNATURES.items():
        assert declared[fname] == (args, res), fname
    kinds = dict(re.findall(r"COMPLETIOND_MM_(\w+) = (\d+),", header))
    assert [int(v) for k, v in kinds.items() if k != "KINDS"] == list(cpu_kernel.KINDS.values())
    assert int(kinds["KINDS"]) == len(cpu_kernel.KINDS)
    if cpu_kernel.wanted() and shutil.which("nm"):
        lib = cpu_kernel.build()
        syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
        exported = {line.split()[-1] for line in syms.splitlines() if " T " in line}
        assert exported == set(declared), exported ^ set(declared)
    for src in cpu_kernel.SOURCES:  # no second copy of a shared helper, no global set through in_dll
        text = src.read_text()
        assert "static inline float hsum" not in text, src.name
        assert not re.search(r"^int \w+ = ", text, re.M), src.name


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_dequantized_matmul(dtype):
    """float32 products: within 1e-5 relative of a float64 reference (then the activations' rounding)."""
    x, q, s = operands(11, 896, 520)
    ref = (x.to(dtype).double() @ q.double().T) * s.double()
    got = cpu_kernel.int8_mm(x.to(dtype), q, s)
    assert got.dtype == dtype and got.shape == (11, 520)
    tol = 1e-5 if dtype == torch.float32 else 2 ** -8
    assert ((got.double() - ref).abs() <= tol * ref.abs().max()).all()


@needs_kernel
def test_quant_linear_runs_it_and_strided_views_are_handled(monkeypatch):
    """QuantLinear's int8 decode path is this kernel where enabled (bias added), with the
    activations this process chose (cpu_kernel.activations) or the ones asked for; a fused layer's
    parts are views."""
    monkeypatch.setattr(cpu_kernel, "enabled", lambda: True)  # whatever this CPU's calibration chose
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 48, bias=True)
    layer = QuantLinear.from_linear(lin, "int8")
    x = torch.randn(3, 96)
    for acts in cpu_kernel.ACTIVATIONS:
        monkeypatch.setattr(cpu_kernel, "activations", lambda: acts)
        want = cpu_kernel.int8_mm(x, layer.packed, layer.scales.float(), kind=cpu_kernel.kind_of(acts)) + layer.bias
        assert torch.equal(layer(x), want)
        other = next(a for a in cpu_kernel.ACTIVATIONS if a != acts)
        assert not torch.equal(layer(x, activations=other), want)
    parts = [QuantLinear.from_linear(torch.nn.Linear(96, n), "int8") for n in (32, 16)]
    fused = QuantLinear.cat(parts)
    assert torch.equal(fused(x)[:, 32:], parts[1](x))
    xt = torch.randn(96, 3).T  # non-contiguous input
    assert torch.equal(layer(xt), layer(xt.contiguous()))
    with pytest.raises(ValueError, match=r"\[-127, 127\]"):  # the sign trick needs it
        QuantLinear("int8", torch.full((4, 96), -128, dtype=torch.int8), torch.ones(4), 4, 96)


def test_build_is_cached_and_safe_from_two_processes(tmp_path):
    """Two processes building into an empty folder at once both get the same library; a third reuses it."""
    if not cpu_kernel.wanted():
        pytest.skip("no x86 CPU with AVX2 + FMA here")
    code = ("import sys; from pathlib import Path; from completiond.models.kernels import cpu_kernel; "
            "print(cpu_kernel.build(Path(sys.argv[1])))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and outs[0] == outs[1]
    built = [f for f in os.listdir(tmp_path)]
    name = os.path.basename(outs[0])
    assert sorted(built) == [name, name + ".sha256"]  # the library and its digest; no temporary left behind
    mtime = os.stat(outs[0]).st_mtime_ns
    assert str(cpu_kernel.build(tmp_path)) == outs[0] and os.stat(outs[0]).st_mtime_ns == mtime


def test_torch_kernel_when_asked(monkeypatch):
    """COMPLETIOND_INT8_KERNEL=torch (or no AVX2/FMA, or no compiler) falls back to torch's kernel,
    and a load reports which kernel runs."""
    monkeypatch.setenv("COMPLETIOND_INT8_KERNEL", "torch")
    assert not cpu_kernel.wanted()
    code = ("import torch; from completiond.models import quant; from completiond.models.kernels import cpu_kernel; "
            "l = quant.QuantLinear.from_linear(torch.nn.Linear(64, 32), 'int8'); x = torch.randn(2, 64); "
            "ref = torch.ops.aten._weight_int8pack_mm(x, l.packed, l.scales.float()) + l.bias; "
            "assert torch.equal(l(x), ref); print(cpu_kernel.name())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COMPLETIOND_INT8_KERNEL": "torch"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch"


def test_no_compiler_falls_back(tmp_path):
    """A machine without a C compiler: the build says so, and the model runs torch's kernel."""
    code = ("import sys; from pathlib import Path; from completiond.models.kernels import cpu_kernel\n"
            "try:\n    cpu_kernel.build(Path(sys.argv[1]))\nexcept RuntimeError as e:\n    print(e)\n"
            "print(cpu_kernel.name())")
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env={**env, "PATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["no C compiler (gcc or cc) on PATH", "torch"]


def test_a_compiler_that_fails_hands_over_to_gcc(tmp_path, monkeypatch, caplog):
    """CC naming a compiler that cannot build the sources (clang 14 rejects the `#pragma GCC target`
    regions) costs one warning, not the kernel: gcc builds it."""
    if shutil.which("gcc") is None or not cpu_kernel.wanted():
        pytest.skip("needs gcc on an x86 CPU with AVX2 + FMA")
    fake = tmp_path / "failing-cc"
    fake.write_text("#!/bin/sh\necho 'fake-cc 1.0'\n[ \"$1\" = --version ] && exit 0\necho 'error: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with caplog.at_level(logging.WARNING, logger=cpu_kernel.log.name):
        so = cpu_kernel.build(tmp_path / "kernels")
    assert so.exists() and ctypes.CDLL(str(so)).completiond_w4_group() == cpu_kernel.W4_GROUP
    assert any("failing-cc failed" in r.getMessage() and "trying" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=cpu_kernel.log.name):
        assert cpu_kernel.build(tmp_path / "kernels") == so  # the next start: gcc's library, no compile tried
    assert not caplog.records
    monkeypatch.setenv("PATH", str(tmp_path))  # the failing one alone: its error, no library
    with pytest.raises(RuntimeError, match="failing-cc failed"):
        cpu_kernel.build(tmp_path / "kernels2")


@needs_kernel
def test_choice_between_kernels_is_measured_once_per_cpu(tmp_path, monkeypatch):
    """enabled() rests on one timing per CPU (both kernels, a decode pass's shape), cached: a
    second call reads the file instead of timing again."""
    import json
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    monkeypatch.setattr(device.OthersBusy, "share", lambda self: 0.0)  # as if measured quiet (else not cached)
    first = cpu_kernel.calibrate()
    [path] = (tmp_path / "calibration").glob("int8-kernel-v2-*.json")
    saved = json.loads(path.read_text())
    assert saved["ours_faster"] == first["ours_faster"] and set(saved["ms"]) == {"completiond", "completiond-int16", "torch"}
    path.write_text(json.dumps({**saved, "ours_faster": not first["ours_faster"]}))
    assert cpu_kernel.calibrate() == {"ours_faster": not first["ours_faster"]}


def test_override_forces_completiond_kernel(tmp_path):
    """COMPLETIOND_INT8_KERNEL=completiond skips the measurement (where the kernel builds)."""
    if not cpu_kernel.wanted():
        pytest.skip("no x86 CPU with AVX2 + FMA here")
    code = "from completiond.models.kernels import cpu_kernel; print(cpu_kernel.name())"
    vnni = "+avx512-vnni" if cpu_kernel.AVX512_VNNI <= cpu_flags() else ""  # where integer sums run on it
    bf16 = "+bf16-attention+value-pairs" if cpu_kernel.AVX512_BF16 <= cpu_flags() else ""  # attention()
    zmm = "+zmm" if cpu_kernel.AVX512_VNNI <= cpu_flags() else ""  # zmm(), forced on below
    for acts, attention, wide, name in (
            ("float32", "auto", "1", "completiond-avx2" + zmm + bf16),
            ("int16", "auto", "1", "completiond-avx2+int16-activations" + vnni + zmm + bf16),
            ("int8", "auto", "1", "completiond-avx2+int8-activations" + vnni + zmm + bf16),
            ("int8", "float32", "0", "completiond-avx2+int8-activations" + vnni)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "COMPLETIOND_INT8_KERNEL": "completiond", "COMPLETIOND_CACHE": str(tmp_path),
                                  "COMPLETIOND_INT8_ACTIVATIONS": acts, "COMPLETIOND_ATTENTION": attention,
                                  "COMPLETIOND_ZMM": wide})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == name and not (tmp_path / "calibration").exists()


@needs_kernel
def test_a_library_of_another_int4_group_is_not_used(monkeypatch, caplog):
    """pack_w4 groups weights by cpu_kernel.W4_GROUP and w4_mm.c reads them by its W4_G: where the
    two differ (a build of other sources) the kernel would read the scales at the wrong places, so
    the loader refuses the library (torch's kernels run) and says why."""
    lib = cpu_kernel.library()
    assert lib.completiond_w4_group() == cpu_kernel.W4_GROUP == quant.W4_GROUP
    monkeypatch.setattr(cpu_kernel, "W4_GROUP", cpu_kernel.W4_GROUP // 2)
    with caplog.at_level("WARNING"):
        assert cpu_kernel._library() is None
    assert f"groups int4 weights by {lib.completiond_w4_group()}" in caplog.text


@needs_kernel
def test_zmm_is_measured_once_per_cpu(tmp_path, monkeypatch):
    """The 512-bit code runs where a timing of both widths on int4 matmuls of 2 to 8 rows (taken
    once per CPU and kernel build, cached) finds it clearly faster at 8 rows, from the fewest rows
    where it stays so; COMPLETIOND_ZMM=0 / 1 skips the timing."""
    import json
    if not cpu_kernel.AVX512_VNNI <= cpu_flags():
        assert not cpu_kernel.zmm() and cpu_kernel.zmm_rows() == 0  # no 512-bit VNNI: never on, nothing timed
        return
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    monkeypatch.delenv("COMPLETIOND_ZMM", raising=False)
    monkeypatch.setattr(device.OthersBusy, "share", lambda self: 0.0)  # as if measured quiet (else not cached)
    lib = cpu_kernel.library()
    before = lib.completiond_w4_zmm_rows(0)
    try:
        rows = cpu_kernel._zmm_choice(lib)  # 0: off
        [path] = (tmp_path / "calibration").glob("zmm-*.json")
        assert cpu_kernel.build_id() in path.name  # a kernel change is timed afresh
        saved = json.loads(path.read_text())
        gains = {int(r): ms["zmm"] <= cpu_kernel.ZMM_GAIN * ms["ymm"] for r, ms in saved["ms"].items()}
        assert sorted(gains) == list(cpu_kernel.ZMM_ROWS)
        assert (rows > 0) <= gains[8]
        if rows:  # every timed row count from `rows` up gains, the one below does not
            assert all(g for r, g in gains.items() if r >= rows)
            assert rows == min(gains) or not gains[max(r for r in gains if r < rows)]
        path.write_text(json.dumps({**saved, "zmm_rows": 6}))
        assert cpu_kernel._zmm_choice(lib) == 6  # read back, not timed again
        assert lib.completiond_w4_zmm_rows(0) == before  # the timing left the library's row count as it found it
        for forced, want in (("0", 0), ("1", 3)):
            monkeypatch.setenv("COMPLETIOND_ZMM", forced)
            assert cpu_kernel._zmm_choice(lib) == want
    finally:
        lib.completiond_zmm(int(cpu_kernel.zmm()))  # the timing leaves the switch off: this process's choice again
        lib.completiond_w4_zmm_rows(cpu_kernel.zmm_rows())


@needs_kernel
def test_activations_are_measured_once_per_cpu(tmp_path, monkeypatch):
    """activations() rests on one timing per CPU (the three kinds, a pass's shapes), cached: a
    second process reads the file instead of timing again."""
    import json
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    monkeypatch.setenv("COMPLETIOND_INT8_KERNEL", "completiond")
    monkeypatch.delenv("COMPLETIOND_INT8_ACTIVATIONS", raising=False)
    monkeypatch.setattr(device.OthersBusy, "share", lambda self: 0.0)  # as if measured quiet (else not cached)
    for fn in (cpu_kernel.enabled, cpu_kernel.activations):
        fn.cache_clear()
    try:
        first = cpu_kernel.activations()
        [path] = (tmp_path / "calibration").glob("int8-activations-v2-*.json")
        saved = json.loads(path.read_text())
        assert set(saved["ms"]) == set(cpu_kernel.ACTIVATIONS)
        assert first == min(saved["ms"], key=saved["ms"].get)
        other = "int16" if first != "int16" else "int8"
        path.write_text(json.dumps({**saved, "int16_fastest": other == "int16", "int8_fastest": other == "int8"}))
        cpu_kernel.activations.cache_clear()
        assert cpu_kernel.activations() == other
    finally:
        for fn in (cpu_kernel.enabled, cpu_kernel.activations):
            fn.cache_clear()


# ---- int4 weights (w4_mm.c, quant.pack_w4) ----

def w4_operands(m: int, k: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / 32 + 0.01
    packed, scales = quant.pack_w4(w)
    return x, w, packed, scales


def test_pack_w4_rounds_each_weight_to_its_group_grid():
    """Each weight lands on its group's grid q * scale + zero (q in [0, 15], min / max per group of
    W4_GROUP, bf16 scale and zero) within about half a step; values already on a grid come back exactly;
    K off the blocks is padded and cut, N padded to whole vectors of 8 channels with zero weights."""
    G = quant.W4_GROUP
    g = torch.Generator().manual_seed(1)
    w = torch.randn(37, 300, generator=g)
    packed, scales = quant.pack_w4(w, rows=16)  # chunks of rows, the last one padded
    assert packed.shape == (40, 3 * 64) and packed.dtype == torch.uint8
    assert scales.shape == (40, 2, 384 // G) and scales.dtype == torch.bfloat16
    assert torch.equal(quant.pack_w4(w)[0], packed) and torch.equal(quant.pack_w4(w)[1], scales)
    back = quant.unpack_w4(packed, scales, 300, 37)
    assert back.shape == (37, 300) and not quant.unpack_w4(packed, scales, 300)[37:].any()
    step = quant.w4_scale_zero(scales)[:37, 0].repeat_interleave(G, 1)[:, :300]
    assert ((back - w).abs() <= 0.6 * step).all()  # half a step, and bf16's rounding of the zero
    assert float(((back - w).norm() / w.norm())) < 0.1  # 4 bits, groups of G, on Gaussian weights
    grid = torch.randint(0, 16, (8, 256), generator=g).float() * 0.25 - 2
    grid[:, ::G] = -2.0  # every group spans [-2, 1.75]: scale 0.25, zero -2, exact in bf16
    grid[:, 1::G] = 1.75
    p2, s2 = quant.pack_w4(grid)
    assert torch.equal(quant.unpack_w4(p2, s2, 256), grid)
    # the layout w4_mm.c reads: channel 8 v + l's weights 8 p .. 8 p + 3 in the low nibbles of bytes
    # 4 l .. 4 l + 3 of vector v's piece p, 8 p + 4 .. 8 p + 7 in the high ones; vectors 0 and 1 a
    # pair, their 32-byte pieces alternating, and so their 8 scales of a group; vector 2 alone
    step = 2.0 ** -(torch.arange(24) % 5)  # a scale per channel (exact in bf16), zero 0
    ref = torch.randint(0, 16, (24, 128), generator=g).float()
    ref[:, ::G], ref[:, 1::G] = 0.0, 15.0  # every group spans [0, 15] steps
    pq, sq = quant.pack_w4(ref * step[:, None])
    assert torch.equal(quant.unpack_w4(pq, sq, 128), ref * step[:, None])
    for v, p, lane in ((0, 3, 5), (1, 3, 5), (1, 0, 7), (2, 3, 5)):
        ch = 8 * v + lane
        at = 64 * p + 32 * (v % 2) if v < 2 else 32 * p
        piece = pq[:16].reshape(-1)[at:at + 32] if v < 2 else pq[16:24].reshape(-1)[at:at + 32]
        assert torch.equal((piece[4 * lane:4 * lane + 4] & 15).float(), ref[ch, 8 * p:8 * p + 4]), (v, p, lane)
        assert torch.equal((piece[4 * lane:4 * lane + 4] >> 4).float(), ref[ch, 8 * p + 4:8 * p + 8]), (v, p, lane)
        group = p // (G // 8)  # a piece holds 8 weights of a channel
        scale = (sq[:16].reshape(2, 128 // G, 2, 8)[0, group, v, lane] if v < 2
                 else sq[16:].reshape(2, 128 // G, 8)[0, group, lane])
        assert float(scale) == step[ch], (v, lane)


@needs_kernel
@pytest.mark.parametrize("kind", W4_HERE)
@pytest.mark.parametrize("k,n", [(896, 200), (37, 19), (128, 16), (1003, 131), (1536, 53), (4864, 23)])
def test_w4_rows_are_bit_identical_alone_and_in_any_batch(k, n, kind):
    """As for int8 weights: a row's outputs do not depend on the rows beside it (every tile shape:
    runs of 4 / 2 rows and the 3, 2, 1 left over), nor on the thread count."""
    x, _, packed, scales = w4_operands(70, k, n)
    whole = cpu_kernel.w4_mm(x, packed, scales, kind)
    for a, b in [(0, 1), (5, 6), (3, 10), (0, 64), (13, 70), (7, 9), (1, 4), (2, 5), (0, 5), (4, 15), (9, 13)]:
        assert torch.equal(cpu_kernel.w4_mm(x[a:b], packed, scales, kind), whole[a:b]), (a, b)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(cpu_kernel.w4_mm(x[:9], packed, scales, kind), whole[:9])
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_w4_512_bit_tiles_give_the_256_bit_bits():
    """Where AVX512-VNNI runs matmuls of enough rows (completiond_w4_zmm_rows) in 512-bit tiles (two
    vectors of 8 channels, a lone last vector in 256-bit tiles), every (row, channel) gets the bits of
    the 256-bit tiles a row alone runs."""
    if "w4+avx512-vnni" not in W4_HERE:
        pytest.skip("no AVX512-VNNI here")
    lib = cpu_kernel.library()
    try:
        cases = [(4, 896, 200), (5, 896, 200), (8, 1536, 64), (12, 896, 200), (13, 1003, 131), (70, 37, 19),
                 (16, 4864, 23), (7, 128, 8)]
        for (m, k, n), rows in itertools.product(cases, (1, 5)):  # 512-bit tiles from 1 row, or from 5
            x, _, packed, scales = w4_operands(m, k, n, seed=m)
            assert lib.completiond_zmm(1) == 1  # the 512-bit tiles run: the comparison is not with themselves
            assert lib.completiond_w4_zmm_rows(rows) == rows
            wide = cpu_kernel.w4_mm(x, packed, scales, "w4+avx512-vnni")
            assert lib.completiond_zmm(0) == 0
            narrow = cpu_kernel.w4_mm(x, packed, scales, "w4+avx512-vnni")
            assert torch.equal(wide, narrow), (m, k, n)
            assert torch.equal(wide[:1], cpu_kernel.w4_mm(x[:1], packed, scales, "w4+avx512-vnni")), (m, k, n)
    finally:
        lib.completiond_zmm(int(cpu_kernel.zmm()))
        lib.completiond_w4_zmm_rows(cpu_kernel.zmm_rows())


@needs_kernel
def test_w4_every_integer_path_gives_the_avx2_bits():
    """vpdpbusd (AVX512-VNNI, AVX-VNNI) and vpmaddubsw + vpmaddwd (AVX2) sum the same bytes per lane:
    the same outputs, so an int4 model computes the same on every CPU."""
    if len(W4_HERE) < 2:
        pytest.skip("only the AVX2 int4 path on this CPU")
    for k, n in [(896, 200), (37, 19), (1003, 131)]:
        x, _, packed, scales = w4_operands(23, k, n)
        narrow = cpu_kernel.w4_mm(x, packed, scales, "w4")
        for kind in W4_HERE[1:]:
            assert torch.equal(cpu_kernel.w4_mm(x, packed, scales, kind), narrow), (kind, k, n)


@needs_kernel
def test_w4_is_the_unpacked_matmul_within_the_activations_rounding():
    """Against x @ unpack_w4(...)^T in float64: the int8 activations' rounding bound (half a step
    of each block times |w|), outliers included; a row holding inf is nan and leaves the others."""
    if not W4_HERE:
        pytest.skip("no int4 kernel on this CPU")
    x, _, packed, scales = w4_operands(6, 1003, 300)
    x[:, ::97] *= 50
    wd = quant.unpack_w4(packed, scales, 1003, 300).double()
    ref = x.double() @ wd.T
    got = cpu_kernel.w4_mm(x, packed, scales, n=300).double()
    assert torch.equal(got, cpu_kernel.w4_mm(x, packed, scales).double()[:, :300])
    xp = torch.nn.functional.pad(x.double().abs(), (0, 1024 - 1003))
    step = xp.view(6, -1, 128).amax(-1) / 127
    w_abs = torch.nn.functional.pad(wd.abs(), (0, 1024 - 1003)).view(300, -1, 128).sum(-1)
    bound = 0.5 * step @ w_abs.T * (1 + 1e-6) + 1e-5 * ref.abs().max()
    assert ((got - ref).abs() <= bound).all()
    x[2, 10] = float("inf")
    bad = cpu_kernel.w4_mm(x, packed, scales, n=300)
    assert bad[2].isnan().all() and torch.equal(bad[[0, 1, 3, 4, 5]].double(), got[[0, 1, 3, 4, 5]])
    with pytest.raises(ValueError, match="do not fit"):
        cpu_kernel.w4_mm(x[:, :800], packed, scales)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_kernel.w4_mm(x, packed, scales.float())
    with pytest.raises(ValueError, match="do not fit"):
        cpu_kernel.w4_mm(x, packed, scales, n=296)
    with pytest.raises(ValueError, match="not an int4 kind"):
        cpu_kernel.w4_mm(x, packed, scales, "int8")


@needs_kernel
def test_w4_quant_linear_runs_the_kernel_fused_and_in_bulk():
    """QuantLinear "w4": the kernel for decode rows and prefill chunks, fused parts (gate + up) give
    each part's outputs; without the kernel it runs the unpacked weights densely."""
    if not W4_HERE:
        pytest.skip("no int4 kernel on this CPU")
    g = torch.Generator().manual_seed(4)
    gate, up = (torch.nn.Linear(256, n, bias=False) for n in (96, 36))
    for lin in (gate, up):
        lin.weight.data = torch.randn(lin.weight.shape, generator=g) / 16
    parts = [quant.QuantLinear.from_linear(lin, "w4") for lin in (gate, up)]
    x = torch.randn(5, 256, generator=g)
    alone = [p(x) for p in parts]
    fused = quant.QuantLinear.cat(parts)
    assert fused.scheme == "w4" and torch.equal(fused(x), torch.cat(alone, 1))
    assert torch.equal(alone[0], cpu_kernel.w4_mm(x, parts[0].packed, parts[0].scales))
    xb = torch.randn(40, 256, generator=g)
    with quant.bulk(torch.float32):
        assert torch.equal(fused(xb), cpu_kernel.w4_mm(xb, fused.packed, fused.scales, n=132))
    # a part off the vectors of 8 cannot come first: its padding would land between the parts
    assert not isinstance(quant.QuantLinear.cat(parts[::-1]), quant.QuantLinear)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_kernel, "w4_kind", lambda: None)
        torch.testing.assert_close(fused(xb), xb @ fused.dequantize().T, rtol=1e-5, atol=1e-5)
    # a file of another layout (an older w4 form: float32 scales per 128) never reaches the kernel
    with pytest.raises(ValueError, match="not pack_w4's"):
        quant.QuantLinear("w4", fused.packed, torch.ones(136, 2), 136, 256, checked=True)
