"""The images `runtime check` shows a model that takes them: small PNGs made here (no image library), each with a
question whose one-word answer the image alone decides: a plain colour, a count of squares, left or right.

The field notes: images were accepted and encoded (223 tokens) while the model saw nothing right, 0/7 on colours,
counts and left/right, until transformers was upgraded; only answers that discriminate tell it.
"""

from __future__ import annotations

import base64
import struct
import zlib
from dataclasses import dataclass

SIZE = 224  # a common vision encoder's input side: no model has to rescale much
RGB = {"red": (220, 30, 30), "green": (30, 170, 60), "blue": (40, 70, 220)}
WHITE, BLACK = (255, 255, 255), (0, 0, 0)
Pixels = list[list[tuple[int, int, int]]]


@dataclass(frozen=True)
class Picture:
    shows: str  # what the image is, in words
    question: str
    answer: str  # the word the answer must hold (lower case)
    png: str  # base64


def png_of(pixels: Pixels) -> str:
    """The pixels as a base64 PNG (8-bit RGB, no filter)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\0" + bytes(value for pixel in row for value in pixel) for row in pixels)
    header = struct.pack(">IIBBBBB", len(pixels[0]), len(pixels), 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(data).decode()


def canvas(colour: tuple[int, int, int] = WHITE) -> Pixels:
    return [[colour] * SIZE for _ in range(SIZE)]


def square(pixels: Pixels, left: int, top: int, side: int = 40) -> None:
    for y in range(top, top + side):
        pixels[y][left : left + side] = [BLACK] * side


def pictures_to_show() -> list[Picture]:
    """Three plain colours, two and three squares, a square on the left and one on the right."""
    pictures = [
        Picture(
            f"a {name} image",
            "Which colour fills this image? Answer with one word: red, green or blue.",
            name,
            png_of(canvas(rgb)),
        )
        for name, rgb in RGB.items()
    ]
    for count, word in ((2, "two"), (3, "three")):
        pixels = canvas()
        for n in range(count):
            square(pixels, 20 + n * 70, 92)
        question = "How many black squares are in this image? Answer with one word: one, two, three or four."
        pictures.append(Picture(f"{word} squares", question, word, png_of(pixels)))
    for side, left in (("left", 20), ("right", SIZE - 60)):
        pixels = canvas()
        square(pixels, left, 92)
        question = "Is the black square on the left or on the right of this image? Answer with one word."
        pictures.append(Picture(f"a square on the {side}", question, side, png_of(pixels)))
    return pictures
