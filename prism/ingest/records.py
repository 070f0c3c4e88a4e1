"""Flow records: the canonical input schema, and vectorised validation.

A flow record is one RDMA message seen on the network::

    start_ns     int64   flow start, ns since the Unix epoch
    duration_ns  int64
    src, dst     str     GPU NIC addresses (IPv4 or IPv6)
    size         int64   bytes
    switches     str     switch names on the path, in order, joined with "|"
    src_qp, dst_qp       optional queue-pair numbers

Every reader hands raw chunks to :func:`validate_flows`, which returns the
rows that are well formed with canonical dtypes and counts the others in a
:class:`RejectCounter` by reason. Nothing is dropped without being counted.
"""
from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass, field

import numba
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "FLOW_COLUMNS",
    "REQUIRED_COLUMNS",
    "OPTIONAL_COLUMNS",
    "REJECT_REASONS",
    "MAX_START_NS",
    "MAX_DURATION_NS",
    "MAX_SIZE",
    "FlowFormatError",
    "RejectCounter",
    "validate_flows",
    "normalise_address",
    "empty_flows",
    "bytes_type",
]

REQUIRED_COLUMNS = ("start_ns", "duration_ns", "src", "dst", "size", "switches")
OPTIONAL_COLUMNS = ("src_qp", "dst_qp")
FLOW_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
INT_COLUMNS = ("start_ns", "duration_ns", "size")

#: Reasons a row is rejected, in the order they are checked: a row is counted
#: once, under the first reason that applies.
REJECT_REASONS = (
    "malformed_row",  # CSV row with the wrong field count, JSON line that is not an object
    "bad_number",  # start_ns/duration_ns/size/qp missing or not an integer
    "negative_start",
    "negative_duration",
    "negative_size",
    "out_of_range",  # start_ns after 2100, duration_ns over a day, size over 1 TiB: no physical flow (and end = start + duration would overflow)
    "empty_address",  # src or dst missing or empty
    "bad_address",  # src or dst is not an IPv4/IPv6 address
    "bad_switches",  # switches is neither text nor a list of names
    # whole Kafka messages (counted once each: their rows cannot be told apart)
    "malformed_message",  # empty, or not decodable in its format (e.g. a corrupt Arrow stream)
    "oversized_message",  # larger than the daemon's --kafka.max-message-bytes
    "malformed_file",  # a dump file unreadable from some point on (truncated, corrupt, wrong types); its rest is skipped
)

# An int64 written as text: optional sign, digits, optionally ".0" (pandas
# writes integral columns that held a NaN as floats). 19 digits starting with
# 9 may overflow int64, so those are checked separately.
_INT_RE = r"^[+-]?[0-9]{1,19}(\.0*)?$"
_MAX_EXAMPLES = 5

# Physical bounds of a flow record; past them a value is garbage (a counter read as a time, a
# sentinel such as int64 max) and would overflow later arithmetic (end = start + duration, sums of
# sizes per window). They are far from any real flow: a capture is after 1970 and before 2100, one
# RDMA message is at most 2 GiB (2**31 bytes) and takes well under a second on a 100 Gb/s link.
#: a start after 2100-01-01T00:00:00Z is out of range
MAX_START_NS = 4_102_444_800 * 10**9
#: a flow longer than a day is out of range
MAX_DURATION_NS = 86_400 * 10**9
#: a flow larger than 1 TiB is out of range
MAX_SIZE = 1 << 40


class FlowFormatError(ValueError):
    """Input that cannot be read at all: missing columns, unknown format."""


