"""completiond's own int8 kernel (core/int8_mm.c): batch invariance, accuracy, build and fallback."""

import os
import subprocess
import sys

import pytest
import torch

from completiond.core import cpu_kernel, quant
from completiond.core.quant import QuantLinear
from completiond.models.device import cpu_flags

needs_kernel = pytest.mark.skipif(not cpu_kernel.wanted(), reason="no x86 CPU with AVX2 + FMA here")


def operands(m: int, k: int, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g), torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g),
            torch.rand(n, generator=g) / 64)


@needs_kernel
@pytest.mark.parametrize("int16", [False, True])  # float32 activations (int8_mm.c) or int16 (a16_mm.c)
@pytest.mark.parametrize("k,n", [(896, 200), (37, 19), (64, 16), (1003, 131), (300, 40)])  # K tails, N off 16
def test_rows_are_bit_identical_alone_and_in_any_batch(k, n, int16):
    """The property greedy identity rests on: a row's output does not depend on which rows share
    the call (trees of 1..70 nodes, every tile shape of the kernel), bit for bit."""
    assert cpu_kernel.library() is not None, "AVX2 + FMA and a compiler are here, but the kernel did not build"
    x, q, s = operands(70, k, n)
    whole = cpu_kernel.int8_mm(x, q, s, int16=int16)
    for a, b in [(0, 1), (5, 6), (3, 10), (0, 64), (13, 70), (7, 9), (1, 4), (2, 5), (0, 5), (4, 15), (9, 13)]:
        assert torch.equal(cpu_kernel.int8_mm(x[a:b], q, s, int16=int16), whole[a:b]), (a, b)


@needs_kernel
@pytest.mark.parametrize("int16", [False, True])
def test_thread_count_does_not_change_results(int16):
    x, q, s = operands(9, 896, 300)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_kernel.int8_mm(x, q, s, int16=int16)
        torch.set_num_threads(max(2, before))
        assert torch.equal(cpu_kernel.int8_mm(x, q, s, int16=int16), one)
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not (cpu_kernel.wanted() and cpu_kernel.AVX512_VNNI <= cpu_flags()), reason="no AVX512-VNNI here")
@pytest.mark.parametrize("k,n", [(896, 200), (37, 19), (4864, 64), (1003, 131), (300, 40), (150, 33)])
def test_avx512_vnni_sums_give_the_avx2_bits(k, n):
    """Where the CPU has AVX512-VNNI, int16 matmuls sum 32 activations per instruction; folded to
    the AVX2 loop's lanes the integer sums are the same, so every output is the same bits (one
    model on either CPU), for every tile shape and K's tails (32-, 16- and scalar steps)."""
    x, q, s = operands(70, k, n)
    try:
        cpu_kernel.use_avx512_vnni(False)
        narrow = cpu_kernel.int8_mm(x, q, s, int16=True)
        cpu_kernel.use_avx512_vnni(True)
        for a, b in [(0, 70), (0, 1), (3, 10), (13, 17), (5, 7)]:
            assert torch.equal(cpu_kernel.int8_mm(x[a:b], q, s, int16=True), narrow[a:b]), (a, b)
    finally:
        cpu_kernel.use_avx512_vnni(True)
    assert cpu_kernel.avx512_vnni()


