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
When the relay has to drop a block that changed the table (a runtime's
answer to a call the proxy already refused), the receiver's table and the
sender's part ways for good; from then on `TableEncoder` re-encodes that
direction's blocks against the table the receiver really has.
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
        #: bumped by every block that changed the table, so a caller can tell whether one did
        self.generation = 0
        # The smallest and the last SETTINGS_HEADER_TABLE_SIZE the receiver acknowledged below the table's
        # size, which the encoder must signal at the start of its next block (RFC 7541 4.2); -1: none owed.
        self._owed_min = -1
        self._owed_last = -1

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
                if headers:
                    raise HPACKError("dynamic table size update after a header field")
                size, pos = _integer(data, pos, 5)
                self._max_size = size
                self._evict()
                self._owed_min = -1
                mutated = True
            else:  # literal without indexing (0x00) or never indexed (0x10)
                header, pos = self._literal(data, pos, 4)
                headers.append(header)
        if mutated:
            self._blocks.clear()
            self.generation += 1
        elif end <= _BLOCK_CACHE_MAX_LEN:
            if len(self._blocks) >= _BLOCK_CACHE_MAX:
                self._blocks.clear()
            self._blocks[data] = headers
        return headers

    def table_size_acked(self, size: int) -> None:
        """The receiver acknowledged a SETTINGS_HEADER_TABLE_SIZE; below the table's size the encoder owes an update."""
        if self._owed_min >= 0:
            self._owed_min = min(self._owed_min, size)
            self._owed_last = size
        elif size < self._max_size:
            self._owed_min = self._owed_last = size

    def take_owed_updates(self) -> list[int]:
        """The size updates a block written in the encoder's place must start with, applied to the table here.

        The receiver rejects a block that does not start with an update it is owed. Evicting now keeps this
        table in step with the receiver's, and with the encoder's once its own update (no larger) arrives.
        """
        if self._owed_min < 0:
            return []
        sizes = [self._owed_min] if self._owed_last == self._owed_min else [self._owed_min, self._owed_last]
        self._owed_min = -1
        for size in sizes:
            self._max_size = size
            self._evict()
        self._blocks.clear()
        self.generation += 1
        return sizes

    def snapshot(self) -> tuple[tuple[Header, ...], int]:
        """The dynamic table (newest entry first) and its maximum size, as they are now."""
        return tuple(self._dynamic), self._max_size

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


def leading_size_updates(block: bytes | bytearray | memoryview) -> list[int]:
    """The dynamic table size updates a block starts with (they may appear nowhere else)."""
    data = bytes(block)
    sizes: list[int] = []
    pos = 0
    while pos < len(data) and data[pos] & 0xE0 == 0x20:
        size, pos = _integer(data, pos, 5)
        sizes.append(size)
    return sizes


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


def encode_size_updates(sizes: list[int]) -> bytes:
    """Dynamic table size updates, to start a header block with."""
    out = bytearray()
    for size in sizes:
        out += _encode_integer(size, 5, 0x20)
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


_STATIC_PAIRS: dict[Header, int] = {}
_STATIC_NAMES: dict[bytes, int] = {}
for _i, (_name, _value) in enumerate(_STATIC, start=1):
    _STATIC_PAIRS.setdefault((_name, _value), _i)
    _STATIC_NAMES.setdefault(_name, _i)


class TableEncoder:
    """Encodes blocks for a receiver whose dynamic table the relay has taken over.

    It starts from the table the receiver holds (a decoder's snapshot), refers
    to what is in it, and never adds to it: literals go out as never-indexed
    (an intermediary must keep a sender's never-indexed fields so, and this
    encoder no longer knows which were). Only the size updates the original
    sender asked for are passed on, before the next block this encoder writes,
    which is where the receiver expects them.
    """

    def __init__(self, entries: tuple[Header, ...], max_size: int) -> None:
        self._entries = list(entries)
        self._max_size = max_size
        self._pending: list[int] = []
        self._pairs: dict[Header, int] = {}
        self._names: dict[bytes, int] = {}
        self._index()

    def resize(self, sizes: list[int]) -> None:
        """Passes on the sender's dynamic table size updates (from a block the receiver will not see)."""
        for size in sizes:
            self._pending.append(size)
            self._max_size = size
        if sizes:
            while self._entries and sum(len(n) + len(v) + _ENTRY_OVERHEAD for n, v in self._entries) > self._max_size:
                self._entries.pop()
            self._index()

    def encode(self, headers: Sequence[Header]) -> bytes:
        out = bytearray()
        for size in self._pending:
            out += _encode_integer(size, 5, 0x20)
        self._pending.clear()
        for name, value in headers:
            index = self._pairs.get((name, value))
            if index is not None:
                out += _encode_integer(index, 7, 0x80)
                continue
            name_index = self._names.get(name, 0)
            out += _encode_integer(name_index, 4, 0x10)
            if not name_index:
                out += _encode_integer(len(name), 7, 0)
                out += name
            out += _encode_integer(len(value), 7, 0)
            out += value
        return bytes(out)

    def _index(self) -> None:
        self._pairs = dict(_STATIC_PAIRS)
        self._names = dict(_STATIC_NAMES)
        for i, (name, value) in enumerate(self._entries, start=_STATIC_LEN + 1):
            self._pairs.setdefault((name, value), i)
            self._names.setdefault(name, i)
