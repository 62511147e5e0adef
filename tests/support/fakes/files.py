"""Files as users send them, made on the spot: photos, PDFs, voice notes, broken ones."""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field

from PIL import Image

from bot.message import Attachment, FetchFailed
from tests.support.fakes.outbound import RecordingOutbound

# Every PNG file's first eight bytes.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
    return pdf_file(objects)


def voice(seconds: float = 10.0) -> bytes:
    """Bytes standing in for an Opus voice note of about this length (16 kbit/s, as Telegram
    records them). The fake transcription service does not decode audio, so only the size
    and the name matter."""
    return b"OggS" + bytes(int(seconds * 2000))


# -- poison: files that broke cycles (issue 19) -------------------------------------------------


def encrypted_pdf(user_password: str = "", owner_password: str = "bank-owner") -> bytes:
    """A PDF encrypted with AES-256. With an empty user password (how banks and shops send
    statements) anyone may open it; with a user password only its holder may."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf("Statement: balance 42.00 EUR"))))
    writer.encrypt(user_password, owner_password, algorithm="AES-256")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _png_chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    import zlib

    check = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", check)


def broken_png() -> bytes:
    """A PNG whose header is fine and whose image data is cut off by a chunk of no valid
    type: Pillow opens it, then raises SyntaxError ("broken PNG file") while decoding."""
    import zlib

    header = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 64, 64, 8, 2, 0, 0, 0))
    data = zlib.compress(bytes(64 * 193))
    return (
        PNG_SIGNATURE
        + header
        + _png_chunk(b"IDAT", data[:20])
        + _png_chunk(b"\x00\x01\x02\x03", data[20:])
        + _png_chunk(b"IEND", b"")
    )


def eps() -> bytes:
    """An Encapsulated PostScript file, as someone sends it named x.png: Pillow would identify
    it by content and hand it to Ghostscript."""
    return (
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 100 100\n%%EndComments\n"
        b"newpath 10 10 moveto 90 90 lineto stroke\nshowpage\n%%EOF\n"
    )


def huge_png(width: int = 7000, height: int = 7000, orientation: int = 6) -> bytes:
    """A PNG of one colour, `width` x `height`, with an EXIF orientation (6: turn it 90
    degrees): a few hundred kB that claim `width * height` pixels. Written row by row, so
    making it costs no such memory here. 7000x7000 is ~210 kB, and 49 M pixels: under the
    50 M that lastword allowed before issue 19."""
    import zlib

    exif = Image.Exif()
    exif[0x0112] = orientation
    compressor = zlib.compressobj(9)
    row = b"\x00" + b"\x80\x90\xa0" * width
    packed = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    header = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return (
        PNG_SIGNATURE
        + header
        + _png_chunk(b"eXIf", exif.tobytes())
        + _png_chunk(b"IDAT", packed)
        + _png_chunk(b"IEND", b"")
    )


def hostile_pdf(pages: int = 20, megabytes: float = 3.5, seed: int = 0) -> bytes:
    """A PDF of a few kB whose pages all share one FlateDecode content stream that inflates to
    `megabytes` MB of path operators and one text operator that shows nothing (so a reader
    looking for text parses every page): cheap to send, seconds of parser CPU per page. Under
    pypdf's own parsing budget per stream (2 M elements), so only a time limit stops it.
    `seed` makes each copy a file of its own."""
    import zlib

    operators = b"0 0 m\n"
    paths = operators * int(megabytes * 1_000_000 / len(operators))
    # One text operator, showing nothing: a page without one is skipped unparsed.
    content = b"%% copy %d\n" % seed + paths + b"BT /F1 12 Tf () Tj ET\n"
    stream = zlib.compress(content, 9)
    kids = " ".join(f"{4 + i} 0 R" for i in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode(),
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (len(stream), stream),
    ]
    font = 4 + pages
    objects += [
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R "
        b"/Resources << /Font << /F1 %d 0 R >> >> >>" % font
    ] * pages
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    return pdf_file(objects)


@dataclass
class Shelf(RecordingOutbound):
    """A platform stand-in that also holds users' files, for in-process tests: `fetch` answers
    an attachment's ref with its bytes (or raises what is shelved for it, as a broken platform
    library would), and counts every fetch."""

    shelved: dict[str, bytes | Exception] = field(default_factory=dict)
    fetches: list[str] = field(default_factory=list)

    async def fetch(self, attachment: Attachment, max_bytes: int) -> bytes:
        self.fetches.append(attachment.ref)
        found = self.shelved.get(attachment.ref)
        if found is None:
            raise FetchFailed("the platform no longer has the file (404)")
        if isinstance(found, Exception):
            raise found
        return found


def pdf_file(objects: list[bytes]) -> bytes:
    """A PDF of these objects (numbered from 1, the catalog first), with its cross-reference
    table."""
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
