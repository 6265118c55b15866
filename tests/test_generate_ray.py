"""Dataset generation on a local Ray: determinism, resume, corruption, mismatched configs."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from spice_ray.common.faults import FAULT_ENV, fault_switch
from spice_ray.config import make_config
from spice_ray.data import store
from spice_ray.data.generate import generate_dataset

pytestmark = pytest.mark.ray


def _cfg(env: str = "bandit", **over):
    sets = [f"{k}={v}" for k, v in over.items()]
    return make_config("smoke", env, overrides=sets)


def _files(ds_dir):
    return {p.relative_to(ds_dir).as_posix(): p.read_bytes()
            for p in sorted(ds_dir.rglob("shard-*.parquet"))}


def test_same_seed_same_content_any_actors_or_shard_size(ray_local, tmp_path) -> None:
    one = generate_dataset(_cfg(**{"data.concurrent_tasks": 1, "data.shard_size": 48}),
                           tmp_path / "a")
    generate_dataset(_cfg(**{"data.concurrent_tasks": 2, "data.shard_size": 48}), tmp_path / "b")
    other = generate_dataset(_cfg(**{"data.concurrent_tasks": 2, "data.shard_size": 20,
                                     "data.batch_size": 7}), tmp_path / "c")
    assert one.generated["train"] == [0, 1] and other.generated["train"] == list(range(5))
    # identical shard files, byte for byte, whatever the number of actors
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    man = {k: store.load_manifest(tmp_path / k).raw for k in "abc"}
    for split in ("train", "validation", "eval"):
        hashes = {k: man[k]["splits"][split]["content_hash"] for k in "abc"}
        assert len(set(hashes.values())) == 1, hashes  # shard size does not change content
    a, c = store.load_split(tmp_path / "a", "train"), store.load_split(tmp_path / "c", "train")
    for k in a:
        np.testing.assert_array_equal(a[k], c[k])
    assert a["task_id"].tolist() == list(range(96))
    # a different seed gives different data
    d = generate_dataset(_cfg(**{"data.seed": 1}), tmp_path / "d")
    assert store.load_manifest(d.dataset_dir).raw["splits"]["train"]["content_hash"] != \
        man["a"]["splits"]["train"]["content_hash"]


def test_resume_after_deleted_and_truncated_shards(ray_local, tmp_path) -> None:
    cfg = _cfg("darkroom", **{"data.shard_size": 32})
    ds = tmp_path / "dr"
    generate_dataset(cfg, ds)
    before = _files(ds)
    again = generate_dataset(cfg, ds)  # a complete dataset: nothing regenerated
    assert again.generated == {"train": [], "validation": [], "eval": []}
    store.shard_path(ds, "train", 1).unlink()
    trunc = store.shard_path(ds, "train", 2)
    trunc.write_bytes(trunc.read_bytes()[:100])
    flip = store.shard_path(ds, "eval", 0)
    raw = bytearray(flip.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    flip.write_bytes(bytes(raw))
    with pytest.raises(store.DatasetError, match="shard-00002.parquet|shard-00001.parquet"):
        store.load_split(ds, "train")  # a reader names the broken shard
    rep = generate_dataset(cfg, ds)
    assert rep.generated == {"train": [1, 2], "validation": [], "eval": [0]}
    assert "truncated" in rep.invalid["train"][2] and "corrupted" in rep.invalid["eval"][0]
    assert _files(ds) == before  # regenerated shards are byte-identical


def test_an_edited_shard_with_a_re_signed_sidecar_is_regenerated(ray_local, tmp_path) -> None:
    """Shards are a function of (config, seed): one edited and re-signed (new bytes, a fresh
    sidecar) disagrees with the manifest, so it is regenerated, never signed into a new one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spice_ray.common.artifacts import write_sidecar

    cfg = _cfg("darkroom", **{"data.shard_size": 32})
    ds = tmp_path / "dr"
    generate_dataset(cfg, ds)
    before = _files(ds)
    path = store.shard_path(ds, "eval", 0)
    table = pq.read_table(path)
    i = table.schema.get_field_index("rewards")  # each task gets another task's rewards
    order = pa.array(range(table.num_rows - 1, -1, -1))
    table = table.set_column(i, table.schema.field(i), table.column("rewards").take(order))
    pq.write_table(table, path)
    write_sidecar(path, rows=table.num_rows)  # a forger re-signs the edited shard
    rep = generate_dataset(cfg, ds)
    assert rep.generated == {"train": [], "validation": [], "eval": [0]}
    assert "re-signed" in rep.invalid["eval"][0]
    assert _files(ds) == before  # the original bytes are back


