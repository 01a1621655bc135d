"""B6 — checkpoint: how long the training loop stalls, against a synchronous save and the memcpy bound.

    python -m bench.checkpoint --sizes 64MiB,1GiB,4GiB --json bench/results/checkpoint.json

For each state size, in one run and on the same disk:
  stall_s          how long `Checkpointer.step` blocks when a checkpoint is due (warm: after a first
                   checkpoint, so the staging exists), median of --repeats;
  copy_bound_s     a plain copy of the same tensors into a warm buffer: what no snapshot can beat;
  sync_save_s      the torch.save way: the whole state written to one file and fsynced, training waiting;
  flush_gbps       the background flush (chunks, CRC-32C, fsync, renames, manifest), bytes / its time;
  disk_fsync_gbps  the disk itself: the same bytes written to one file in the same directory and fsynced,
                   measured right before each flush so both see the same disk;
  restore_s        `Checkpointer.restore` into the live state: read (cold: the flush drops what it wrote
                   from the page cache), verify every chunk, copy in.
With --device cuda and torch with a GPU, the same for CUDA tensors through pinned staging (stall_s then
runs until the copy stream is done, since the compute stream waits for it), plus the blocking part of
`torch.distributed.checkpoint.async_save` on the same state.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tessera.checkpoint_client import Checkpointer

RESULTS = Path(__file__).parent / "results"
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9, "B": 1}
TENSOR_BYTES = 128 << 20  # a state is tensors of at most 128 MiB, at least 8 of them
WRITE_SLICE = 64 << 20


def parse_size(text: str) -> int:
    text = text.strip()
    for unit in sorted(UNITS, key=len, reverse=True):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * UNITS[unit])
    return int(text)


def size_label(n: int) -> str:
    for unit in ("GiB", "MiB", "KiB"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]}{unit}"
    return f"{n}B"


def tensor_sizes(total: int) -> list[int]:
    count = max(8, -(-total // TENSOR_BYTES))
    each = total // count // 4 * 4
    sizes = [each] * count
    sizes[-1] += total - each * count
    return sizes


def make_state(total: int) -> dict[str, Any]:
    state: dict[str, Any] = {"model": {}}
    for i, nbytes in enumerate(tensor_sizes(total)):
        t = np.empty(nbytes // 4, dtype=np.float32)
        t.fill(i + 0.5)
        state["model"][f"layer{i}.weight"] = t
    state["step"] = 0
    return state


def leaves(state: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
    return list(state["model"].values())


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def copy_into(dst: np.ndarray[Any, Any], state: dict[str, Any]) -> float:
    """Seconds for a plain NumPy copy of every tensor into `dst`, back to back."""
    started = time.perf_counter()
    offset = 0
    for t in leaves(state):
        np.copyto(dst[offset : offset + t.nbytes].view(t.dtype), t)
        offset += t.nbytes
    return time.perf_counter() - started


def write_fsync(path: Path, buffers: list[memoryview]) -> float:
    """Seconds to write `buffers` to a new file and fsync it; the file's pages are then dropped."""
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for buf in buffers:
            for start in range(0, len(buf), WRITE_SLICE):
                piece = buf[start : start + WRITE_SLICE]
                done = 0
                while done < len(piece):
                    done += os.write(fd, piece[done:])
        os.fsync(fd)
        elapsed = time.perf_counter() - started
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    path.unlink()
    return elapsed