@dataclass
class RejectCounter:
    """Counts rejected rows by reason and keeps a few examples of each.

    Examples name the source, the line (or row), the field and the value so
    that a user can find the problem in the file.
    """

    counts: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)

    def add(self, reason: str, n: int = 1, example: str | None = None) -> None:
        if n <= 0:
            return
        self.counts[reason] += n
        if example is not None:
            ex = self.examples.setdefault(reason, [])
            if len(ex) < _MAX_EXAMPLES:
                ex.append(example)

    @property
    def total(self) -> int:
        return int(sum(self.counts.values()))

    def as_dict(self) -> dict:
        return {k: int(v) for k, v in sorted(self.counts.items())}

    def merge(self, other: "RejectCounter") -> None:
        for reason, n in other.counts.items():
            self.counts[reason] += n
        for reason, ex in other.examples.items():
            mine = self.examples.setdefault(reason, [])
            mine.extend(ex[: _MAX_EXAMPLES - len(mine)])


def empty_flows() -> pd.DataFrame:
    """A zero-row flow frame with the canonical dtypes."""
    return pd.DataFrame(
        {
            "start_ns": np.empty(0, np.int64),
            "duration_ns": np.empty(0, np.int64),
            "src": pd.Series([], dtype=object),
            "dst": pd.Series([], dtype=object),
            "size": np.empty(0, np.int64),
            "switches": pd.Series([], dtype=object),
        }
    )


