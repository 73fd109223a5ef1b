"""The one image of an upload: the request's body, or the one file of a multipart form, read by hand (the
standard library's parser, within bounds: parts, part headers, nesting) with the bytes the client sent."""

from __future__ import annotations

from email import errors as email_errors
from email.parser import BytesParser
from email.policy import HTTP
from typing import List, Tuple


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
    never answered for its first file alone."""
    if not ctype.lower().startswith("multipart/form-data"):
        return body, "upload"
    head = b"Content-Type: " + ctype.encode("latin-1") + b"\r\n\r\n"
    boundary = BytesParser(policy=HTTP).parsebytes(head).get_boundary()
    try:  # (a raw \xff, or an RFC 2231 boundary*=utf-8''%E2%98%83, came back as text no header byte spells: a 500)
        delimiter = b"--" + boundary.encode("latin-1") if boundary else b""
    except UnicodeError:
        raise FormError("the form's boundary is not ASCII text (RFC 2046: 1-70 characters of a safe set)") from None
    # (the client's boundary, which its parts never hold: an uncompressed image may hold any other bytes)
    if delimiter and body.count(delimiter) > MAX_FORM_PARTS + 1:
        raise FormError(f"the form has more than {MAX_FORM_PARTS} parts: send one image (the field 'file')")
    sent = _parts_as_sent(body, delimiter) if delimiter else []
    if max((_head_length(part.removesuffix(b"\r")) for part in sent), default=0) > MAX_PART_HEADER_BYTES:
        raise FormError(f"a part of the form has more than {MAX_PART_HEADER_BYTES // 1024} KiB of headers")
    try:
        message = BytesParser(policy=HTTP).parsebytes(head + body)
    except (RecursionError, UnicodeError):
        raise FormError("the multipart body could not be read") from None
    torn = (email_errors.CloseBoundaryNotFoundDefect, email_errors.StartBoundaryNotFoundDefect)
    if not message.is_multipart() or any(isinstance(d, torn) for d in message.defects):  # (a form cut short
        # before its closing boundary was answered from what had come of its file)
        raise FormError("the multipart body could not be read (no boundary, or a torn form)")
    parts = list(message.iter_parts())
    if any(part.is_multipart() for part in parts):
        raise FormError("the form nests another form: send one image as the field 'file'")
    if any(part.get_param("name", header="content-disposition") == "top_k" for part in parts):  # was dropped
        raise FormError("top_k is read from the query, not the form: POST to /predict?top_k=3")
    files = [part for part in parts if part.get_filename() is not None
             or part.get_param("name", header="content-disposition") in ("file", "image")]
    if not files:
        raise FormError("the form has no file (send the image as the field 'file')")
    if len(files) > 1:
        raise FormError(f"the form has {len(files)} files: send one image per request")
    payload = files[0].get_payload(decode=True) or b""
    index, at = parts.index(files[0]), body.find(delimiter) + len(delimiter)
    if body[at:at + 1] == b"\n" and index < len(sent):  # a form whose lines end in a bare LF
        payload = _with_bare_lf_tail(payload, sent[index])
    return payload, _safe_name(files[0].get_filename() or "upload")


def _parts_as_sent(body: bytes, delimiter: bytes) -> List[bytes]:
    """The form's parts as sent, in order, each from after its delimiter line's ``--boundary`` to before the next
    one's line feed (delimiters only at the start of a line: a payload may hold the boundary's bytes elsewhere);
    the closing delimiter and the epilogue left out."""
    out = []
    for piece in (b"\n" + body).split(b"\n" + delimiter)[1:]:
        if piece.startswith(b"--"):  # the closing delimiter: what follows is the epilogue
            break
        out.append(piece)
    return out


def _head_length(part: bytes) -> int:
    """The bytes of a raw part's headers, up to its blank line (a part without one: all of it)."""
    ends = [at for at in (part.find(b"\r\n\r\n"), part.find(b"\n\n")) if at >= 0]
    return min(ends) if ends else len(part)


def _with_bare_lf_tail(payload: bytes, part: bytes) -> bytes:
    r"""``payload`` with the ``\r`` the parser took from its end in a form whose lines end in a bare LF (``part``:
    its part as sent): before a delimiter it strips CRLF or LF alike, so a file ending in ``\r`` lost that byte."""
    blank = part.find(b"\n\n")
    sent = part[blank + 2:] if blank >= 0 else b""
    return payload + b"\r" if sent == payload + b"\r" else payload


def _safe_name(name: str) -> str:
    """A client's file name, for messages only (never a path on the server): its last part, printable."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c for c in base if c.isprintable())[:200] or "upload"
