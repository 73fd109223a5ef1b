"""The one image of an upload: the request's body, or the one file of a multipart form, cut at its delimiters by
hand (the standard library's parser reads each part's headers alone, within bounds: parts, part headers, nesting),
with the bytes the client sent."""

from __future__ import annotations

import base64
import binascii
import quopri
import re
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Iterator, List, Tuple


class FormError(ValueError):
    """A form that is refused, in words (the server answers it as a 400)."""


#: the most bytes of a form part's headers (h11's limit for a request's own is 16 KiB): the standard library's
#: parser reads a Content-Disposition again for each parameter asked of it, at about a minute of CPU per MB, in a
#: worker thread no timeout stops (six forms of 300 kB made every other request a 504 for 100 s)
MAX_PART_HEADER_BYTES = 8 * 1024
#: the most part delimiters a form may hold (a browser's upload form holds one file and a few fields): the
#: parser's time grows with them (300,000 empty fields: a minute), and nested forms recurse in it
MAX_FORM_PARTS = 64


def read_upload(body: bytes, ctype: str) -> Tuple[bytes, str]:
    """(image bytes, a name for messages): the body itself, or the one file of a multipart form. A form
    with several files, a nested form, or more than :data:`MAX_FORM_PARTS` parts is refused (:class:`FormError`),
    never answered for its first file alone. The parts are cut at their delimiters by hand and only each part's
    headers go through the standard library's parser: it read a whole 19 MB file of line feeds in 6 s of a
    worker thread (eight such forms made every other request a 504)."""
    if not ctype.lower().startswith("multipart/form-data"):
        return body, "upload"
    head = b"Content-Type: " + ctype.encode("latin-1") + b"\r\n\r\n"
    boundary = BytesParser(policy=HTTP).parsebytes(head).get_boundary()
    try:  # (a raw \xff, or an RFC 2231 boundary*=utf-8''%E2%98%83, came back as text no header byte spells: a 500)
        delimiter = b"--" + boundary.encode("latin-1") if boundary else b""
    except UnicodeError:
        raise FormError("the form's boundary is not ASCII text (RFC 2046: 1-70 characters of a safe set)") from None
    sent, crlf, closed = _parts_as_sent(body, delimiter) if delimiter else ([], False, False)
    if not sent or not closed:  # (a form cut short before its closing boundary was answered from what had come)
        raise FormError("the multipart body could not be read (no boundary, or a torn form)")
    parts = [_part(raw, crlf) for raw in sent]
    if any(headers.get_content_maintype() == "multipart" for headers, _ in parts):
        raise FormError("the form nests another form: send one image as the field 'file'")
    if any(headers.get_param("name", header="content-disposition") == "top_k" for headers, _ in parts):
        raise FormError("top_k is read from the query, not the form: POST to /predict?top_k=3")  # (was dropped)
    files = [(headers, payload) for headers, payload in parts if headers.get_filename() is not None
             or headers.get_param("name", header="content-disposition") in ("file", "image")]
    if not files:
        raise FormError("the form has no file (send the image as the field 'file')")
    if len(files) > 1:
        raise FormError(f"the form has {len(files)} files: send one image per request")
    headers, payload = files[0]
    return _decoded(headers, payload), _safe_name(headers.get_filename() or "upload")


def _part(raw: bytes, crlf: bool) -> Tuple[Message, bytes]:
    """(headers, payload) of a part as sent (:func:`_parts_as_sent`): its headers (at most
    :data:`MAX_PART_HEADER_BYTES`, up to the first empty line, whatever its line ends) parsed, its payload as sent
    up to the line break before the next delimiter (CRLF in a form whose lines end so, else the LF alone: a file
    ending in a CR keeps it)."""
    blank = _BLANK_LINE.search(raw)
    at, after = (blank.start(), blank.end()) if blank else (len(raw), len(raw))
    if at > MAX_PART_HEADER_BYTES:
        raise FormError(f"a part of the form has more than {MAX_PART_HEADER_BYTES // 1024} KiB of headers")
    try:
        headers = BytesParser(policy=HTTP).parsebytes(raw[:at].rstrip(b"\r") + b"\r\n\r\n", headersonly=True)
    except (RecursionError, UnicodeError):
        raise FormError("the multipart body could not be read") from None
    payload = raw[after:]
    return headers, payload[:-1] if crlf and payload.endswith(b"\r") else payload


def _decoded(headers: Message, payload: bytes) -> bytes:
    """A payload in the transfer encoding its part names (RFC 7578 forbids any but binary; old clients sent
    base64 or quoted-printable)."""
    encoding = str(headers.get("content-transfer-encoding", "")).strip().lower()
    if "uu" in encoding:  # x-uuencode: the standard library decodes it with a module gone in Python 3.13
        raise FormError(f"the file's transfer encoding {encoding} is not read: send the file's bytes as they are")
    try:
        if encoding == "base64":  # its line breaks aside, every byte must be of the alphabet: others were dropped
            return base64.b64decode(b"".join(payload.split()), validate=True)  # (all of them: "no image bytes")
        if encoding == "quoted-printable":
            return quopri.decodestring(payload)
    except (binascii.Error, ValueError):
        raise FormError(f"the file's {encoding} transfer encoding could not be decoded") from None
    return payload


def _parts_as_sent(body: bytes, delimiter: bytes) -> Tuple[List[bytes], bool, bool]:
    """(the form's parts as sent, each from after its delimiter line to before the line feed of the next one;
    whether its lines end in CRLF, by its first delimiter line; whether it closes). A delimiter line is the
    delimiter at the start of a line, ``--`` after it for the close, then spaces or tabs only (RFC 2046): a payload
    line that merely starts with the boundary's bytes stays payload, and the preamble and epilogue are left out.
    More than :data:`MAX_FORM_PARTS` parts are refused before any is read."""
    lines = re.compile(rb"(?:^|\n)" + re.escape(delimiter) + rb"(--)?[ \t]*(\r?\n|\Z)")
    found = []
    for line in filter(None, (lines.match(body, at) for at in _candidates(body, delimiter))):
        found.append(line)
        if line.group(1):  # the close: what follows is the epilogue
            break
        if len(found) > MAX_FORM_PARTS:
            raise FormError(f"the form has more than {MAX_FORM_PARTS} parts: send one image (the field 'file')")
    parts = [body[a.end():b.start()] for a, b in zip(found, found[1:])]
    return parts, bool(found) and found[0].group(2) == b"\r\n", bool(found) and found[-1].group(1) is not None


def _candidates(body: bytes, delimiter: bytes) -> Iterator[int]:
    """Where a delimiter line may start: the body's start, and each line feed followed by the delimiter (found by
    bytes.find: a regular expression tried at every line feed of 19 MB of them took 0.4 s)."""
    if body.startswith(delimiter):
        yield 0
    at = body.find(b"\n" + delimiter)
    while at >= 0:
        yield at
        at = body.find(b"\n" + delimiter, at + 1)


#: the empty line that ends a part's headers (CRLF or LF, mixed as clients mix them), or opens a part without any
_BLANK_LINE = re.compile(rb"(?:^|\n)\r?\n")


def _safe_name(name: str) -> str:
    """A client's file name, for messages only (never a path on the server): its last part, printable."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c for c in base if c.isprintable())[:200] or "upload"
