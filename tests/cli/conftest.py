"""Command tests: keep the measured-peaks cache out of the user's home."""

from helpers import peaks_dir, private_peaks_cache  # noqa: F401 - fixtures: importing them here applies them
