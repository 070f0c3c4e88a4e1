"""The compiled JSON Lines pass: pyarrow's table whenever it answers, and it answers for what collectors write."""
import io
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pajson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from prism.ingest.formats import jsonl as readers  # where the JSON Lines reader looks read_flow_lines up
from prism.ingest.jsonlines import SCHEMA, read_flow_lines
from prism.ingest.messages import decode_messages, encode_jsonl
from prism.ingest.readers import FlowReader
from prism.ingest.records import RejectCounter

SETTINGS = settings(max_examples=int(os.environ.get("PRISM_HYPOTHESIS_EXAMPLES", 60)) * 4, deadline=None)

KEYS = [f.name for f in SCHEMA]
TEXT_KEYS = [f.name for f in SCHEMA if pa.types.is_string(f.type)]
INT_KEYS = [k for k in KEYS if k not in TEXT_KEYS]

PLAIN_INTS = st.sampled_from(["0", "-0", "7", "-12", "9223372036854775807", "-9223372036854775807", "1767225600000328107"]) | st.integers(
    -(2**63) + 1, 2**63 - 1).map(str)
PLAIN_TEXTS = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"\\'), max_size=12).map(lambda t: f'"{t}"')
# values outside the plain form (pyarrow's to parse, or to refuse); "\udcff" is the byte 0xff, not UTF-8
ODD_VALUES = st.sampled_from([
    "9223372036854775808", "-9223372036854775808", "123456789012345678901", "01", "-", "1.5", "1e3", "2E2", "+1",
    '"a\\"b"', '"caf\\u00e9"', '"caf\u00e9"', '"caf\udcff"', '"tab\there"', "true", "false", "{}", "[1]", '{"a":1}', "nul", "NaN", '"', "",
])
BLANKS = st.sampled_from(["", " ", "\t", "  \t"])


@st.composite
def objects(draw, odd: bool):
    """One JSON object's text: schema keys (and others) in any order, values plain (or, with ``odd``, sometimes not)."""
    keys = draw(st.lists(st.sampled_from(KEYS + ["other", "x", "start"]), unique=not odd, max_size=10))
    parts = []
    for k in keys:
        if k in TEXT_KEYS:
            value = draw(PLAIN_TEXTS | st.just("null"))
        elif k in INT_KEYS:
            value = draw(PLAIN_INTS | st.just("null"))
        else:
            value = draw(PLAIN_TEXTS | PLAIN_INTS | st.just("null"))
        if odd and draw(st.integers(0, 4)) == 0:
            value = draw(ODD_VALUES | PLAIN_TEXTS | PLAIN_INTS)  # perhaps text for a number, or a number for text
        ws = [draw(BLANKS) for _ in range(3)]
        parts.append(f'{ws[0]}"{k}"{ws[1]}:{ws[2]}{value}')
    sep = draw(BLANKS)
    text = "{" + f",{sep}".join(parts) + draw(BLANKS) + "}"
    if odd and draw(st.integers(0, 6)) == 0:
        text = draw(st.sampled_from([text + "x", text[:-1], text + text, "[" + text + "]", "not json", text.replace(":", "", 1), "\u00e9" + text]))
    return draw(BLANKS) + text + draw(st.sampled_from(["", " ", "\r"]))


def blocks(odd: bool):
    lines = st.lists(objects(odd) | (st.sampled_from(["", "  ", "\r", "\t"]) if odd else objects(False)), min_size=1, max_size=8)
    return st.tuples(lines, st.booleans()).map(lambda t: "\n".join(t[0]) + ("\n" if t[1] else ""))


def pyarrows(text: str):
    """(table, each row's line or None) as the reader has pyarrow parse the block; None if pyarrow refuses it."""
    lines = text.split("\n")
    if text.endswith("\n"):
        lines = lines[:-1]
    kept = [i for i, line in enumerate(lines) if line.strip()]
    if not kept:
        return None
    clean = "\n".join(lines[i] for i in kept) + "\n"
    try:
        t = pajson.read_json(io.BytesIO(clean.encode("utf-8", "surrogateescape")), parse_options=pajson.ParseOptions(explicit_schema=SCHEMA, unexpected_field_behavior="ignore"))
        t.validate(full=True)
    except pa.ArrowInvalid:
        return None
    if t.num_rows != len(kept):
        return None
    return t, (None if len(kept) == len(lines) else np.array(kept))


def nlines(block: bytes) -> int:
    return block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


