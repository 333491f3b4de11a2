"""The plots kept in docs/ are written as 256-colour PNGs."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pytest

from bench.results import plot

Image = pytest.importorskip("PIL.Image")


class TwoColourFigure:
    """What save_png asks of a matplotlib figure: its RGBA PNG, here a line across a white canvas."""

    def savefig(self, out: BinaryIO, format: str) -> None:
        image = Image.new("RGBA", (320, 200), (255, 255, 255, 255))
        for x in range(320):
            image.putpixel((x, x * 200 // 320), (31, 119, 180, 255))
        image.save(out, format=format)


def test_a_plot_is_saved_with_a_palette_and_its_pixels(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    plot.save_png(TwoColourFigure(), path)
    with Image.open(path) as saved:
        assert saved.mode == "P"
        pixels = saved.convert("RGB")
        assert pixels.getpixel((160, 100)) == (31, 119, 180) and pixels.getpixel((10, 150)) == (255, 255, 255)