@needs_kernel
def test_int16_activations_stay_close_and_keep_non_finite_rows_apart():
    """Rounding to int16 per block of 128: each activation moves by at most half its block's step
    (block max / 32767), so an output moves by at most half the steps times |w| (+ float32 sums),
    outliers included (one activation 50x the rest every 97); a row holding inf gives nan there
    and leaves the other rows as they were."""
    x, q, s = operands(6, 4864, 300)
    x[:, ::97] *= 50
    ref = (x.double() @ q.double().T) * s.double()
    got = cpu_kernel.int8_mm(x, q, s, int16=True)
    step = x.double().abs().view(6, -1, 128).amax(-1) / 32767  # [rows, blocks]
    w_abs = (q.double().abs() * s.double()[:, None]).view(300, -1, 128).sum(-1)  # [n, blocks]
    bound = 0.5 * step @ w_abs.T + 1e-5 * ref.abs().max()
    assert ((got.double() - ref).abs() <= bound).all()
    assert (got.double() - ref).abs().max() > 0  # it does round: this is not the float kernel
    x[2, 10] = float("inf")
    bad = cpu_kernel.int8_mm(x, q, s, int16=True)
    assert bad[2].isnan().all() and torch.equal(bad[[0, 1, 3, 4, 5]], got[[0, 1, 3, 4, 5]])


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
    activations this CPU's measurement chose; a fused layer's parts are views."""
    monkeypatch.setattr(cpu_kernel, "enabled", lambda: True)  # whatever this CPU's calibration chose
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 48, bias=True)
    layer = QuantLinear.from_linear(lin, "int8")
    x = torch.randn(3, 96)
    for int16 in (False, True):
        monkeypatch.setattr(cpu_kernel, "int16_activations", lambda: int16)
        want = cpu_kernel.int8_mm(x, layer.packed, layer.scales.float(), int16=int16) + layer.bias
        assert torch.equal(layer(x), want)
        assert not torch.equal(layer(x, int16=not int16), want)
    parts = [QuantLinear.from_linear(torch.nn.Linear(96, n), "int8") for n in (32, 16)]
    fused = QuantLinear.cat(parts)
    assert torch.equal(fused(x)[:, 32:], parts[1](x))
    xt = torch.randn(96, 3).T  # non-contiguous input
    assert torch.equal(layer(xt), layer(xt.contiguous()))


def test_build_is_cached_and_safe_from_two_processes(tmp_path):
    """Two processes building into an empty folder at once both get the same library; a third reuses it."""
    if not cpu_kernel.wanted():
        pytest.skip("no x86 CPU with AVX2 + FMA here")
    code = ("import sys; from pathlib import Path; from completiond.core import cpu_kernel; "
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
    code = ("import torch; from completiond.core import cpu_kernel, quant; "
            "l = quant.QuantLinear.from_linear(torch.nn.Linear(64, 32), 'int8'); x = torch.randn(2, 64); "
            "ref = torch.ops.aten._weight_int8pack_mm(x, l.packed, l.scales.float()) + l.bias; "
            "assert torch.equal(l(x), ref); print(cpu_kernel.name())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COMPLETIOND_INT8_KERNEL": "torch"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch"


def test_no_compiler_falls_back(tmp_path):
    """A machine without a C compiler: the build says so, and the model runs torch's kernel."""
    code = ("import sys; from pathlib import Path; from completiond.core import cpu_kernel\n"
            "try:\n    cpu_kernel.build(Path(sys.argv[1]))\nexcept RuntimeError as e:\n    print(e)\n"
            "print(cpu_kernel.name())")
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env={**env, "PATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["no C compiler (gcc or cc) on PATH", "torch"]


@needs_kernel
def test_choice_between_kernels_is_measured_once_per_cpu(tmp_path, monkeypatch):
    """enabled() rests on one timing per CPU (both kernels, a decode pass's shape), cached: a
    second call reads the file instead of timing again."""
    import json
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
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
    code = "from completiond.core import cpu_kernel; print(cpu_kernel.name())"
    vnni = "+avx512-vnni" if cpu_kernel.AVX512_VNNI <= cpu_flags() else ""  # where int16 sums run on it
    for acts, name in (("float32", "completiond-avx2"), ("int16", "completiond-avx2+int16-activations" + vnni)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "COMPLETIOND_INT8_KERNEL": "completiond", "COMPLETIOND_CACHE": str(tmp_path),
                                  "COMPLETIOND_INT8_ACTIVATIONS": acts})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == name and not (tmp_path / "calibration").exists()


@needs_kernel
def test_activations_are_measured_once_per_cpu(tmp_path, monkeypatch):
    """int16_activations() rests on one timing per CPU (both kernels, a pass's shapes), cached."""
    import json
    monkeypatch.setenv("COMPLETIOND_CACHE", str(tmp_path))
    monkeypatch.setenv("COMPLETIOND_INT8_KERNEL", "completiond")
    monkeypatch.delenv("COMPLETIOND_INT8_ACTIVATIONS", raising=False)
    for fn in (cpu_kernel.enabled, cpu_kernel.int16_activations):
        fn.cache_clear()
    try:
        first = cpu_kernel.int16_activations()
        [path] = (tmp_path / "calibration").glob("int8-activations-*.json")
        saved = json.loads(path.read_text())
        assert saved["int16_faster"] == first and set(saved["ms"]) == {"float32", "int16"}
        path.write_text(json.dumps({**saved, "int16_faster": not first}))
        cpu_kernel.int16_activations.cache_clear()
        assert cpu_kernel.int16_activations() == (not first)
    finally:
        for fn in (cpu_kernel.enabled, cpu_kernel.int16_activations):
            fn.cache_clear()
