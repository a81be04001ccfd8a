"""The worker's model cache: configured models once per process, model versions in an LRU."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpu_worker import runtime
from gpu_worker.engine.loaded import file_sha256
from tests.model_versions import version_directory
from tests.workers import PLACEHOLDER_MODEL

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    runtime.model_cache_clear()
    yield
    runtime.model_cache_clear()


@pytest.fixture
def versions(tmp_path: Path) -> list[tuple[Path, str]]:
    out = []
    for i in range(3):
        directory = tmp_path / f"v{i}"
        sha = version_directory(PLACEHOLDER_MODEL, directory, nudge=0.01 * (i + 1))
        out.append((directory, sha))
    return out


def test_a_configured_model_is_loaded_once() -> None:
    first = runtime.model_get(PLACEHOLDER_MODEL, device=CPU)
    assert runtime.model_get(PLACEHOLDER_MODEL, device=CPU) is first
    assert runtime.models_held() == []  # not a version: outside the LRU


def test_versions_are_held_two_at_a_time_least_recent_evicted(
    versions: list[tuple[Path, str]],
) -> None:
    (d0, h0), (d1, h1), (d2, h2) = versions
    assert len({h0, h1, h2, file_sha256(PLACEHOLDER_MODEL / "model.safetensors")}) == 4
    a = runtime.model_get(d0, device=CPU, weights_sha256=h0)
    assert a.weights_sha256 == h0
    runtime.model_get(d1, device=CPU, weights_sha256=h1)
    assert runtime.model_get(d0, device=CPU, weights_sha256=h0) is a  # a hit, now most recent
    runtime.model_get(d2, device=CPU, weights_sha256=h2)  # evicts v1, the least recent
    assert runtime.models_held() == [(str(d0.resolve()), h0), (str(d2.resolve()), h2)]
    again = runtime.model_get(d1, device=CPU, weights_sha256=h1)  # reloaded; evicts v0
    assert again.weights_sha256 == h1
    assert [h for _, h in runtime.models_held()] == [h2, h1]
    assert runtime.model_get(d0, device=CPU, weights_sha256=h0) is not a


def test_a_version_whose_directory_is_gone_is_refused(versions: list[tuple[Path, str]]) -> None:
    directory, sha = versions[0]
    (directory / "model.safetensors").unlink()
    with pytest.raises(runtime.ModelVersionUnavailable, match="weights are gone"):
        runtime.model_get(directory, device=CPU, weights_sha256=sha)
    assert runtime.models_held() == []


def test_a_version_whose_weights_were_altered_is_refused(versions: list[tuple[Path, str]]) -> None:
    (d0, _h0), (d1, h1) = versions[0], versions[1]
    with pytest.raises(runtime.ModelVersionUnavailable, match="altered"):
        runtime.model_get(d0, device=CPU, weights_sha256=h1)  # v0's weights under v1's hash
    assert runtime.models_held() == []
    assert runtime.model_get(d1, device=CPU, weights_sha256=h1).weights_sha256 == h1


def test_a_version_on_weights_its_directory_has_since_replaced_loads_from_the_archive(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    shipped = root / "stencil-denoiser"
    earlier = version_directory(PLACEHOLDER_MODEL, tmp_path / "earlier", nudge=0.01)
    now = version_directory(PLACEHOLDER_MODEL, shipped, nudge=0.02)  # the retrained weights
    kept = root / "archive" / f"stencil-denoiser-{earlier[:12]}"
    kept.parent.mkdir(parents=True)
    (tmp_path / "earlier").rename(kept)
    loaded = runtime.model_get(shipped, device=CPU, weights_sha256=earlier)
    assert loaded.weights_sha256 == earlier and loaded.directory == kept
    assert runtime.model_get(shipped, device=CPU, weights_sha256=now).directory == shipped
    with pytest.raises(runtime.ModelVersionUnavailable, match="altered"):
        runtime.model_get(shipped, device=CPU, weights_sha256="ab" * 32)  # kept nowhere


def test_the_shipped_models_keep_their_earlier_weights_in_the_archive() -> None:
    models = Path(__file__).resolve().parents[2] / "models"
    for kept in sorted((models / "archive").iterdir()):
        name, short = kept.name.rsplit("-", 1)
        sha = file_sha256(kept / "model.safetensors")
        assert sha.startswith(short) and (models / name / "config.json").is_file()
        assert runtime.model_get(models / name, device=CPU, weights_sha256=sha).directory == kept