def _valid_text(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A string array with its invalid UTF-8 values made null; and which those were.

    JSON and Arrow input can carry bytes that are not UTF-8 in a string
    column; every later string kernel would raise on them. The check is one
    C pass; the per-value work happens only when some value is invalid.
    """
    try:
        arr.validate(full=True)
        return arr, np.zeros(len(arr), dtype=bool)
    except pa.ArrowInvalid:
        pass
    texts = []
    for v in arr.view(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()).to_pylist():
        try:
            texts.append(None if v is None else v.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(False)
    invalid = np.array([t is False for t in texts], dtype=bool)
    return pa.array([None if t is False else t for t in texts], type=pa.string()), invalid


def bytes_type(t: pa.DataType) -> pa.DataType:
    """``t`` with its text as bytes: the same layout, no UTF-8 to check (a damaged value can still be shown or validated).

    >>> bytes_type(pa.list_(pa.string()))
    ListType(list<item: binary>)
    """
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_list(t):
        return pa.list_(bytes_type(t.value_type))
    if pa.types.is_large_list(t):
        return pa.large_list(bytes_type(t.value_type))
    if pa.types.is_dictionary(t):
        return pa.dictionary(t.index_type, bytes_type(t.value_type), t.ordered)
    return t


def _as_text(arr: pa.Array) -> tuple[pa.Array | None, np.ndarray]:
    """A column as strings (None if its type cannot hold text), and its invalid values."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        arr = arr.view(pa.large_string() if pa.types.is_large_binary(t) else pa.string())
        t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _valid_text(arr)
    return None, np.ones(len(arr), dtype=bool)


def _parse_int(values) -> tuple[np.ndarray, np.ndarray]:
    """Parse a column to int64 exactly; return (values, bad_mask).

    Integers stay as they are, integral floats are accepted, strings are
    matched against an integer pattern and cast in one vectorised call. Going
    through float64 (as ``pd.to_numeric`` does when a value is missing) would
    round nanosecond timestamps, so it is avoided. Values of no numeric or
    text type (lists, structs, booleans) and unsigned values past int64 are
    bad, each row on its own.
    """
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        arr = values
    elif isinstance(values, pd.Series) and values.dtype == object:
        # object column from the JSON fallback: a mix of Python values
        arr = pa.array(values.map(_object_to_text), type=pa.string(), from_pandas=True)
    else:
        arr = pa.array(values, from_pandas=True)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_integer(t):
        if arr.null_count == 0 and t == pa.int64():  # the usual column: its values as they are, no copy
            return arr.to_numpy(zero_copy_only=False), np.zeros(len(arr), dtype=bool)
        bad = arr.is_null().to_numpy(zero_copy_only=False)
        if pa.types.is_unsigned_integer(t) and t.bit_width == 64:
            bad |= pc.fill_null(pc.greater(arr, pa.scalar(2**63 - 1, pa.uint64())), False).to_numpy(zero_copy_only=False)
            arr = pc.if_else(pa.array(bad), pa.scalar(0, t), arr)
        out = pc.fill_null(arr, 0).cast(pa.int64()).to_numpy(zero_copy_only=False)
        return out, bad
    if pa.types.is_floating(t):
        f = arr.to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(f) | (np.floor(f) != f) | (np.abs(f) > 9.2e18)
        out = np.where(bad, 0, f).astype(np.int64)
        return out, bad
    if pa.types.is_decimal(t):
        arr = arr.cast(pa.string())
    arr, invalid = _as_text(arr)
    if arr is None:
        return np.zeros(len(invalid), dtype=np.int64), invalid
    if arr.null_count == 0:
        try:  # clean column: one C cast, no regex
            return arr.cast(pa.int64()).to_numpy(zero_copy_only=False), np.zeros(len(arr), dtype=bool)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # some value is not a plain integer: find which below
    s = pc.utf8_trim_whitespace(arr)
    ok = pc.fill_null(pc.match_substring_regex(s, _INT_RE), False)
    # strip an integral ".000" suffix before casting
    s = pc.replace_substring_regex(s, r"\.0*$", "")
    nineteen = pc.fill_null(pc.greater_equal(pc.utf8_length(pc.replace_substring_regex(s, r"^[+-]", "")), 19), False)
    if pc.any(nineteen).as_py():
        # 19-digit values may overflow int64: compare as text against the bound
        digits = pc.replace_substring_regex(s, r"^[+-]", "")
        over = pc.and_(nineteen, pc.greater(digits, "9223372036854775807"))
        ok = pc.and_(ok, pc.invert(pc.fill_null(over, False)))
    safe = pc.if_else(ok, s, "0")
    out = safe.cast(pa.int64()).to_numpy(zero_copy_only=False)
    bad = pc.invert(ok).to_numpy(zero_copy_only=False) | invalid
    return out, bad


def _object_to_text(v) -> str | None:
    # bools are ints in Python; a JSON true is not a size
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


_NOT_TEXT = "\x00not text"  # stands for a value no address or path can be (a number, list, object, bad UTF-8)


def _address_column(values) -> pd.Series:
    """A column of addresses that is no Arrow array, with values no address can be (lists, objects) as :data:`_NOT_TEXT`."""
    values = pd.Series(values)
    if values.dtype == object and pd.api.types.infer_dtype(values, skipna=True) not in ("string", "empty"):
        # the JSON fallback's Python values: a nested object or list cannot be hashed
        odd = ~values.map(lambda v: v is None or isinstance(v, str)).to_numpy(dtype=bool)
        values = values.where(~odd, _NOT_TEXT)
    return values


_ADDRESS_CACHE: dict[str, str | None] = {}
_ADDRESS_CACHE_MAX = 1 << 20


def normalise_address(text: str) -> str | None:
    """Canonical text form of an IPv4/IPv6 address, or None if it is not one.

    IPv6 has many spellings of one address (``fe80:0::1`` and ``fe80::1``),
    and an IPv4 address may come IPv4-mapped (``::ffff:10.0.0.1``, as a
    dual-stack socket reports it); comparing canonical forms makes the
    topology match regardless.

    >>> normalise_address("::ffff:10.0.0.1"), normalise_address("fe80:0::1"), normalise_address("10.0.0.300")
    ('10.0.0.1', 'fe80::1', None)
    """
    try:
        return _ADDRESS_CACHE[text]
    except KeyError:
        pass
    try:
        ip = ipaddress.ip_address(str(text).strip())
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        out = ip.compressed
    except ValueError:
        out = None
    if len(_ADDRESS_CACHE) < _ADDRESS_CACHE_MAX:
        _ADDRESS_CACHE[text] = out
    return out


def _address_codes(values) -> tuple[np.ndarray, list]:
    """(codes, distinct raw values as text) of an address column that is no dictionary of text; -1 codes are missing values.

    (A dictionary of text is :class:`_AddressDictionary`'s.) An Arrow column
    is dictionary-encoded by Arrow's hash table, in C on the text's bytes:
    a pandas factorisation would first make a Python string of every row.
    Values no address can be (a number, invalid UTF-8) are coded as
    :data:`_NOT_TEXT`.
    """
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        text, invalid = _as_text(arr)
        if text is None:  # a type no address can have: every present value is bad
            return np.where(arr.is_null().to_numpy(zero_copy_only=False), -1, 0), [_NOT_TEXT]
        encoded = pc.dictionary_encode(text)
        uniq = encoded.dictionary.to_pylist()
        codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        if invalid.any():  # made null by _valid_text: bad, not missing
            codes[invalid] = len(uniq)
            uniq.append(_NOT_TEXT)
        return codes, uniq
    codes, uniques = pd.factorize(_address_column(values), use_na_sentinel=True)
    return codes, pd.Index(uniques).astype(str).tolist()  # a list: iterating an Arrow-backed Index goes element by element


def _normalise_addresses(values) -> tuple[pd.Categorical, np.ndarray, np.ndarray]:
    """Factorise a column of addresses and normalise each distinct value once.

    Returns (categorical of canonical addresses, empty_mask, bad_mask).
    The per-value Python work is over distinct addresses (a cluster has
    thousands), never over rows; a dictionary-encoded column (Parquet's)
    whose dictionary the previous chunk had too reuses that work.
    """
    if isinstance(values, (pa.Array, pa.ChunkedArray)) and pa.types.is_dictionary(values.type):
        arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values  # unifies the chunks' dictionaries
        table = _AddressDictionary.of(arr.dictionary)
        if table is not None:
            return table.rows(pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64))
    codes, uniq = _address_codes(values)
    return _AddressDictionary(uniq).rows(codes)


