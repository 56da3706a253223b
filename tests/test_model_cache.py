"""The per-user model cache, and a built-in model reaching a node that lacks it (asyncrl.core.models.cache)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from asyncrl.core.models import model_source
from asyncrl.core.models.cache import ModelSource, cache_dir, fetch_into, manifest, model_on_this_node, read_chunk


def test_cache_dir_is_per_user_unless_configured(tmp_path, monkeypatch):
    monkeypatch.delenv("ASYNCRL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert cache_dir() == tmp_path / "home" / ".cache" / "asyncrl" / "models"  # not relative to the working directory
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "asyncrl" / "models"
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", "~/models")
    assert cache_dir() == tmp_path / "home" / "models"
    assert cache_dir("rel/cache") == tmp_path / "rel" / "cache"  # model.cache_dir wins, made absolute


def fake_model(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}')
    (root / "model.safetensors").write_bytes(bytes(range(256)) * 40)  # 10 240 bytes
    (root / "sub" / "tokenizer.json").write_text("{}")
    return root


def test_fetch_copies_every_file_byte_for_byte_in_chunks(tmp_path):
    src = fake_model(tmp_path / "src")
    files = manifest(src)
    assert files == {"config.json": 8, "model.safetensors": 10240, "sub/tokenizer.json": 2}
    reads = []

    def read(rel, offset, size):
        reads.append((rel, offset, size))
        return read_chunk(src, rel, offset, size)

    fetch_into(tmp_path / "dst", files, read, chunk=4096)
    assert manifest(tmp_path / "dst") == files
    assert (tmp_path / "dst" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert [r for r in reads if r[0] == "model.safetensors"] == [("model.safetensors", 0, 4096), ("model.safetensors", 4096, 4096),
                                                                ("model.safetensors", 8192, 2048)]
    with pytest.raises(OSError, match="arrived with 7 bytes, expected 8"):  # a short read is caught, not written silently
        fetch_into(tmp_path / "short", files, lambda rel, offset, size: read_chunk(src, rel, offset, size)[:-1])
    with pytest.raises(ValueError, match="not inside"):
        read_chunk(src, "../src/config.json/../../etc", 0, 1)


def test_a_node_without_the_builtin_copies_it_from_the_driver(tmp_path, monkeypatch):
    driver = fake_model(tmp_path / "driver" / "tiny-x")
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", str(tmp_path / "node2"))  # this "node"'s own cache
    source = ModelSource(given="tiny", path=str(tmp_path / "elsewhere" / "tiny-x"), builtin="tiny-x",
                         files=tuple(manifest(driver).items()))
    with pytest.raises(ValueError, match="no copy from the driver"):
        model_on_this_node(source, None)
    got = model_on_this_node(source, lambda rel, offset, size: read_chunk(driver, rel, offset, size))
    assert got == str(tmp_path / "node2" / "tiny-x") and manifest(Path(got)) == manifest(driver)
    # the second job on this node finds its copy: nothing is read
    assert model_on_this_node(source, lambda *a: pytest.fail("read again")) == got
    # a node whose cache is the driver's (a shared home directory) finds the model there: nothing is read
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", str(driver.parent))
    assert model_on_this_node(ModelSource("tiny", str(driver), "tiny-x", source.files), None) == str(driver)
    monkeypatch.setenv("ASYNCRL_CACHE_DIR", str(tmp_path / "node2"))
    # a stale copy under the same name (a different build) is replaced
    (Path(got) / "config.json").write_text('{"a": 22}')
    assert model_on_this_node(source, lambda rel, offset, size: read_chunk(driver, rel, offset, size)) == got
    assert (Path(got) / "config.json").read_text() == '{"a": 1}'


def test_a_node_without_a_local_model_dir_is_named(tmp_path):
    source = ModelSource(given="./mine", path=str(tmp_path / "mine"))
    with pytest.raises(ValueError, match=rf"{tmp_path / 'mine'} does not exist on node {socket.gethostname()}"):
        model_on_this_node(source, None)
    fake_model(tmp_path / "mine")
    assert model_on_this_node(source, None) == str(tmp_path / "mine")


def test_model_source_makes_a_local_dir_absolute_and_lists_a_builtin(tmp_path, monkeypatch, tiny_model_dir):
    fake_model(tmp_path / "mine")
    monkeypatch.chdir(tmp_path)
    local = model_source("mine", 2, 0)
    assert local.path == str(tmp_path / "mine") and local.builtin == "" and local.files == ()
    built = model_source("tiny", 2, 0, str(Path(tiny_model_dir).parent))
    assert built.path == tiny_model_dir and built.builtin == Path(tiny_model_dir).name
    assert dict(built.files)["config.json"] == (Path(tiny_model_dir) / "config.json").stat().st_size