@SETTINGS
@given(text=blocks(odd=True))
# each edge of the plain form, tried every run
@example(text='{"src":"caf\udcff"}\n')  # not UTF-8
@example(text='{"src":"caf\u00e9"}\n')  # UTF-8, not ASCII
@example(text='{"size":1,"size":2}\n')
@example(text='{"size":9223372036854775808}\n{"size":-9223372036854775807}')
@example(text='{"src":5}\n')
@example(text='{"size":"5"}\n')
@example(text='{"size":1.0}\n{"size":1e2}\n')
@example(text='{"src":"a\\u0031"}\n')
@example(text='\n \r\n{"size":1}\r\n\t\n{}\n')
@example(text='{"size":1}\r{"size":2}\n')
@example(text='{"size":1}{"size":2}\n')
@example(text='{"other":{"size":1}}\n')
def test_every_table_it_gives_is_pyarrows(text):
    block = text.encode("utf-8", "surrogateescape")
    got = read_flow_lines(block)
    if got is None:
        return  # the reader asks pyarrow
    want = pyarrows(text)
    assert want is not None, f"pyarrow refuses what the compiled pass read: {text!r}"
    assert got.table.equals(want[0]), (text, got.table.to_pylist(), want[0].to_pylist())
    assert (got.row_lines is None and want[1] is None) or np.array_equal(got.row_lines, want[1])
    assert got.lines == nlines(block)


@SETTINGS
@given(text=blocks(odd=False))
def test_plain_lines_are_always_read(text):
    """What the module docstring calls the plain form never goes to pyarrow: the fast path is not a rare one."""
    block = text.encode()
    got = read_flow_lines(block)
    assert got is not None, text
    want = pyarrows(text)
    assert got.table.equals(want[0]) and got.table.schema == SCHEMA and got.lines == nlines(block)


def test_rows_past_the_first_guess_of_their_number_are_kept():
    """The row arrays start at a guess from the block's size (lines of 64 bytes) and grow: short lines overflow it."""
    block = b"".join(b'{"size":%d}\n' % i for i in range(5000))  # 13-14 bytes a line
    got = read_flow_lines(block)
    assert got.table.column("size").to_pylist() == list(range(5000)) and got.lines == 5000 and got.row_lines is None


def test_what_collectors_write_is_read_by_the_compiled_pass(sample, monkeypatch):
    """A poll of JSON Lines messages decodes without pyarrow's JSON reader, as the same poll did with it."""
    flows = sample.head(3000).copy()
    flows.loc[5, "size"] = -1  # a rejected row: counted the same way
    messages = [(encode_jsonl(flows.iloc[i:i + 500]), [], f"t[0]@{i}") for i in range(0, len(flows), 500)]
    with_pyarrow = RejectCounter()
    monkeypatch.setattr(readers, "read_flow_lines", lambda block: None)
    want = decode_messages(messages, with_pyarrow, "t[0]")
    monkeypatch.undo()

    def refuse(*a, **k):
        raise AssertionError("pyarrow's JSON reader ran")

    monkeypatch.setattr(pajson, "read_json", refuse)
    rejects = RejectCounter()
    got = decode_messages(messages, rejects, "t[0]")
    assert len(got) == 1 and len(got[0]) == len(flows) - 1
    assert "src_qp" not in got[0].columns and "dst_qp" not in got[0].columns  # no message has them: no column of nulls
    pd.testing.assert_frame_equal(got[0], want[0])
    assert rejects.as_dict() == with_pyarrow.as_dict() == {"negative_size": 1}
    assert rejects.examples == with_pyarrow.examples


@pytest.mark.parametrize("chunk_rows", [7, 500])  # blocks of 64 and 80 KB
def test_a_file_reads_the_same_with_or_without_the_compiled_pass(sample, tmp_path, chunk_rows, monkeypatch):
    """Rows, rejects and the lines their examples name, over a file of two or three blocks.

    Blank lines and a bad value in the first block (read by the compiled
    pass), an escaped text in a later one (that block goes to pyarrow).
    """
    lines = sample.head(1000).to_json(orient="records", lines=True).strip().split("\n")
    lines[7] = lines[7].replace('"size":', '"size":-', 1)
    lines[800] = lines[800].replace('"src":"1', '"src":"\\u0031', 1)  # the same address, escaped
    path = tmp_path / "f.jsonl"
    path.write_text("\n" + "".join(line + "\n" + ("\n" if i % 4 == 0 and i < 300 else "") for i, line in enumerate(lines)))

    def read():
        rejects = RejectCounter()
        return pd.concat(list(FlowReader(str(path), rejects=rejects, chunk_rows=chunk_rows)), ignore_index=True), rejects

    real = readers.read_flow_lines
    used = []
    monkeypatch.setattr(readers, "read_flow_lines", lambda block: used.append(real(block) is not None) or real(block))
    got, got_rejects = read()
    assert True in used and False in used
    monkeypatch.setattr(readers, "read_flow_lines", lambda block: None)
    want, want_rejects = read()
    pd.testing.assert_frame_equal(got, want)
    assert got_rejects.as_dict() == want_rejects.as_dict() == {"negative_size": 1}
    assert got_rejects.examples == want_rejects.examples
    assert len(got) == 999 and got["src"].astype(str).tolist() == sample["src"].astype(str).drop(index=7).tolist()[:999]
