"""Command tests: keep the measured-peaks cache (bench's roofline figures) out of the user's home."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def peaks_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("peaks")


@pytest.fixture(autouse=True)
def _private_peaks_cache(peaks_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(peaks_dir))
