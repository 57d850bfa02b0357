"""HPACK: the relay's decoder keeps pace with real encoders; what it injects decodes without touching tables."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtimeproxy import h2frames as h2
from runtimeproxy.hpack_codec import HeaderDecoder, encode_unindexed, percent_encode

names_st = st.sampled_from([b":path", b"grpc-timeout", b"content-type", b"x-custom", b"grpc-status", b"te"])
values_st = st.binary(min_size=0, max_size=40).map(lambda b: bytes(c % 94 + 33 for c in b))


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(st.lists(st.tuples(names_st, values_st), min_size=1, max_size=8), min_size=1, max_size=20),
       huffman=st.booleans(), table_size=st.sampled_from([0, 256, 4096]))
def test_decoder_follows_a_real_encoder_block_after_block(
    blocks: list[list[tuple[bytes, bytes]]], huffman: bool, table_size: int
) -> None:
    encoder = hpack.Encoder()
    encoder.header_table_size = table_size
    decoder = HeaderDecoder()
    for headers in blocks:
        assert decoder.decode(encoder.encode(headers, huffman=huffman)) == headers


def test_a_repeated_block_follows_the_table_when_an_index_changes_meaning() -> None:
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    decoder.decode(encoder.encode([(b"x-a", b"1")]))
    newest = encoder.encode([(b"x-a", b"1")])  # one byte: dynamic index 62
    assert decoder.decode(newest) == [(b"x-a", b"1")]
    assert decoder.decode(newest) == [(b"x-a", b"1")]
    decoder.decode(encoder.encode([(b"x-b", b"2")]))
    assert encoder.encode([(b"x-b", b"2")]) == newest
    assert decoder.decode(newest) == [(b"x-b", b"2")]


def test_injected_blocks_leave_the_peers_table_as_it_was() -> None:
    encoder, peer = hpack.Encoder(), hpack.Decoder()
    peer.decode(encoder.encode([(b"grpc-status", b"0"), (b"x-a", b"1")]))
    injected = encode_unindexed([(b":status", b"200"), (b"grpc-status", b"14"), (b"grpc-message", b"hook down")])
    assert peer.decode(injected, raw=True) == [(b":status", b"200"), (b"grpc-status", b"14"), (b"grpc-message", b"hook down")]
    # the real encoder's next block, which refers to its dynamic table, still decodes
    assert peer.decode(encoder.encode([(b"x-a", b"1"), (b"grpc-status", b"0")]), raw=True) == [
        (b"x-a", b"1"), (b"grpc-status", b"0")]


def test_long_values_use_multi_byte_lengths() -> None:
    value = b"x" * 1000
    assert hpack.Decoder().decode(encode_unindexed([(b"grpc-message", value)]), raw=True) == [(b"grpc-message", value)]


def test_grpc_message_is_percent_encoded() -> None:
    assert percent_encode("100% \u201cok\u201d\n") == b"100%25 %E2%80%9Cok%E2%80%9D%0A"


def test_window_updates_split_increments_above_the_protocol_maximum() -> None:
    out = h2.window_updates(0, 2**31 + 5)
    assert len(out) == 26
    assert int.from_bytes(out[9:13], "big") == 2**31 - 1
    assert int.from_bytes(out[22:26], "big") == 6


def test_header_block_fragment_strips_padding_and_priority() -> None:
    payload = bytes([2]) + b"\x00\x00\x00\x01\x10" + b"BLOCK" + b"\x00\x00"
    assert bytes(h2.header_block_fragment(h2.PADDED | h2.PRIORITY_FLAG, payload)) == b"BLOCK"
