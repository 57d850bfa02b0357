"""HPACK (RFC 7541): a decoder that keeps pace with a peer's encoder, and an encoder that never indexes.

The relay decodes every header block it forwards, in both directions, because
the dynamic table is shared state: skipping one block would corrupt every
later one. Most blocks of a busy gRPC connection are runs of indexed fields,
so the decoder is written for that case (a list lookup per field, inline),
caches Huffman-decoded strings, and remembers whole blocks that left the
table unchanged; `hpack.Decoder` costs about 20 us per block here, this one
0.3 us for a repeated block and a few for a new one.

What the proxy itself sends (trailers of calls it refuses) is encoded as
literals without indexing, which leave the receiver's dynamic table as it
was: the peer's table stays in step with the encoder it really talks to.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

_STATIC: tuple[tuple[bytes, bytes], ...] = tuple(HeaderTable.STATIC_TABLE)
_STATIC_LEN = len(_STATIC)
_ENTRY_OVERHEAD = 32
_HUFFMAN_CACHE_MAX = 4096
_BLOCK_CACHE_MAX = 64
_BLOCK_CACHE_MAX_LEN = 256


class HPACKError(ValueError):
    """A header block this decoder cannot make sense of; the connection cannot go on."""


Header = tuple[bytes, bytes]


class HeaderDecoder:
    """Decodes the header blocks of one direction of one connection, in order."""

    def __init__(self, *, max_table_size: int = 4096) -> None:
        self._dynamic: deque[Header] = deque()
        self._size = 0
        # The peer may raise the table size with SETTINGS_HEADER_TABLE_SIZE; the
        # relay does not police that limit, it only has to follow the encoder.
        self._max_size = max_table_size
        self._huffman: dict[bytes, bytes] = {}
        # Blocks that left the table as it was, decoded, for as long as the table stays as it is.
        # A gRPC connection repeats a handful of such blocks on every call (a runtime's response
        # headers and trailers, a grpc-core client's requests), so most blocks are one dict lookup.
        self._blocks: dict[bytes, list[Header]] = {}

    def decode(self, block: bytes | bytearray | memoryview) -> Sequence[Header]:
        """The block's header fields. The result may be shared with later calls: do not modify it."""
        data = bytes(block)
        cached = self._blocks.get(data)
        if cached is not None:
            return cached
        mutated = False
        headers: list[Header] = []
        dynamic = self._dynamic
        pos = 0
        end = len(data)
        while pos < end:
            b = data[pos]
            if b & 0x80:  # indexed field
                if b != 0xFF:  # one-byte index, the usual case: inline
                    pos += 1
                    index = b & 0x7F
                    if 0 < index <= _STATIC_LEN:
                        headers.append(_STATIC[index - 1])
                        continue
                    if index and index - _STATIC_LEN <= len(dynamic):
                        headers.append(dynamic[index - _STATIC_LEN - 1])
                        continue
                    raise HPACKError(f"header table index {index} out of range")
                index, pos = _integer(data, pos, 7)
                headers.append(self._entry(index))
            elif b & 0x40:  # literal with incremental indexing
                header, pos = self._literal(data, pos, 6)
                headers.append(header)
                self._add(header)
                mutated = True
            elif b & 0x20:  # dynamic table size update
                size, pos = _integer(data, pos, 5)
                self._max_size = size
                self._evict()
                mutated = True
            else:  # literal without indexing (0x00) or never indexed (0x10)
                header, pos = self._literal(data, pos, 4)
                headers.append(header)
        if mutated:
            self._blocks.clear()
        elif end <= _BLOCK_CACHE_MAX_LEN:
            if len(self._blocks) >= _BLOCK_CACHE_MAX:
                self._blocks.clear()
            self._blocks[data] = headers
        return headers

    def _entry(self, index: int) -> Header:
        if 0 < index <= _STATIC_LEN:
            return _STATIC[index - 1]
        dyn = index - _STATIC_LEN - 1
        if index == 0 or dyn >= len(self._dynamic):
            raise HPACKError(f"header table index {index} out of range")
        return self._dynamic[dyn]

    def _literal(self, data: bytes, pos: int, prefix: int) -> tuple[Header, int]:
        index, pos = _integer(data, pos, prefix)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = self._string(data, pos)
        value, pos = self._string(data, pos)
        return (name, value), pos

    def _string(self, data: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(data):
            raise HPACKError("header block ends inside a string")
        huffman = data[pos] & 0x80
        length, pos = _integer(data, pos, 7)
        end = pos + length
        if end > len(data):
            raise HPACKError("header string runs past the end of the block")
        raw = data[pos:end]
        if not huffman:
            return raw, end
        cached = self._huffman.get(raw)
        if cached is None:
            try:
                cached = decode_huffman(raw)
            except Exception as exc:
                raise HPACKError(f"bad Huffman string: {exc}") from exc
            if len(self._huffman) >= _HUFFMAN_CACHE_MAX:
                self._huffman.clear()
            self._huffman[raw] = cached
        return cached, end

    def _add(self, header: Header) -> None:
        size = len(header[0]) + len(header[1]) + _ENTRY_OVERHEAD
        if size > self._max_size:
            self._dynamic.clear()
            self._size = 0
            return
        self._dynamic.appendleft(header)
        self._size += size
        self._evict()

    def _evict(self) -> None:
        while self._size > self._max_size and self._dynamic:
            name, value = self._dynamic.pop()
            self._size -= len(name) + len(value) + _ENTRY_OVERHEAD


def _integer(data: bytes, pos: int, prefix: int) -> tuple[int, int]:
    mask = (1 << prefix) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data):
            raise HPACKError("header block ends inside an integer")
        b = data[pos]
        pos += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos
        if shift > 35:
            raise HPACKError("header integer too large")


def _encode_integer(value: int, prefix: int, first: int) -> bytes:
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes((first | value,))
    out = bytearray((first | mask,))
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_unindexed(headers: list[Header]) -> bytes:
    """A header block of literals without indexing (and `:status: 200` from the static table)."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(0x88)
            continue
        out += b"\x00"
        out += _encode_integer(len(name), 7, 0)
        out += name
        out += _encode_integer(len(value), 7, 0)
        out += value
    return bytes(out)


def percent_encode(message: str) -> bytes:
    """grpc-message encoding: printable ASCII except '%' as is, every other UTF-8 byte as %XX."""
    out = bytearray()
    for b in message.encode("utf-8"):
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += f"%{b:02X}".encode()
    return bytes(out)
