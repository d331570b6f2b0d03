"""models.pages: a weights file mapped at a 2 MB boundary, moved into huge pages behind readers."""

import os
import re
import threading
from pathlib import Path

import pytest
import torch

from completiond.models import pages

needs_thp = pytest.mark.skipif(pages.unavailable() is not None, reason=f"no huge pages here: {pages.unavailable()}")


def random_file(path: Path, size: int) -> bytes:
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(size)).numpy().tobytes()
    path.write_bytes(data)
    return data


def huge_kb_in(addr: int, size: int) -> int:
    """AnonHugePages of this process's mappings within [addr, addr + size) (/proc/self/smaps), in kB."""
    total = 0
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        lo, hi = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
        if addr <= lo and hi <= addr + size:
            total += int(re.search(r"AnonHugePages:\s+(\d+)", block).group(1))
    return total


@needs_thp
def test_a_file_moves_into_huge_pages_at_the_same_addresses_while_read(tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "CHUNK", 2 * pages.HUGE)  # several chunks: 5 x 2 MB in 3 moves
    size = 5 * pages.HUGE + 12345  # the last part, under 2 MB, stays mapped
    data = random_file(tmp_path / "w.bin", size)
    t = pages.map_file(tmp_path / "w.bin", size)
    assert t.data_ptr() % pages.HUGE == 0 and t.numpy().tobytes() == data
    view = t[3 * pages.HUGE - 100:4 * pages.HUGE + 100].view(torch.int32)  # a tensor across a chunk's edge
    ptr, want = view.data_ptr(), int(view.double().sum())
    sums, stop = [], threading.Event()

    def read() -> None:  # a pass reading the weights while they move
        while not stop.is_set():
            sums.append(int(view.double().sum()))

    reader = threading.Thread(target=read)
    reader.start()
    meta = {}
    try:
        assert pages.move_later(tmp_path / "w.bin", meta) == "mapped (4 KB pages, moving into 2 MB pages)"
        pages.settle(60)
    finally:
        stop.set()
        reader.join()
    assert meta["weights"].startswith("2 MB pages"), meta
    assert sums and set(sums) == {want}  # every read saw the file's bytes, before, during and after
    assert view.data_ptr() == ptr and t.numpy().tobytes() == data
    assert huge_kb_in(t.data_ptr(), size) == 5 * 2048  # every whole 2 MB is one huge page
    del t, view  # the last tensor unmaps it
    assert pages.move_later(tmp_path / "w.bin", {}).startswith("mapped (4 KB pages: not mapped")


@needs_thp
def test_the_move_waits_while_passes_run(tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "CHUNK", pages.HUGE)
    data = random_file(tmp_path / "w.bin", 3 * pages.HUGE)
    t = pages.map_file(tmp_path / "w.bin", len(data))
    meta = {}
    with pages.passing():  # a pass in flight (Runner.forward)
        pages.move_later(tmp_path / "w.bin", meta)
        pages.settle(1.0)
        assert "weights" not in meta and huge_kb_in(t.data_ptr(), len(data)) == 0
    pages.settle(60)  # QUIET s after the pass, the chunks move
    assert meta["weights"] == "2 MB pages (0.01 GiB moved after the load)" and t.numpy().tobytes() == data
    assert huge_kb_in(t.data_ptr(), len(data)) == 3 * 2048


def test_huge_pages_off_keeps_the_file_mapped(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from completiond.models import runtime

    monkeypatch.setenv("COMPLETIOND_HUGE_PAGES", "0")
    w = torch.randn(3 * pages.HUGE // 4, generator=torch.Generator().manual_seed(1))
    save_file({"w": w}, str(tmp_path / "w.safetensors"))
    mapped = runtime.map_file(tmp_path / "w.safetensors", huge_pages=True)  # asked, but off: torch's mapping
    assert torch.equal(mapped["w"], w)
    assert pages.move_later(tmp_path / "w.safetensors", {}) == "mapped (4 KB pages: COMPLETIOND_HUGE_PAGES=0)"


@needs_thp
def test_a_file_under_2_mb_stays_mapped(tmp_path):
    data = random_file(tmp_path / "w.bin", 100_000)
    t = pages.map_file(tmp_path / "w.bin", len(data))
    meta = {}
    pages.move_later(tmp_path / "w.bin", meta)
    pages.settle(60)
    assert meta["weights"] == "mapped (4 KB pages: under 2 MB)" and t.numpy().tobytes() == data


def test_thp_off_is_said(monkeypatch, tmp_path):
    off = tmp_path / "enabled"
    off.write_text("always madvise [never]\n")
    monkeypatch.setattr(pages, "THP", off)
    assert pages.unavailable() == "transparent huge pages are off ([never])"


@needs_thp
def test_weights_released_while_they_wait_to_move_are_not_moved_on(tmp_path, monkeypatch):
    """A daemon that switched models releases the old one's weights: the move does not keep them
    (it holds the mapping only while a chunk moves), so they are unmapped at once."""
    monkeypatch.setattr(pages, "CHUNK", pages.HUGE)
    data = random_file(tmp_path / "w.bin", 4 * pages.HUGE)
    t = pages.map_file(tmp_path / "w.bin", len(data))
    meta = {}
    with pages.passing():  # passes run: the move waits for a pause
        pages.move_later(tmp_path / "w.bin", meta)
        pages.settle(0.2)
        assert str(tmp_path / "w.bin") in Path("/proc/self/maps").read_text()
        del t  # the model is released: no tensor over the mapping is left
        assert str(tmp_path / "w.bin") not in Path("/proc/self/maps").read_text()  # unmapped at once
    pages.settle(60)
    assert meta["weights"] == "released before its move into 2 MB pages ended"