class _TextDictionary:
    """What a dictionary of text takes to code rows, built once per Arrow dictionary: a Parquet file's batches share theirs."""

    _recent: list = []  # (Arrow dictionary, its table), newest first; each subclass keeps its own
    _RECENT = 4

    @classmethod
    def of(cls, dictionary: pa.Array):
        """The table of an Arrow dictionary of text (the previous one's when equal); None if it cannot hold text."""
        recent = cls._recent  # read once, replaced whole: decoding threads never see it change under them
        for i, (seen, table) in enumerate(recent):
            if seen is dictionary or (seen.type == dictionary.type and seen.equals(dictionary)):
                if i:
                    cls._recent = [recent[i]] + recent[:i] + recent[i + 1:]
                return table
        text, invalid = _as_text(dictionary)
        if text is None:
            return None
        table = cls._from_text(text, invalid, dictionary)
        cls._recent = [(dictionary, table)] + recent[: cls._RECENT - 1]
        return table

    @classmethod
    def _from_text(cls, text: pa.Array, invalid: np.ndarray, dictionary: pa.Array):
        raise NotImplementedError


class _AddressDictionary(_TextDictionary):
    """Distinct address texts, normalised once: the categorical, empty and bad masks of rows given as codes into them."""

    _recent: list = []  # src's and dst's dictionaries

    def __init__(self, uniq: list, missing: np.ndarray | None = None):
        stripped = [u.strip() for u in uniq]
        canon = [normalise_address(u) if u else None for u in stripped]
        self.empty = np.array([not u for u in stripped], dtype=bool)
        self.bad = np.array([c is None for c in canon], dtype=bool) & ~self.empty
        # a missing entry (a null in a dictionary): no category of its own
        self.missing = np.zeros(len(uniq), dtype=bool) if missing is None else missing
        # canonical categories (two spellings may collapse to one), sorted as np.unique sorts them
        cats, self.remap = np.unique(np.array([c or "" for c in canon], dtype=object), return_inverse=True)
        self.categories = pd.Index(cats, dtype=object)

    @classmethod
    def _from_text(cls, text: pa.Array, invalid: np.ndarray, dictionary: pa.Array) -> "_AddressDictionary":
        # a null entry is a missing value: its text is never used
        return cls([_NOT_TEXT if bad else (u or "") for u, bad in zip(text.to_pylist(), invalid)], dictionary.is_null().to_numpy(zero_copy_only=False))

    def rows(self, codes: np.ndarray) -> tuple[pd.Categorical, np.ndarray, np.ndarray]:
        """(categorical, empty mask, bad mask) of rows coded into these texts (-1: missing).

        The categories are those the rows use, as a factorisation of the
        decoded column would give them. One compiled pass over the rows
        (two when they use only some of the texts, as a chunk of a Parquet
        file whose dictionary holds every address does).
        """
        cat_codes, empty, bad, used = _code_rows(np.asarray(codes), self.missing, self.empty, self.bad, self.remap, len(self.categories))
        if used.all():
            categories = self.categories
        else:  # only the categories some row has
            _renumber(cat_codes, np.cumsum(used) - 1)
            categories = self.categories[used]
        # codes made here, in range by construction: no validating pass
        return pd.Categorical.from_codes(cat_codes, categories=categories, validate=False), empty, bad