def sync_save_numpy(path: Path, state: dict[str, Any]) -> float:
    """The torch.save equivalent without torch: every tensor with its header into one file, fsynced."""
    started = time.perf_counter()
    with open(path, "wb") as f:
        for t in leaves(state):
            np.save(f, t, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


@contextlib.contextmanager
def workdir(base: Path | None) -> Iterator[Path]:
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def measure(
    total: int,
    directory: Path,
    repeats: int,
    state: Any,
    ckpt: Checkpointer,
    *,
    raw: Callable[[], list[memoryview]],
    copy: Callable[[], float],
    sync_save: Callable[[Path], float],
    stall_until: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Each repetition measures every figure once, one after the other, so that all of them see the same
    machine (others may share its cores and disk); the figures are the medians."""
    first = ckpt.save(0, state, wait=True)  # the first checkpoint allocates and touches the staging
    if first is None or not first.ok:
        raise RuntimeError(f"first checkpoint failed: {first}")
    stalls, copies, syncs, flushes, disks = [], [], [], [], []
    for r in range(1, repeats + 1):
        copies.append(copy())
        ckpt.request("bench")
        started = time.perf_counter()
        taken = ckpt.step(r, state)
        stall_until()
        stalls.append(time.perf_counter() - started)
        assert taken, "a requested checkpoint was not taken"
        result = ckpt.wait()
        if result is None or not result.ok:
            raise RuntimeError(f"checkpoint failed: {result}")
        flushes.append(result.size_bytes / result.flush_s / 1e9)
        disks.append(total / write_fsync(directory / "disk-probe.bin", raw()) / 1e9)
        syncs.append(sync_save(directory / "sync-save.bin"))
    started = time.perf_counter()
    step = ckpt.restore(state)
    stall_until()
    restore_s = time.perf_counter() - started
    assert step == repeats
    return {
        "bytes": float(total),
        "stall_s": median(stalls),
        "copy_bound_s": median(copies),
        "sync_save_s": median(syncs),
        "flush_gbps": median(flushes),
        "disk_fsync_gbps": median(disks),
        "restore_s": restore_s,
        "restore_gbps": total / restore_s / 1e9,
        "repeats": float(repeats),
        "stall_over_copy": median([s / c for s, c in zip(stalls, copies, strict=True)]),
        "sync_save_over_stall": median([s / t for s, t in zip(syncs, stalls, strict=True)]),
        "flush_over_disk": median([f / d for f, d in zip(flushes, disks, strict=True)]),
        "stall_min_s": min(stalls),
        "stall_max_s": max(stalls),
    }


def repeats_for(total: int, repeats: int) -> int:
    """More repetitions for small states, whose millisecond timings a shared machine disturbs most."""
    return max(repeats, min(3 * repeats, repeats * (1 << 30) // max(total, 1)))


def run_cpu(total: int, base: Path | None, repeats: int, chunk_bytes: int) -> dict[str, float]:
    repeats = repeats_for(total, repeats)
    state = make_state(total)
    warm = np.empty(total, dtype=np.uint8)
    warm.fill(0)  # touched once, like the staging
    with workdir(base) as directory:
        ckpt = Checkpointer(
            "bench", str(directory / "ckpt"), interval_s=None, keep=2, chunk_bytes=chunk_bytes
        )
        try:
            return measure(
                total,
                directory,
                repeats,
                state,
                ckpt,
                raw=lambda: [memoryview(t.view(np.uint8).reshape(-1).data) for t in leaves(state)],
                copy=lambda: copy_into(warm, state),
                sync_save=lambda path: sync_save_numpy(path, state),
            )
        finally:
            ckpt.close()


def cuda_unavailable() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'tessera-checkpoint-client[torch]')"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    return None


def run_cuda(total: int, base: Path | None, repeats: int, chunk_bytes: int) -> dict[str, float]:
    import torch
    import torch.distributed.checkpoint as dcp

    from tessera.checkpoint_client.torch import Checkpointer as TorchCheckpointer

    repeats = repeats_for(total, repeats)
    state = {
        "model": {
            f"layer{i}.weight": torch.full((n // 4,), i + 0.5, dtype=torch.float32, device="cuda")
            for i, n in enumerate(tensor_sizes(total))
        }
    }
    tensors = list(state["model"].values())
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    pinned.zero_()

    def copy() -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        offset = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            pinned[offset : offset + n].view(t.dtype).copy_(t, non_blocking=True)
            offset += n
        torch.cuda.synchronize()
        return time.perf_counter() - started

    host = pinned.numpy()

    def raw() -> list[memoryview]:
        return [memoryview(host)]

    def sync_save(path: Path) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        elapsed = time.perf_counter() - started
        path.unlink()
        return elapsed

    with workdir(base) as directory:
        ckpt = TorchCheckpointer(
            "bench-cuda", str(directory / "ckpt"), interval_s=None, keep=2, chunk_bytes=chunk_bytes
        )
        try:
            out = measure(
                total,
                directory,
                repeats,
                state,
                ckpt,
                raw=raw,
                copy=copy,
                sync_save=sync_save,
                stall_until=torch.cuda.synchronize,
            )
        finally:
            ckpt.close()
        blocking = []
        for r in range(repeats + 1):
            torch.cuda.synchronize()
            started = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=str(directory / f"dcp-{r}"), no_dist=True)
            elapsed = time.perf_counter() - started
            (future.upload_completion if hasattr(future, "upload_completion") else future).result()
            shutil.rmtree(directory / f"dcp-{r}", ignore_errors=True)
            if r:  # the first one warms DCP up
                blocking.append(elapsed)
        out["dcp_async_blocking_s"] = median(blocking)
    return out


def check(row: dict[str, float]) -> dict[str, bool]:
    """The goals, on the medians of the per-repetition ratios (each ratio taken within one repetition)."""
    return {
        "stall<=1.5x_copy": row["stall_over_copy"] <= 1.5,
        "stall*5<=sync_save": row["sync_save_over_stall"] >= 5,
        "flush>=0.9x_disk": row["flush_over_disk"] >= 0.9,
    }


def print_table(device: str, rows: dict[str, dict[str, float]]) -> None:
    cols = ["stall_s", "copy_bound_s", "sync_save_s", "flush_gbps", "disk_fsync_gbps", "restore_s"]
    cols += ["dcp_async_blocking_s"] if any("dcp_async_blocking_s" in r for r in rows.values()) else []
    ratios = ["stall_over_copy", "sync_save_over_stall", "flush_over_disk"]
    print(f"\n{device}")
    print("  ".join(f"{c:>20}" for c in ["size", *cols, *ratios]))
    for label, row in rows.items():
        print("  ".join([f"{label:>20}", *(f"{row[c]:>20.4f}" for c in [*cols, *ratios])]))
    print(
        "goals (stall <= 1.5x copy bound, stall >= 5x shorter than a synchronous save, flush >= 0.9x disk):"
    )
    for label, row in rows.items():
        print(f"  {label}: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in check(row).items()))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="64MiB,1GiB,4GiB", help="state sizes, comma-separated")
    parser.add_argument("--device", default="cpu,cuda", help="cpu, cuda or both (cuda needs torch and a GPU)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="checkpoints timed per size (median); up to 3x for small states",
    )
    parser.add_argument("--chunk", default="64MiB", help="chunk size of the durable format")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temporary directory)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    devices = {d.strip() for d in args.device.split(",")}
    chunk = parse_size(args.chunk)
    out: dict[str, Any] = {"cpu": None, "cuda": None}
    if "cpu" in devices:
        out["cpu"] = {}
        for total in sizes:
            print(f"cpu {size_label(total)} ...", file=sys.stderr)
            out["cpu"][size_label(total)] = run_cpu(total, args.dir, args.repeats, chunk)
            gc.collect()
        print_table("cpu", out["cpu"])
    if "cuda" in devices:
        reason = cuda_unavailable()
        if reason:
            print(f"\ncuda: not measured: {reason}")
            out["cuda_reason"] = reason
        else:
            out["cuda"] = {}
            for total in sizes:
                print(f"cuda {size_label(total)} ...", file=sys.stderr)
                out["cuda"][size_label(total)] = run_cuda(total, args.dir, args.repeats, chunk)
                gc.collect()
            print_table("cuda", out["cuda"])
    else:
        out["cuda_reason"] = "not requested (--device cuda)"
    out["machine"] = {"cpus": os.cpu_count(), "platform": sys.platform}
    out["settings"] = {"repeats": args.repeats, "chunk_bytes": chunk, "sizes": [size_label(s) for s in sizes]}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