def test_interrupted_generation_resumes(ray_local, tmp_path, monkeypatch) -> None:
    cfg = _cfg(**{"data.shard_size": 16})
    ds = tmp_path / "int"
    monkeypatch.setenv(FAULT_ENV, fault_switch(generate_after_shards=2))
    with pytest.raises(RuntimeError, match="injected fault"):
        generate_dataset(cfg, ds)
    assert not (ds / store.MANIFEST).exists()
    monkeypatch.delenv(FAULT_ENV)
    rep = generate_dataset(cfg, ds)
    assert rep.skipped["train"] == [0, 1] and rep.generated["train"] == [2, 3, 4, 5]
    ref = generate_dataset(cfg, tmp_path / "ref")
    assert _files(ds) == _files(ref.dataset_dir)


def test_mismatched_config_is_refused(ray_local, tmp_path) -> None:
    ds = tmp_path / "m"
    generate_dataset(_cfg(), ds)
    with pytest.raises(store.DatasetError, match=r"data\.label: on disk 'weak', requested "
                                                 r"'optimal'.*env\.sigma"):
        generate_dataset(_cfg(**{"data.label": "optimal", "env.sigma": 0.5}), ds)
    # execution-only fields (actors, batch size) are not part of the dataset's identity
    generate_dataset(_cfg(**{"data.concurrent_tasks": 1, "data.batch_size": 5}), ds)


def test_manifest_and_readers(ray_local, tmp_path) -> None:
    cfg = _cfg()
    rep = generate_dataset(cfg, tmp_path / "r")
    man = json.loads((rep.dataset_dir / store.MANIFEST).read_text())
    assert man["seed"] == 0 and man["spec"]["data"]["label"] == "weak"
    assert man["splits"]["train"]["num_rows"] == 96 and len(man["splits"]["eval"]["shards"]) == 1
    assert all(len(s["sha256"]) == 64 for s in man["splits"]["train"]["shards"])
    mem = store.load_split(rep.dataset_dir, "train")
    # the Ray streaming reader yields the same tasks as torch tensors
    seen = {}
    for batch in store.ray_dataset(rep.dataset_dir, "train").iter_torch_batches(batch_size=32):
        assert batch["actions"].shape[1:] == (cfg.env.horizon,)
        for i, tid in enumerate(batch["task_id"].tolist()):
            seen[tid] = batch["rewards"][i].numpy()
    assert sorted(seen) == list(range(96))
    np.testing.assert_array_equal(seen[17], mem["rewards"][17])
    # the plain (no Ray) streaming reader, shuffled, covers every task once
    ids = np.concatenate([b["task_id"] for b in store.iter_batches(
        rep.dataset_dir, "train", 10, rng=np.random.default_rng(0))])
    assert sorted(ids.tolist()) == list(range(96)) and ids.tolist() != list(range(96))
    assert rep.bytes_on_disk == store.dataset_bytes(rep.dataset_dir) > 0


def test_unwritable_output_fails_clearly(ray_local, tmp_path) -> None:
    if os.geteuid() == 0:
        ro = tmp_path / "file-not-dir"
        ro.write_text("x")
        target = ro / "ds"  # a path under a regular file cannot be created, even by root
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        target = ro / "ds"
    with pytest.raises(store.DatasetError, match="cannot write dataset directory"):
        generate_dataset(_cfg(), target)
