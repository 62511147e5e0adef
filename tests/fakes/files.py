"""Files as users send them, made on the spot: photos, PDFs, voice notes, broken ones."""

from __future__ import annotations

import io


def photo(width: int = 2000, height: int = 1500, color: str = "red", fmt: str = "JPEG") -> bytes:
    """An image of one colour with a contrasting square in its top-left corner, so a test can
    tell the image was not rotated or cropped."""
    from PIL import Image, ImageDraw

    picture = Image.new("RGB", (width, height), color)
    ImageDraw.Draw(picture).rectangle((0, 0, width // 4, height // 4), fill="blue")
    out = io.BytesIO()
    picture.save(out, fmt)
    return out.getvalue()


def rotated_photo(width: int = 400, height: int = 200) -> bytes:
    """A JPEG stored `width` x `height` whose EXIF orientation (6) says to show it turned by
    90 degrees: upright, it is `height` x `width`."""
    from PIL import Image

    picture = Image.new("RGB", (width, height), "green")
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    picture.save(out, "JPEG", exif=exif)
    return out.getvalue()


def transparent_png(size: int = 64) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGBA", (size, size), (0, 0, 0, 0)).save(out, "PNG")
    return out.getvalue()


def corrupt_photo() -> bytes:
    """The first bytes of a JPEG and then nothing a decoder can use."""
    return photo(64, 64)[:40] + b"\x00" * 200


def pdf(*pages: str) -> bytes:
    """A PDF with one line of text per page, in the standard Helvetica font (no font file)."""
    objects: list[bytes] = []
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(pages)))
    font = 3 + 2 * len(pages)
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    )
    return out.getvalue()


def voice(seconds: float = 10.0) -> bytes:
    """Bytes standing in for an Opus voice note of about this length (16 kbit/s, as Telegram
    records them). The fake transcription service does not decode audio, so only the size
    and the name matter."""
    return b"OggS" + bytes(int(seconds * 2000))