@numba.njit(cache=True, nogil=True)
def _code_rows(codes, missing, empty_of, bad_of, remap, n_categories):  # pragma: no cover - compiled
    """Per row: its category (-1 if missing), whether empty, whether bad; and which categories the rows use."""
    n = len(codes)
    cat = np.empty(n, dtype=np.int64)
    empty = np.empty(n, dtype=np.bool_)
    bad = np.empty(n, dtype=np.bool_)
    used = np.zeros(n_categories, dtype=np.bool_)
    for i in range(n):
        c = codes[i]
        if c < 0 or missing[c]:
            cat[i] = -1
            empty[i] = True
            bad[i] = False
        else:
            k = remap[c]
            cat[i] = k
            used[k] = True
            empty[i] = empty_of[c]
            bad[i] = bad_of[c]
    return cat, empty, bad, used


@numba.njit(cache=True, nogil=True)
def _renumber(cat, new_number):  # pragma: no cover - compiled
    for i in range(len(cat)):
        if cat[i] >= 0:
            cat[i] = new_number[cat[i]]


@numba.njit(cache=True, nogil=True)
def _first_seen(codes, text_id, n_texts):  # pragma: no cover - compiled
    """``pd.factorize`` of ``text_id[codes]`` (a code < 0 takes ``text_id``'s last entry): each row's number in order of first appearance, and the ids so numbered."""
    number = np.full(n_texts, -1, dtype=np.int64)
    order = np.empty(n_texts, dtype=np.int64)
    out = np.empty(len(codes), dtype=np.int64)
    missing = len(text_id) - 1
    m = 0
    for i in range(len(codes)):
        t = text_id[codes[i] if codes[i] >= 0 else missing]
        if number[t] < 0:
            number[t] = m
            order[m] = t
            m += 1
        out[i] = number[t]
    return out, order[:m]


class _PathDictionary(_TextDictionary):
    """Distinct path texts of a dictionary, numbered once: rows given as codes into it become the path column.

    Parquet stores repeated paths as a dictionary and the reader hands them
    over as one: only its entries are checked and converted, never the
    rows. A missing or invalid path is "" (invalid ones are also bad), and
    entries of one text share a number, as the decoded column has them.
    """

    _recent: list = []

    def __init__(self, texts: list, invalid: np.ndarray):
        number: dict[str, int] = {}
        ids = [number.setdefault("" if t is None or bad else t, len(number)) for t, bad in zip(texts, invalid)]
        self.text_id = np.array(ids + [number.setdefault("", len(number))], dtype=np.int64)  # the last: a row with no entry
        self.texts = list(number)
        self.invalid = np.asarray(invalid, dtype=bool)

    @classmethod
    def _from_text(cls, text: pa.Array, invalid: np.ndarray, dictionary: pa.Array) -> "_PathDictionary":
        return cls(text.to_pylist(), invalid)

    def rows(self, codes: np.ndarray) -> tuple[pd.Series, np.ndarray]:
        """(path column, bad mask) of rows coded into this dictionary (-1: missing); categories in order of first appearance."""
        first, order = _first_seen(codes, self.text_id, len(self.texts))
        bad = (codes >= 0) & self.invalid[np.maximum(codes, 0)] if self.invalid.any() else np.zeros(len(codes), dtype=bool)
        # the categories converted as the decoded path converts them (Arrow to pandas; with no rows), so the dtypes match too
        texts = pa.array([self.texts[i] for i in order], pa.string())
        categories = pa.DictionaryArray.from_arrays(pa.array([], pa.int32()), texts).to_pandas().cat.categories
        return pd.Series(pd.Categorical.from_codes(first, categories=categories, validate=False)), bad


