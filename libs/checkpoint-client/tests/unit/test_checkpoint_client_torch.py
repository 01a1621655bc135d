"""The torch extra: state_dicts of modules and optimizers, bfloat16, reuse of staging, and the DCP stager.

torch is not in the default environment (its wheels are gigabytes): these run where it is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tessera.checkpoint_client import load as load_numpy  # noqa: E402
from tessera.checkpoint_client.torch import (  # noqa: E402
    Checkpointer,
    TesseraStager,
    TorchAdapter,
    dtype_name,
    load,
    torch_dtype,
)

JOB = "job-torch"


def trained(seed: int = 0) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(3):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_dtypes_are_named_like_numpy_where_numpy_has_them() -> None:
    assert dtype_name(torch.float32) == "<f4" and torch_dtype("<f4") == torch.float32
    assert dtype_name(torch.bfloat16) == "torch.bfloat16" and torch_dtype("torch.bfloat16") == torch.bfloat16


def test_modules_and_optimizers_round_trip_through_their_state_dicts(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    extra = {"ema": torch.randn(5).to(torch.bfloat16), "step": torch.tensor(7)}
    ckpt = Checkpointer(JOB, str(tmp_path), interval_s=None)
    result = ckpt.save(3, {"model": model, "optim": optimizer, "extra": extra}, wait=True)
    assert result is not None and result.ok, result

    fresh_model, _ = trained(1)  # other weights
    fresh_optimizer = torch.optim.AdamW(fresh_model.parameters(), lr=1.0)  # no state yet: restored whole
    fresh_extra = {"ema": torch.zeros(5, dtype=torch.bfloat16), "step": torch.tensor(0)}
    state = {"model": fresh_model, "optim": fresh_optimizer, "extra": fresh_extra}
    assert Checkpointer(JOB, str(tmp_path), interval_s=None).restore(state) == 3
    for a, b in zip(model.parameters(), fresh_model.parameters(), strict=True):
        assert torch.equal(a, b)
    saved, loaded = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert loaded["param_groups"][0]["lr"] == 1e-3 and tuple(loaded["param_groups"][0]["betas"]) == (
        0.9,
        0.95,
    )
    for key, value in saved["state"].items():
        assert torch.equal(value["exp_avg"], loaded["state"][key]["exp_avg"])
    assert torch.equal(fresh_extra["ema"], extra["ema"]) and int(fresh_extra["step"]) == 7
    ckpt.close()


def test_plain_state_dicts_restore_in_place(tmp_path: Path) -> None:
    model, _ = trained(0)
    ckpt = Checkpointer(JOB, str(tmp_path), interval_s=None)
    ckpt.save(1, {"model": model.state_dict()}, wait=True)
    other, _ = trained(2)
    weight = other[0].weight
    assert ckpt.restore({"model": other.state_dict()}) == 1
    assert other[0].weight is weight and torch.equal(weight, model[0].weight)
    ckpt.close()


def test_the_second_snapshot_reuses_the_staging(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    ckpt = Checkpointer(JOB, str(tmp_path), interval_s=None)
    state = {"model": model, "optim": optimizer}
    ckpt.save(1, state, wait=True)
    [staging] = ckpt.pool._all
    arena = staging.arena
    ckpt.save(2, state, wait=True)
    assert ckpt.pool.allocations == 1 and ckpt.pool._all[0].arena is arena
    ckpt.close()


def test_numpy_reads_what_torch_wrote(tmp_path: Path) -> None:
    ckpt = Checkpointer(JOB, str(tmp_path), interval_s=None)
    weights = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ckpt.save(1, {"w": weights, "h": torch.ones(3, dtype=torch.bfloat16)}, wait=True)
    assert ckpt.last_result is not None
    step, tree = load_numpy(ckpt.last_result.uri)
    assert step == 1 and np.array_equal(tree["w"], weights.numpy())
    assert tree["h"].nbytes == 6  # no bfloat16 in NumPy: its raw bytes
    step, tensors = load(ckpt.last_result.uri, map_location="cpu")
    assert tensors["h"].dtype == torch.bfloat16 and torch.equal(
        tensors["h"], torch.ones(3, dtype=torch.bfloat16)
    )
    ckpt.close()


def test_sparse_tensors_are_refused_naming_the_leaf(tmp_path: Path) -> None:
    ckpt = Checkpointer(JOB, str(tmp_path), interval_s=None)
    with pytest.raises(TypeError, match=r"model\.s"):
        ckpt.save(1, {"model": {"s": torch.zeros(3).to_sparse()}})
    ckpt.close()


def test_the_dcp_stager_reuses_its_buffers_across_async_saves(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    model, optimizer = trained(0)
    stager = TesseraStager()
    state = {"model": model.state_dict(), "meta": {"epoch": 3}}
    staged = stager.stage(state)
    stager.synchronize_staging()
    first_arena = stager.pool._all[0].arena
    assert torch.equal(staged["model"]["0.weight"], model[0].weight)
    assert staged["model"]["0.weight"].data_ptr() != model[0].weight.data_ptr()
    for step in (1, 2):
        with torch.no_grad():
            model[0].weight.add_(1.0)
        future = dcp.async_save(
            {"model": model.state_dict(), "meta": {"epoch": step}},
            checkpoint_id=str(tmp_path / f"dcp-{step}"),
            async_stager=stager,
            no_dist=True,
        )
        (future.upload_completion if hasattr(future, "upload_completion") else future).result()
    assert stager.pool.allocations == 1 and stager.pool._all[0].arena is first_arena
    target = {"model": trained(5)[0].state_dict(), "meta": {"epoch": 0}}
    dcp.load(target, checkpoint_id=str(tmp_path / "dcp-2"), no_dist=True)
    assert torch.equal(target["model"]["0.weight"], model[0].weight) and target["meta"]["epoch"] == 2
    stager.close()
    del optimizer


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_tensors_go_through_pinned_staging_on_a_copy_stream(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    model.cuda()
    ckpt = Checkpointer(JOB, str(tmp_path), interval_s=None)
    state = {"model": model}
    assert ckpt.step(1, state) is False
    ckpt.request("test")
    assert ckpt.step(1, state)
    with torch.no_grad():  # training goes on at once; the copy still holds the old values
        for p in model.parameters():
            p.add_(1.0)
    result = ckpt.wait()
    assert result is not None and result.ok
    staging = ckpt.pool._all[0]
    assert staging.kind == "pinned" and isinstance(ckpt.torch_adapter, TorchAdapter)
    _, tensors = load(result.uri)
    assert torch.equal(tensors["model"]["0.weight"].cuda() + 1.0, model[0].weight)
    ckpt.close()
    del optimizer
