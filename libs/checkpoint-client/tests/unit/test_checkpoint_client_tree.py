"""Flattening states, plain values, staging plans and chunk pieces: the torch-free logic."""

from __future__ import annotations

import array
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tessera.checkpoint_client.format import effective_chunk_bytes, pieces_for
from tessera.checkpoint_client.staging import ALIGN, plan_layout
from tessera.checkpoint_client.tree import (
    NumpyAdapter,
    decode_value,
    dtype_name,
    encode_value,
    flatten,
    parse_dtype,
    unflatten,
)

ADAPTERS = [NumpyAdapter()]


def test_nested_mappings_flatten_to_dotted_names_in_order() -> None:
    state = {
        "model": {"w": np.zeros(3), "b": np.ones(2, np.float32)},
        "optim": {
            "state": {0: {"exp_avg": np.zeros(3)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}],
        },
        "epoch": 3,
    }
    flat = flatten(state, ADAPTERS)
    assert [leaf.name for leaf in flat.tensors] == ["model.w", "model.b", "optim.state.0.exp_avg"]
    assert flat.tensors[2].path == ("optim", "state", 0, "exp_avg")
    assert [leaf.name for leaf in flat.objects] == ["optim.param_groups", "epoch"]
    info = flat.tensors[1].info
    assert info is not None and (info.shape, info.dtype, info.nbytes) == ((2,), "<f4", 8)


def test_buffer_protocol_objects_and_numpy_scalars_are_tensors() -> None:
    state = {"a": bytearray(b"abc"), "b": array.array("d", [1.0, 2.0]), "c": b"xy", "d": np.float32(1.5)}
    flat = flatten(state, ADAPTERS)
    infos = {leaf.name: leaf.info for leaf in flat.tensors}
    assert infos["a"] is not None and infos["a"].nbytes == 3
    assert infos["b"] is not None and (infos["b"].dtype, infos["b"].shape) == ("<f8", (2,))
    assert infos["c"] is not None and infos["c"].kind == "bytes"
    assert infos["d"] is not None and infos["d"].shape == ()


def test_colliding_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"a\.b"):
        flatten({"a.b": np.zeros(1), "a": {"b": np.zeros(1)}}, ADAPTERS)


def test_a_tensor_inside_a_list_is_refused_naming_the_leaf() -> None:
    with pytest.raises(TypeError, match=r"model\.layers"):
        flatten({"model": {"layers": [np.zeros(2)]}}, ADAPTERS)


def test_object_arrays_are_refused_naming_the_leaf() -> None:
    with pytest.raises(TypeError, match="bad"):
        flatten({"bad": np.array([object()], dtype=object)}, ADAPTERS)


def test_plain_values_round_trip_through_json_keeping_tuples() -> None:
    value = [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}, None, "x", True]
    assert decode_value(encode_value(value, "v")) == value
    assert isinstance(decode_value(encode_value((1, 2), "v")), tuple)


def test_unflatten_restores_int_keys_and_empty_mappings() -> None:
    tree = unflatten([(["optim", "state", 0, "m"], 1), (["optim", "param_groups"], []), (["empty"], {})])
    assert tree == {"optim": {"state": {0: {"m": 1}}, "param_groups": []}, "empty": {}}


def test_structured_dtypes_have_a_name_that_parses_back() -> None:
    dt = np.dtype([("x", "<f4"), ("y", "<i8", (2,))])
    assert parse_dtype(dtype_name(dt)) == dt
    assert dtype_name(np.dtype(np.float16)) == "<f2"


def test_plan_aligns_every_slot() -> None:
    plan = plan_layout([("a", 3), ("b", 1000), ("c", 0), ("d", 5)])
    assert [s.offset % ALIGN for s in plan.slots] == [0, 0, 0, 0]
    assert plan.slots[1].offset == ALIGN and plan.total_bytes == plan.slots[3].offset + 5
    assert plan.signature == (("a", 3), ("b", 1000), ("c", 0), ("d", 5))


def test_pieces_cut_a_range_at_chunk_boundaries() -> None:
    pieces = pieces_for(offset=90, nbytes=250, chunk_bytes=100)
    assert [(p.chunk, p.offset, p.length) for p in pieces] == [
        (0, 90, 10),
        (1, 0, 100),
        (2, 0, 100),
        (3, 0, 40),
    ]
    assert pieces_for(0, 0, 100) == []


def test_the_core_never_imports_torch(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now raises ImportError
        import numpy as np
        import tessera.checkpoint_client as cc
        from tessera.checkpoint_client import Checkpointer
        ck = Checkpointer("job", {str(tmp_path)!r}, interval_s=None)
        state = {{"w": np.arange(4.0)}}
        assert ck.save(1, state, wait=True).ok
        state["w"][:] = 0
        assert ck.restore(state) == 1 and state["w"][3] == 3.0
        ck.close()
        assert sys.modules["torch"] is None
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_small_states_get_smaller_chunks_so_writes_and_fsyncs_overlap() -> None:
    mib = 1 << 20
    assert effective_chunk_bytes(64 * mib, 64 * mib) == 8 * mib
    assert effective_chunk_bytes(4 << 30, 64 * mib) == 64 * mib
    assert effective_chunk_bytes(10 * mib, 64 * mib) == 8 * mib  # never below 8 MiB
    assert effective_chunk_bytes(10_000, 4096) == 4096  # never above what was asked
