"""One HTTP/1.1 connection of the server: uvicorn's h11 protocol, with what an endpoint open to clients it does not
know needs on top of it.

- A deadline for a request's headers: a connection that sent none was held for ever.
- uvicorn's own 400 (a request h11 cannot read) in the one JSON error shape, counted in ``/metrics``, and its log
  line said once per server: a scanner's garbage wrote one line per request.
- A client that half-closes after its whole request still gets its answer (uvicorn closed at once); one that
  half-closes part-way through its body gets a 400 that says so (it got nothing).
- A lingering close: an answer given while the client's body is still coming (a 413 read off Content-Length, a 408,
  a drain's 503) is followed by reading, and throwing away, what comes (:data:`LINGER_S`, :data:`LINGER_BYTES`,
  :data:`LINGER_CONNECTIONS` at a time) before the close. Closing
  a socket with bytes unread sends a reset, and a client that sends its whole body before it reads (Python's
  ``http.client``, ``requests``) read "connection reset" in place of the answer. nginx's ``lingering_close``
  does the same.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, List, Optional, Tuple

#: the longest a connection is held after its answer, reading the rest of a refused body to throw it away
LINGER_S = 5.0
#: the most bytes read so (a client whose body runs on gets the reset it would have got: no event loop is spent on
#: a flood, which reads at gigabytes a second over loopback), and the most connections doing it at once
LINGER_BYTES = 32 * 1024 * 1024
LINGER_CONNECTIONS = 8
#: uvicorn's log line for each request h11 cannot read
INVALID_LINE = "Invalid HTTP request received."
#: the most bytes of a request line and headers read (h11's buffer limit, which it applies only to headers still
#: arriving: the same headers in one packet passed, in two got a 400): past it, a 431
MAX_HEADER_BYTES = 16 * 1024


def connection_protocol(timeout_s: float, metrics: Any) -> type:
    """uvicorn's h11 protocol with the deadline (``timeout_s``), the JSON 400 and the lingering close. Its own
    answers are counted in ``metrics`` as the app's are (under endpoint "other": no path was read). One class per
    server, so that the invalid-request line is said once per server."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    late, said, lingering_now = _late_answer(timeout_s), [False], [0]

    class Connection(H11Protocol):
        header_timer: Optional[asyncio.TimerHandle] = None
        refusal: Tuple[int, str] = (400, "")  # (the status and words for a request h11 cannot read: _read_events)
        eof_received, on_response_complete, half_closed, counted = _at_eof, _after_answer, False, metrics

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.logger = _InvalidSaidOnce(self.logger, said)
            self.conn.next_event = _read_events(self, self.conn.next_event)

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(_Lingering(transport, self, lingering_now))
            self._watch()

        def data_received(self, data: bytes) -> None:
            if self.transport.lingering:  # the rest of a refused body: read, so that the close is no reset, and dropped
                self.transport.drop(len(data))
                return
            super().data_received(data)
            self._watch()

        def connection_lost(self, exc) -> None:
            self._unwatch()
            self.transport.ended()
            super().connection_lost(exc)

        def _watch(self) -> None:
            """A deadline while the client owes a request's headers (h11: the client is IDLE), none once sent."""
            waiting = self.conn.their_state is h11.IDLE and not self.transport.is_closing()
            if not waiting:
                self._unwatch()
            elif self.header_timer is None:
                self.header_timer = self.loop.call_later(timeout_s, self._too_late)

        def send_400_response(self, msg: str) -> None:  # uvicorn's own 400: in the one error shape, JSON
            status, why = self.refusal
            if _unreadable(self, status, why or f"the request could not be read as HTTP/1.1 ({msg.rstrip('.')})"):
                metrics.inc("vitkit_requests_total", endpoint="other", code=str(status))

        def _unwatch(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _too_late(self) -> None:
            self.header_timer = None
            _headers_late(self, late, metrics)

    return Connection


def _headers_late(protocol: Any, late: bytes, metrics: Any) -> None:
    """A connection whose request headers did not come in time: closed, after the 408 ``late`` where it began a
    request (a first one, or a next one begun after our answer); an idle kept-alive connection is closed in
    silence, as uvicorn closes it (a 408 there could be read as the answer to the client's next request)."""
    import h11

    if protocol.conn.their_state is h11.IDLE and not protocol.transport.is_closing():
        cycle = protocol.cycle
        if cycle is None or (cycle.response_complete and protocol.conn.trailing_data[0]):
            protocol.transport.write(late)
            metrics.inc("vitkit_requests_total", endpoint="other", code="408")
        protocol.transport.close()


def _read_events(protocol: Any, read):
    """h11's ``next_event`` for ``protocol``'s connection, its status for a request it cannot read kept (431 headers
    too large, 501 a transfer coding: uvicorn answered 400 to all), and headers past :data:`MAX_HEADER_BYTES`
    refused (h11 counts them only while they arrive)."""
    import h11

    def next_event():
        try:
            event = read()
        except h11.RemoteProtocolError as e:
            protocol.refusal = (e.error_status_hint, "")
            raise
        if isinstance(event, h11.Request) and _header_bytes(event) > MAX_HEADER_BYTES:
            protocol.refusal = (431, f"its request line and headers are over {MAX_HEADER_BYTES:,} bytes, the most "
                                     f"this server reads")
            raise h11.RemoteProtocolError("request headers too large", 431)
        return event
    return next_event


def _half_closed(protocol: Any) -> Optional[bool]:
    """A client that half-closes once its whole request is sent (``shutdown(SHUT_WR)``: netcat, some scripts) gets its
    answer, and every whole request it pipelined before, then the close (:func:`_after_answer`; asyncio: True keeps
    the transport open for writing); uvicorn closed at once and the answer was dropped. A request not yet whole, or
    none, is closed as before."""
    import h11

    cycle = protocol.cycle
    if cycle is not None and not cycle.response_complete and protocol.conn.their_state is h11.DONE:
        protocol.half_closed = True
        return True
    return None


def _at_eof(protocol: Any) -> Optional[bool]:
    """The end of the client's input: a body cut short gets its 400 (counted in ``/metrics``), a whole request its
    answer (:func:`_half_closed`)."""
    if _body_cut_short(protocol):
        protocol.counted.inc("vitkit_requests_total", endpoint="other", code="400")
        return None
    return _half_closed(protocol)


def _body_cut_short(protocol: Any) -> bool:
    """A client that half-closes while the body its Content-Length promised is still owed gets a 400 that says so,
    then the close (it was closed without a word: a script with a wrong length read nothing). Returns whether it was
    that; the handler waiting for the body is told the client left, as on any close."""
    import h11

    cycle = protocol.cycle
    if cycle is None or cycle.response_started or protocol.conn.their_state is not h11.SEND_BODY:
        return False
    return _unreadable(protocol, 400, "the request's body ended before the bytes its Content-Length promised (the "
                                      "client closed its sending side)")


def _after_answer(protocol: Any) -> None:
    """uvicorn's end of an answer (the next pipelined request started), then, for a client that half-closed, the
    close once no request is left: nothing more can come."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    H11Protocol.on_response_complete(protocol)
    if protocol.half_closed and protocol.conn.their_state is h11.IDLE and not protocol.transport.is_closing():
        protocol.transport.close()


def _late_answer(timeout_s: float) -> bytes:
    """The 408 a connection gets whose request headers did not arrive in time (no app answers it)."""
    body = json.dumps({"error": f"the request's headers did not arrive within {timeout_s:g} s"}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class _Lingering:
    """A connection's transport whose ``close()``, while the client is still sending a body, ends our side (FIN after
    the answer) and reads for up to :data:`LINGER_S` and :data:`LINGER_BYTES` before it closes (at once where
    :data:`LINGER_CONNECTIONS` already linger: ``lingering_now``, the server's count); every other call is the
    transport's."""

    def __init__(self, transport: Any, protocol: Any, lingering_now: List[int]) -> None:
        self._transport, self._protocol, self._now = transport, protocol, lingering_now
        self.lingering, self._drained, self._until = False, 0, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:  # (uvicorn writes nothing more once it is)
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        import h11

        transport, protocol = self._transport, self._protocol
        if self.lingering or transport.is_closing() or protocol.conn.their_state is not h11.SEND_BODY \
                or not transport.can_write_eof() or self._now[0] >= LINGER_CONNECTIONS:
            transport.close()
            return
        try:
            transport.write_eof()
        except (OSError, RuntimeError):
            transport.close()
            return
        self.lingering, self._until = True, protocol.loop.time() + LINGER_S
        self._now[0] += 1
        transport.resume_reading()  # (uvicorn pauses reading while a handler has not asked for the body)
        protocol.loop.call_later(LINGER_S, transport.close)

    def drop(self, size: int) -> None:
        """``size`` bytes read while lingering, dropped; past the limits, the close (checked here too: on a loop too
        busy for the timer to be on time, the data still says when)."""
        self._drained += size
        if self._drained > LINGER_BYTES or self._protocol.loop.time() > self._until:
            self._transport.close()

    def ended(self) -> None:
        """The connection is gone: it lingers no more."""
        if self.lingering:
            self.lingering = False
            self._now[0] -= 1


class _InvalidSaidOnce:
    """uvicorn's logger, saying its invalid-request line once per server (with where the rest are counted) and every
    other line as it is."""

    def __init__(self, logger: Any, said: List[bool]) -> None:
        self._logger, self._said = logger, said

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if msg == INVALID_LINE:
            if self._said[0]:
                return
            self._said[0] = True
            msg = ("Invalid HTTP request received: answered in JSON (400; 431 headers too large; 501 a transfer "
                   "coding it does not read); the next ones are counted in /metrics (vitkit_requests_total, "
                   "endpoint other), not logged")
        self._logger.warning(msg, *args, **kwargs)


def _header_bytes(request: Any) -> int:
    """The bytes of an h11 request's line and headers as they came (within a few: separators)."""
    return len(request.method) + len(request.target) + 12 + sum(len(k) + len(v) + 4 for k, v in request.headers)


def _unreadable(protocol: Any, status: int, error: str) -> bool:
    """uvicorn's answer to a request h11 cannot read (a bad Content-Length, a line that is no request line) as
    JSON, as every other answer (it was plain text), with h11's status for it; nothing where an answer of ours
    already began. Returns whether it was sent."""
    import http

    import h11

    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
               (b"content-length", str(len(body)).encode())]  # (not chunked where h11 read the request line)
    reason = http.HTTPStatus(status).phrase.encode()
    try:
        for event in (h11.Response(status_code=status, headers=headers, reason=reason), h11.Data(data=body),
                      h11.EndOfMessage()):
            protocol.transport.write(protocol.conn.send(event))
    except h11.LocalProtocolError:  # (a 413 sent before a torn body)
        return False
    finally:
        protocol.transport.close()
    return True
