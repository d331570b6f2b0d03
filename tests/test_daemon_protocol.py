"""The wire schema and framing helpers in protocol.py, without a daemon."""

import msgpack
import pytest

from completiond.service import protocol as P


def test_complete_defaults_and_bounds_live_in_the_schema():
    p = P.Complete.parse({"uri": "u", "position": {"line": 1, "character": 2}})
    assert (p.max_tokens, p.multiline, p.temperature, p.top_p, p.top_k, p.mode) == (64, True, 0.0, 1.0, 0, None)
    assert P.Complete.parse({"uri": "u", "position": {"line": 0, "character": 0}, "top_k": 5, "max_tokens": 2048}
                            ).top_k == 5
    for bad, words in (({"max_tokens": 2049}, "'max_tokens' out of range: 2049 (1..2048)"),
                       ({"mode": "fast"}, "ar / pld / draft / combined"),
                       ({"top_p": 0}, "0 < top_p <= 1"),
                       ({"position": {"line": 0}}, "missing param 'position.character'"),
                       ({"multiline": 1}, "'multiline' must be bool")):
        with pytest.raises(P.RpcError) as e:
            P.Complete.parse({"uri": "u", "position": {"line": 0, "character": 0}, **bad})
        assert e.value.code == P.INVALID_PARAMS and words in e.value.message


def test_params_round_trip_through_the_wire():
    req = P.Rewrite(uri="file:///a.py", range=P.Range(P.Position(0, 0), P.Position(2, 1)), instruction="tidy")
    wire = req.to_wire()
    assert "max_tokens" not in wire and wire["range"]["end"] == {"line": 2, "character": 1}
    assert P.Rewrite.parse(msgpack.unpackb(P.pack(wire))) == req
    init = P.Initialize(client="x", workspace_roots=("/w",))
    assert P.Initialize.parse(init.to_wire()).workspace_roots == ["/w"]


def test_a_huge_document_is_refused_without_echoing_it():
    with pytest.raises(P.RpcError) as e:
        P.DocumentOpen.parse({"uri": "u", "text": "x" * (P.MAX_DOCUMENT_CHARS + 1)})
    assert len(e.value.message) < 200 and "characters" in e.value.message


def test_lone_surrogates_are_sent_as_replacement_characters_of_the_same_length():
    text = "a\ud800b\udfffc"
    back = msgpack.unpackb(P.pack({"text": text}))["text"]
    assert back == "a\ufffdb\ufffdc" and len(back) == len(text)


def test_invalid_utf8_is_found_at_any_depth_without_recursion():
    deep = "x\udcff"
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = [deep]
    assert "invalid byte" in P.invalid_utf8({"a": deep})
    assert P.invalid_utf8({"text": "é😀", "n": [1, {"k": "v"}]}) is None
    with pytest.raises(P.RpcError) as e:
        P.parse_frame([0, 1, "document/open", {"uri": "u", "text": "ab\udcffc"}])
    assert e.value.code == P.INVALID_PARAMS and "'text'" in e.value.message and "character 2" in e.value.message


def test_completion_result_from_the_wire_ignores_unknown_keys():
    wire = P.Completion.superseded("pld").to_wire()
    assert wire["cancelled"] is True and wire["text"] == ""
    assert P.Completion.from_wire({**wire, "new_field": 1}) == P.Completion.superseded("pld")