def _path_text(v):
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return "|".join(v)
    return _NOT_TEXT


def _switches_column(values) -> tuple[pd.Series, np.ndarray]:
    """The path column as text (a list of names is joined with ``|``), and the rows that are neither."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)) and pa.types.is_dictionary(values.type):
        arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values  # unifies the chunks' dictionaries
        table = _PathDictionary.of(arr.dictionary)
        if table is not None:
            return table.rows(pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False))
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) and (
            pa.types.is_string(arr.type.value_type) or pa.types.is_large_string(arr.type.value_type)
        ):
            arr = pc.binary_join(arr, "|")
        text, invalid = _as_text(arr)
        if text is None:  # a type no path can have: every present value is bad
            return pd.Series([""] * len(arr)), ~arr.is_null().to_numpy(zero_copy_only=False)
        # paths repeat: dictionary-encode in Arrow (one pass in C) rather than three pandas casts
        return pd.Series(pc.dictionary_encode(pc.fill_null(text, "")).to_pandas()), invalid
    values = pd.Series(values)
    # the per-value look only where the column is not plain text (C-level check)
    if values.dtype != object or pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty"):
        return values, np.zeros(len(values), dtype=bool)
    values = values.map(_path_text)
    bad = (values == _NOT_TEXT).to_numpy(dtype=bool)
    return values.where(~bad, None), bad


def validate_flows(
    table: pa.Table | pd.DataFrame,
    rejects: RejectCounter,
    source: str = "<input>",
    first_line: int | None = None,
    line_step: str = "line",
    malformed_rows: np.ndarray | None = None,
    line_numbers: np.ndarray | None = None,
) -> pd.DataFrame:
    """Validate one chunk of raw flow columns; return the good rows.

    Parameters
    ----------
    table : pyarrow.Table or pandas.DataFrame
        Raw columns as read (strings, numbers or a mix). Must contain every
        column of :data:`REQUIRED_COLUMNS`; the caller checks that.
    rejects : RejectCounter
        Updated in place with one count per rejected row.
    source : str
        File name used in examples.
    first_line : int, optional
        Line (or row) number of the chunk's first row, for examples.
    malformed_rows : bool array, optional
        Rows the reader already knows are malformed (rejected first).
    line_numbers : int array, optional
        Line of each row, where rows are not consecutive lines (blank or
        skipped lines in between); overrides ``first_line``.

    Returns
    -------
    pandas.DataFrame
        Columns ``start_ns, duration_ns, src, dst, size, switches`` (and
        ``src_qp, dst_qp`` when present, as nullable Int64); ``src``/``dst``
        are categoricals of canonical addresses, ``switches`` a categorical
        of path strings.

    Notes
    -----
    O(n) vectorised work plus O(distinct addresses) Python work.
    """
    n = table.num_rows if isinstance(table, pa.Table) else len(table)
    names = table.column_names if isinstance(table, pa.Table) else list(table.columns)

    def col(name):
        return table.column(name) if isinstance(table, pa.Table) else table[name]

    reason = np.zeros(n, dtype=np.int8)  # 0 = ok, else 1 + index in REJECT_REASONS
    fields = [""]  # the field each mark() names, by index: an int8 per row, not an object array
    bad_field = np.zeros(n, dtype=np.int8)

    def mark(mask, reason_name, field_name):
        code = REJECT_REASONS.index(reason_name) + 1
        sel = mask & (reason == 0)
        reason[sel] = code
        if field_name not in fields:
            fields.append(field_name)
        bad_field[sel] = fields.index(field_name)

    if malformed_rows is not None:
        mark(np.asarray(malformed_rows, dtype=bool), "malformed_row", "")

    ints = {}
    for name in INT_COLUMNS:
        ints[name], bad = _parse_int(col(name))
        mark(bad, "bad_number", name)
    qps: dict[str, pd.api.extensions.ExtensionArray] = {}
    for name in OPTIONAL_COLUMNS:
        if name in names:
            c = col(name)
            v, bad = _parse_int(c)
            if isinstance(c, (pa.Array, pa.ChunkedArray)):
                missing = c.is_null().to_numpy(zero_copy_only=False)
            else:
                missing = pd.isna(c).to_numpy()
            missing = np.asarray(missing, dtype=bool)
            # an absent qp is fine (optional); a present but unparseable one is not
            mark(bad & ~missing, "bad_number", name)
            qps[name] = pd.array(np.where(missing, 0, v), dtype="Int64")
            qps[name][missing] = pd.NA
    mark(ints["start_ns"] < 0, "negative_start", "start_ns")
    mark(ints["duration_ns"] < 0, "negative_duration", "duration_ns")
    mark(ints["size"] < 0, "negative_size", "size")
    # with these bounds start + duration cannot overflow int64; a row past one is looked for only
    # when the column's maximum is, so valid input pays one reduction a column (no mask made)
    for name, bound in (("start_ns", MAX_START_NS), ("duration_ns", MAX_DURATION_NS), ("size", MAX_SIZE)):
        if len(ints[name]) and ints[name].max() > bound:
            mark(ints[name] > bound, "out_of_range", name)

    addr = {}
    for name in ("src", "dst"):
        cat, empty, badaddr = _normalise_addresses(col(name))
        mark(empty, "empty_address", name)
        mark(badaddr, "bad_address", name)
        addr[name] = cat

    # paths repeat: keep them categorical (missing -> empty path)
    sw, bad_sw = _switches_column(col("switches"))
    mark(bad_sw, "bad_switches", "switches")
    if not isinstance(sw.dtype, pd.CategoricalDtype):
        sw = sw.astype(object).where(pd.notna(sw), "").astype(str).astype("category")
    elif sw.isna().any():
        if "" not in sw.cat.categories:
            sw = sw.cat.add_categories([""])
        sw = sw.fillna("")

    rejected = reason > 0
    if rejected.any():
        codes, counts = np.unique(reason[rejected], return_counts=True)
        for code, cnt in zip(codes, counts):
            rname = REJECT_REASONS[code - 1]
            idx = int(np.flatnonzero(reason == code)[0])
            fname = fields[bad_field[idx]]
            if line_numbers is not None:
                where = f"{source}:{line_step} {int(line_numbers[idx])}"
            elif first_line is not None:
                where = f"{source}:{line_step} {first_line + idx}"
            else:
                where = source
            value = ""
            if fname:
                raw = col(fname)
                v = raw[idx]
                try:
                    v = v.as_py() if hasattr(v, "as_py") else v
                except UnicodeDecodeError:  # the example shows the bytes
                    v = v.cast(bytes_type(v.type)).as_py()
                v = v.item() if isinstance(v, np.generic) else v
                value = f" {fname}={v!r}"
            rejects.add(rname, int(cnt), f"{where}:{value}" if value else where)

    # the frame copies its columns (a dict's default): a mask that keeps every row would copy them twice
    keep = ~rejected if rejected.any() else slice(None)
    out = pd.DataFrame(
        {
            "start_ns": ints["start_ns"][keep],
            "duration_ns": ints["duration_ns"][keep],
            "src": addr["src"][keep],
            "dst": addr["dst"][keep],
            "size": ints["size"][keep],
            "switches": sw.array[keep],
        }
    )
    for name, q in qps.items():
        out[name] = q[keep]
    return out
