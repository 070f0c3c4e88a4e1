"""Property-based tests (hypothesis): whatever a file or message holds, nothing escapes and nothing is lost.

For a flow file: the reader either refuses the whole file with a FlowFormatError
(a header or compression it cannot read) or accounts for every row it read:
``rows_read == kept + rejected``. For a poll's Kafka messages: no exception
escapes, and every record of the untouched messages is kept.
"""
import gzip
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prism.ingest.messages import decode_messages, encode_arrow, encode_jsonl
from prism.ingest.readers import FlowReader
from prism.ingest.records import FlowFormatError, RejectCounter

SETTINGS = settings(max_examples=int(os.environ.get("PRISM_HYPOTHESIS_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def flows(n, offset=0):
    return pd.DataFrame({
        "start_ns": np.arange(offset, offset + n, dtype=np.int64) * 1000 + 1, "duration_ns": 5,
        "src": "10.0.0.1", "dst": "10.0.0.2", "size": 64, "switches": "leaf-a|spine-b",
    })


def csv_bytes(n=40):
    return flows(n).to_csv(index=False).encode()


def mutate(data: bytes, edits) -> bytes:
    """Apply (position fraction, kind, payload) edits: overwrite, insert or delete bytes."""
    b = bytearray(data)
    for frac, kind, payload in edits:
        i = min(int(frac * len(b)), len(b))
        if kind == "overwrite":
            b[i:i + len(payload)] = payload
        elif kind == "insert":
            b[i:i] = payload
        else:
            del b[i:i + len(payload)]
    return bytes(b)


EDITS = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["overwrite", "insert", "delete"]),
                           st.binary(min_size=1, max_size=12) | st.sampled_from([b"\n", b",", b'"', b"\xff\xfe", b"{", b"}", b"\r\n", b"\x00"])),
                 min_size=1, max_size=6)


# pyarrow hands a non-UTF-8 bad row to our handler by decoding it first, and reports the
# UnicodeDecodeError as "unraisable" before failing the block (which the reader then reads line by line)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "csv.gz", "jsonl.gz"])
@SETTINGS
@given(edits=EDITS)
def test_a_mutated_file_is_refused_or_fully_accounted(tmp_path, fmt, edits):
    base = csv_bytes() if fmt.startswith("csv") else encode_jsonl(flows(40))
    data = mutate(base, edits)
    if fmt.endswith(".gz"):
        data = gzip.compress(data)
    path = tmp_path / f"f.{fmt}"
    path.write_bytes(data)
    rejects = RejectCounter()
    reader = FlowReader(str(path), rejects=rejects, chunk_rows=16)
    try:
        kept = sum(len(c) for c in reader)
    except FlowFormatError:
        return  # the whole file refused, with its name: allowed (a header it cannot read)
    assert reader.rows_read == kept + rejects.total


@SETTINGS
@given(edits=EDITS, where=st.integers(0, 7), arrow=st.booleans(), garbage=st.binary(max_size=64))
def test_a_poll_with_a_mutated_message_keeps_its_neighbours(edits, where, arrow, garbage):
    msgs = [((encode_arrow if i % 2 else encode_jsonl)(flows(50, i * 50)), [], f"t[0]@{i}") for i in range(8)]
    value = msgs[where][0]
    bad = mutate(value, edits) if garbage == b"" else garbage
    msgs[where] = (bad, [], f"t[0]@{where}")
    rejects = RejectCounter()
    frames = decode_messages(msgs, rejects, "t[0]@0-7")
    kept = set(np.concatenate([f["start_ns"].to_numpy() for f in frames]).tolist()) if frames else set()
    neighbours = set(pd.concat([flows(50, i * 50) for i in range(8) if i != where])["start_ns"].tolist())
    assert neighbours <= kept
    assert len(kept) <= 400


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=EDITS, fmt=st.sampled_from(["csv", "jsonl", "csv.gz"]))
def test_the_directory_source_never_stalls_and_counts_every_row(tmp_path_factory, edits, fmt):
    """A mutated dump between two good ones: every file is done, nothing raises, and the monitor's
    counts equal what the reader reads: ingested + duplicate == kept, rejected == rows rejected (+1 per bad file)."""
    from prism.ingest.topology import Topology
    from prism.serve.monitor import Monitor, MonitorSettings
    from prism.serve.sources import DirectorySource

    d = tmp_path_factory.mktemp("dir")
    data = mutate(csv_bytes() if fmt.startswith("csv") else encode_jsonl(flows(40)), edits)
    files = {"a.csv": flows(40, 10_000).to_csv(index=False).encode(), f"b.{fmt}": gzip.compress(data) if fmt.endswith(".gz") else data,
             "c.csv": flows(40, 20_000).to_csv(index=False).encode()}
    kept = rejected = 0
    for i, (name, content) in enumerate(files.items()):
        (d / name).write_bytes(content)
        os.utime(d / name, (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order
        rc = RejectCounter()
        try:
            kept += sum(len(c) for c in FlowReader(str(d / name), rejects=rc))
        except FlowFormatError:
            rc.add("malformed_file")
        rejected += rc.total
    topo = Topology.from_frame(pd.DataFrame({"ip": ["10.0.0.1", "10.0.0.2"], "server": ["s0", "s1"]}))
    monitor = Monitor(topo, MonitorSettings(window_s=3, step_s=1, switch_window_s=2, lateness_s=0.1))
    src = DirectorySource(d)
    for _ in range(20):
        src.poll(monitor, timeout_ms=0)
        if len(src.done) == len(files):
            break
    assert len(src.done) == len(files)
    c = monitor.counters_snapshot()["dir"]
    assert c["ingested"] + c["duplicate"] == kept
    assert sum(v for k, v in c.items() if k.startswith("rejected:")) == rejected


@SETTINGS
@given(st.integers(0, 400), st.integers(1, 4), st.booleans(), st.integers(0, 2**32 - 1))
def test_order_by_is_lexsort(n, n_keys, presorted, seed):
    """The counting sort gives exactly np.lexsort's order; unsorted starts and wide keys fall back to it."""
    from prism.common.ordering import order_by

    rng = np.random.default_rng(seed)
    keys = [rng.integers(0 if rng.random() < 0.9 else -3, rng.choice([2, 50, 10**9]), n) for _ in range(n_keys)]
    start = rng.integers(0, 20, n)  # many ties: the order among them must be the input order
    if presorted:
        start = np.sort(start)
    got = order_by(keys, start)
    assert got.tolist() == np.lexsort((start, *reversed(keys))).tolist()


@SETTINGS
@given(st.integers(0, 300), st.integers(1, 5), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_group_rows_is_the_joined_columns_in_key_order(n, n_chunks, n_keys, seed):
    """Chunks scattered by key give the joined columns in order_by's order; one chunk is grouped in place."""
    from prism.common.ordering import group_rows, order_by

    rng = np.random.default_rng(seed)
    key = rng.integers(0, n_keys, n)
    cols = [rng.integers(0, 10**12, n), rng.integers(-5, 5, n).astype(np.int32)]
    want = [c[order_by([key], np.arange(n))] for c in cols]
    cuts = np.sort(rng.integers(0, n + 1, n_chunks - 1))  # empty chunks too
    bounds = list(zip(np.r_[0, cuts], np.r_[cuts, n]))
    chunks = [[c[lo:hi].copy() for c in cols] for lo, hi in bounds]
    got = group_rows(chunks, [key[lo:hi] for lo, hi in bounds], np.bincount(key, minlength=n_keys))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.tolist() == w.tolist()
    if n_chunks > 1:
        assert all(c is None for chunk in chunks for c in chunk)  # consumed as the columns filled
    else:
        assert all(g is c for g, c in zip(got, chunks[0]))  # in place
    with pytest.raises(ValueError, match="do not add up"):
        group_rows([[np.arange(3)]], [np.zeros(3, dtype=np.int64)], np.array([2]))


@SETTINGS
@given(st.integers(0, 300), st.integers(1, 10**6), st.integers(0, 2**32 - 1))
def test_rank_keys_and_stable_order_are_numpys(n, n_keys, seed):
    """rank_keys is np.unique's inverse over the non-negative keys (through a table, or np.unique past its range);
    stable_order is a stable argsort."""
    from prism.common.ordering import rank_keys, stable_order

    rng = np.random.default_rng(seed)
    key = rng.integers(-1, n_keys, n)
    present = np.unique(key[key >= 0])
    rank, got_present = rank_keys(key, n_keys)
    assert got_present.tolist() == present.tolist()
    assert rank.tolist() == np.where(key >= 0, np.searchsorted(present, key), -1).tolist()
    small = rng.integers(0, 5, n)
    assert stable_order(small, 5).tolist() == np.argsort(small, kind="stable").tolist()


@SETTINGS
@given(st.integers(0, 300), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_switch_sums_equal_the_groupby(n, n_chunks, seed):
    """The switch accounting's sums, chunk after chunk through its hash table (grown from two slots), are the
    three-key groupby's over every row, sorted by key; exact past 2**53."""
    from prism.analysis.diagnosis.switches import _KeySums

    rng = np.random.default_rng(seed)
    win, pid, src = rng.integers(5, 8, n), rng.integers(0, 6, n), rng.integers(-1, 4, n)
    nbytes, busy = rng.integers(0, 2**54, n), rng.integers(0, 2**30, n)
    df = pd.DataFrame({"window": win, "path": pid, "pair": src, "bytes": nbytes, "busy_ns": busy})
    ref = df.groupby(["window", "path", "pair"]).agg(bytes=("bytes", "sum"), busy_ns=("busy_ns", "sum"), flows=("bytes", "size")).reset_index()
    sums = _KeySums(capacity=2)
    for lo, hi in zip(*(lambda c: (np.r_[0, c], np.r_[c, n]))(np.sort(rng.integers(0, n + 1, n_chunks - 1)))):
        sums.add(win[lo:hi], pid[lo:hi], src[lo:hi], nbytes[lo:hi], busy[lo:hi])
    pd.testing.assert_frame_equal(sums.table(), ref, check_index_type=False)


@SETTINGS
@given(st.integers(0, 300), st.integers(1, 4), st.integers(0, 2**32 - 1), st.booleans())
def test_switch_bandwidth_sums_the_large_flows_with_a_path(n, n_chunks, seed, senders):
    """SwitchBandwidth.partial_fit, chunk after chunk (its table grown from two slots mid-chunk), sums what a groupby
    of the flows of at least ``min_bytes`` with a path sums, per (window, path, sender, receiver); it counts the smaller ones."""
    from prism.analysis.diagnosis.switches import KEY, SwitchBandwidth, _KeySums

    rng = np.random.default_rng(seed)
    paths = np.array(["l1|s1|l2", "l2|s1|l1", "l1|s2|l3", "l3", None], dtype=object)
    path = paths[rng.integers(0, len(paths), n)]
    size = rng.integers(0, 1 << 20, n)
    start, duration = np.sort(rng.integers(0, 5 * 10**9, n)), rng.integers(0, 10**6, n)
    src = rng.integers(0, 6, n) if senders else None
    dst = rng.integers(0, 6, n) if senders else None
    bw = SwitchBandwidth(window_s=1.0, min_bytes=1 << 19)
    bw._sums = _KeySums(capacity=2)
    for lo, hi in zip(*(lambda c: (np.r_[0, c], np.r_[c, n]))(np.sort(rng.integers(0, n + 1, n_chunks - 1)))):
        bw.partial_fit(start[lo:hi], duration[lo:hi], size[lo:hi], pd.Categorical(path[lo:hi]), src=None if src is None else src[lo:hi],
                       dst=None if dst is None else dst[lo:hi])
    assert bw.skipped_ == int((size < 1 << 19).sum())
    keep = (size >= 1 << 19) & pd.notna(path)
    df = pd.DataFrame({"window": start[keep] // 10**9, "path": [bw.path_ids[p] for p in path[keep]],
                       "src": src[keep] if senders else np.full(int(keep.sum()), -1),
                       "dst": dst[keep] if dst is not None else np.full(int(keep.sum()), -1), "bytes": size[keep], "busy_ns": duration[keep]})
    ref = df.groupby(KEY).agg(bytes=("bytes", "sum"), busy_ns=("busy_ns", "sum"), flows=("bytes", "size")).reset_index()
    pd.testing.assert_frame_equal(bw.table(), ref.astype(np.int64), check_index_type=False)


TEXT_VALUES = [b"10.0.0.1", b"10.0.0.2", b" 10.0.0.2 ", b"::ffff:10.0.0.1", b"fe80:0::1", b"fe80::1", b"", b"nope", b"\xff\xfe", b"a|b", b"leaf1|spine2|leaf3"]


def test_chunks_sharing_a_dictionary_validate_as_their_decoded_values():
    """Parquet hands every batch of a file the same dictionary: the normalised entries are reused, and each chunk
    still gets the categories its own rows use (a chunk that uses fewer entries, or other ones, too)."""
    import pyarrow as pa

    from prism.ingest.records import validate_flows

    dictionary = pa.array(["10.0.0.3", " 10.0.0.1", "10.0.0.2", None, "nope", "::ffff:10.0.0.2", ""])
    for indices in ([0, 1, 2, 5], [2, 2, 5], [3, 4, 6, 0], [1, 0, 1], [0, 1, 2, 3, 4, 5, 6]):  # the same object each time
        n = len(indices)
        enc = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)

        def table(src, n=n):
            return pa.table({"start_ns": pa.array(range(n), pa.int64()), "duration_ns": pa.array([1] * n, pa.int64()), "src": src,
                             "dst": pa.array(["10.0.0.9"] * n), "size": pa.array([1 << 20] * n, pa.int64()), "switches": pa.array(["a"] * n)})

        r_plain, r_enc = RejectCounter(), RejectCounter()
        got_plain = validate_flows(table(enc.dictionary_decode()), r_plain, "t")
        got_enc = validate_flows(table(enc), r_enc, "t")
        assert dict(r_enc.counts) == dict(r_plain.counts) and r_enc.examples == r_plain.examples
        pd.testing.assert_frame_equal(got_enc, got_plain)


@SETTINGS
@given(st.lists(st.sampled_from(TEXT_VALUES + [None]), max_size=40), st.lists(st.sampled_from(TEXT_VALUES + [None]), max_size=6), st.booleans())
def test_dictionary_columns_validate_as_their_decoded_values(values, unused, as_binary):
    """A dictionary-encoded src/dst/switches column (Parquet, CSV) gives what its decoded column gives.

    Dictionaries may hold entries no row uses, nulls, invalid UTF-8 and two
    spellings of one address; the rejects, the rows and the categories
    (addresses sorted, paths in order of first appearance) must not change.
    """
    import pyarrow as pa

    from prism.ingest.records import validate_flows

    n = len(values)
    typ = pa.binary() if as_binary else pa.string()
    # as a string column, invalid UTF-8 is what a JSON or Arrow producer can send
    plain = pa.array(values, type=pa.binary()).view(typ)
    dictionary = pa.array(list(dict.fromkeys(unused + values)), type=pa.binary()).view(typ)  # unused entries first
    lookup = {v: i for i, v in enumerate(dict.fromkeys(unused + values))}
    encoded = pa.DictionaryArray.from_arrays(pa.array([lookup[v] for v in values], type=pa.int32()), dictionary)

    def table(text, src):
        return pa.table({"start_ns": pa.array(range(n), pa.int64()), "duration_ns": pa.array([1] * n, pa.int64()),
                         "src": src if src is not None else text, "dst": pa.array(["10.0.0.9"] * n), "size": pa.array([1 << 20] * n, pa.int64()),
                         "switches": text})

    for src in (None, pa.array(["10.0.0.8"] * n)):  # the column as both, then as the path only (its rejects are then its own)
        r_plain, r_enc = RejectCounter(), RejectCounter()
        got_plain = validate_flows(table(plain, src), r_plain, "t")
        got_enc = validate_flows(table(encoded, src), r_enc, "t")
        assert dict(r_enc.counts) == dict(r_plain.counts)
        assert r_enc.examples == r_plain.examples
        pd.testing.assert_frame_equal(got_enc, got_plain)


@SETTINGS
@given(st.lists(st.sampled_from(TEXT_VALUES + [None]), max_size=40), st.booleans())
def test_arrow_address_columns_validate_as_python_values(values, as_binary):
    """An Arrow address column (coded by Arrow's hash table) gives what the same values as Python objects give.

    The Python path factorises in pandas, independently of Arrow's coding:
    the rejects (empty, bad, invalid UTF-8 as a bad address), the rows and
    the categories must agree.
    """
    import pyarrow as pa

    from prism.ingest.records import validate_flows

    n = len(values)

    def python_value(v):  # what a JSON decoder leaves: text, or the bytes that are not UTF-8
        if v is None:
            return None
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v

    def frame(src):
        return {"start_ns": range(n), "duration_ns": [1] * n, "src": src, "dst": ["10.0.0.9"] * n, "size": [1 << 20] * n, "switches": ["a"] * n}

    arrow = pa.table(frame(pa.array(values, type=pa.binary()).view(pa.binary() if as_binary else pa.string())))
    python = pd.DataFrame(frame(pd.Series([python_value(v) for v in values], dtype=object)))
    r_arrow, r_python = RejectCounter(), RejectCounter()
    got_arrow = validate_flows(arrow, r_arrow, "t")
    got_python = validate_flows(python, r_python, "t")
    assert dict(r_arrow.counts) == dict(r_python.counts)
    pd.testing.assert_frame_equal(got_arrow, got_python)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(0, 4000), st.sampled_from([None, "spine-1", "leaf-2", "srv1"]), st.booleans(),
       st.floats(0.2, 1.0), st.floats(0.3, 0.9))
@example(seed=29360, n=1, slow=None, senders=False, share=1.0, factor=0.5)  # one flow, on a one-switch path: no link at all
def test_switch_diagnosis_equals_the_pandas_reference(seed, n, slow, senders, share, factor):
    """The vectorised switch diagnosis gives the first (pandas) version's tables and anomalies exactly.

    A small leaf-spine fabric over three windows, one switch (or host
    ``srv1``, as sender and receiver: the host-or-link test) slowed to
    ``factor`` for a ``share`` of its flows (near the thresholds and the
    vote's majority, or far from them), or none; thin windows and
    single-switch and empty paths included.
    """
    from reference_switches import ReferenceSwitchDiagnoser

    from prism.analysis.diagnosis.switches import SwitchBandwidth, SwitchDiagnoser

    rng = np.random.default_rng(seed)
    leaves, spines = [f"leaf-{i}" for i in range(4)], [f"spine-{i}" for i in range(3)]
    paths = [f"{a}|{s}|{b}" for a in leaves for b in leaves if a != b for s in spines] + leaves + [""]
    path = np.array(paths, dtype=object)[rng.integers(0, len(paths), n)]
    size = rng.integers(1 << 17, 1 << 24, n)
    rate = rng.normal(40.0, 2.0, n)  # bytes per ns
    src, dst = rng.integers(0, 12, n), rng.integers(0, 12, n)  # NICs, three a server
    if slow:
        on = (src // 3 == 1) | (dst // 3 == 1) if slow == "srv1" else np.array([slow in p.split("|") for p in path], dtype=bool)
        rate[on & (rng.random(n) < share)] *= factor
    duration = (size / rate).astype(np.int64)
    start = np.sort(rng.integers(0, 3 * 10**9, n))
    bw = SwitchBandwidth(window_s=1.0, hosts=[f"srv{i // 3}" for i in range(12)])
    for lo in range(0, n, 700):  # in chunks, as a replay or the daemon adds them
        bw.partial_fit(start[lo:lo + 700], duration[lo:lo + 700], size[lo:lo + 700], path[lo:lo + 700],
                       src[lo:lo + 700] if senders else None, dst[lo:lo + 700] if senders else None)
    settings = dict(min_flows=20, min_sender_flows=3)
    got, ref = SwitchDiagnoser(**settings).fit(bw), ReferenceSwitchDiagnoser(**settings).fit(bw)
    pd.testing.assert_frame_equal(got.bandwidth_, ref.bandwidth_)
    pd.testing.assert_frame_equal(got.anomalies_, ref.anomalies_)
    # every pair of one kind (or none typed, without the NICs): the pooled test, as without kinds
    one = SwitchDiagnoser(**settings).fit(bw, (src, dst, np.full(n, "DP")))
    pd.testing.assert_frame_equal(one.bandwidth_, got.bandwidth_)
    pd.testing.assert_frame_equal(one.anomalies_, got.anomalies_)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 60), st.booleans()), max_size=30), st.integers(0, 2**32 - 1))
def test_the_deduper_is_a_set_with_a_horizon(ops, seed):
    """RecordDeduper answers as a set of hashes whose entries expire with their first start time.

    Batches with repeats inside and across them, hash 0 and 1, runs that
    wrap around the table's end, growth past the table's size, evictions
    that empty it, that shrink it and that delete in place.
    """
    from prism.serve.window import RecordDeduper

    rng = np.random.default_rng(seed)
    d, model = RecordDeduper(), {}
    t = 0
    for size, spread, evict in ops:
        t += 10
        hashes = rng.integers(0, max(4, size // 2), size).astype(np.uint64)  # many repeats
        wrap = rng.random(size) < 0.5  # home slots at the end of a 4096-slot table: runs wrap around to its start
        hashes[wrap] = (hashes[wrap] << np.uint64(12)) | np.uint64(4064) | rng.integers(0, 32, int(wrap.sum())).astype(np.uint64)
        hashes[rng.random(size) < 0.01] = 0
        start = t + rng.integers(0, spread + 1, size)
        got = d.filter(hashes, start)
        want = np.zeros(size, dtype=bool)
        for i, (h, s0) in enumerate(zip(hashes.tolist(), start.tolist())):
            h = h or 1  # 0 marks an empty slot: stored as 1
            if h not in model:
                model[h] = s0
                want[i] = True
        assert got.tolist() == want.tolist()
        if evict:
            before = t - int(rng.integers(0, 40))
            d.evict(before)
            model = {h: s0 for h, s0 in model.items() if s0 >= before}
        assert len(d) == len(model)


def test_the_deduper_stays_within_its_bound():
    from prism.serve.window import RecordDeduper

    d = RecordDeduper(max_records=10_000)
    for k in range(20):
        h = np.arange(k * 5000, (k + 1) * 5000, dtype=np.uint64) + 7
        assert d.filter(h, np.full(5000, k)).all()
        assert len(d) <= 10_000
    # the newest are remembered, the oldest forgotten
    assert not d.filter(np.arange(19 * 5000, 20 * 5000, dtype=np.uint64) + 7, np.full(5000, 20)).any()
    assert d.filter(np.array([7], np.uint64), np.array([21])).all()


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.integers(2, 40))
def test_monitor_pairs_hold_each_pairs_latest_start(seed, batches, nics):
    """The monitor's pair table (updated in place for known pairs, merged for new ones) is a groupby max of every batch
    (and its first starts a groupby min)."""
    from prism.serve.monitor import Monitor

    rng = np.random.default_rng(seed)
    m = Monitor.__new__(Monitor)  # only the pair table is exercised
    m._n = nics
    m._pair_keys, m._pair_last, m._pair_first = (np.empty(0, dtype=np.int64) for _ in range(3))
    seen = []
    for _ in range(batches):
        k = int(rng.integers(0, 300))
        a, b = rng.integers(0, nics, k).astype(np.int32), rng.integers(0, nics, k).astype(np.int32)
        start = rng.integers(0, 1000, k).astype(np.int64)  # out of order, repeats, ties
        m._see_pairs(a, b, start)
        seen.append(pd.DataFrame({"key": np.minimum(a, b).astype(np.int64) * nics + np.maximum(a, b), "start": start}))
        ref = pd.concat(seen).groupby("key")["start"].max()
        assert m._pair_keys.tolist() == ref.index.tolist()
        assert m._pair_last.tolist() == ref.tolist()
        assert m._pair_first.tolist() == pd.concat(seen).groupby("key")["start"].min().tolist()


@SETTINGS
@given(st.lists(st.sampled_from(["10.0.0.1", " 10.0.0.2", "::ffff:10.0.0.1", "fe80:0::1", "fe80::1", "", "nope", None]), min_size=1, max_size=8),
       st.lists(st.integers(-1, 7), max_size=40))
def test_address_rows_are_each_rows_canonical_text(entries, picks):
    """_AddressDictionary.rows against a loop: each row's canonical address (missing -> NaN; empty and bad -> ""),
    its empty and bad marks, and as categories exactly the canonical texts the rows use, sorted."""
    from prism.ingest.records import _AddressDictionary, normalise_address

    missing = np.array([e is None for e in entries])
    table = _AddressDictionary([e or "" for e in entries], missing)
    codes = np.array([p if p < len(entries) else -1 for p in picks], dtype=np.int64)
    got, empty, bad = table.rows(codes)
    want_text, want_empty, want_bad = [], [], []
    for c in codes:
        entry = None if c < 0 else entries[c]
        text = None if entry is None else entry.strip()
        canon = normalise_address(text) if text else None
        want_text.append(None if entry is None else (canon or ""))
        want_empty.append(not text)
        want_bad.append(bool(text) and canon is None)
    assert [None if pd.isna(v) else v for v in got] == want_text
    assert list(got.categories) == sorted({t for t in want_text if t is not None})
    assert empty.tolist() == want_empty and bad.tolist() == want_bad


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.lists(st.sampled_from(["add", "add", "add", "columns", "evict", "keep"]), max_size=12),
       st.integers(5, 200))
def test_flow_window_columns_are_a_stable_sort_of_what_it_holds(seed, ops, max_flows):
    """FlowWindow (batches merged into its sorted columns, evictions, a job's flows forgotten, shedding past
    max_flows) holds what a stable sort by start of every row still in it gives, rows in the order they were added."""
    from prism.serve.window import FlowWindow

    rng = np.random.default_rng(seed)
    w = FlowWindow(max_flows=max_flows)
    rows = np.empty((0, 6), dtype=np.int64)  # a, b, start, duration, size, sequence
    seq = 0
    for op in ops + ["columns"]:
        if op == "add":
            k = int(rng.integers(0, 40))
            start = rng.integers(0, 50, k)  # ties across and within batches, out of order
            batch = np.column_stack([rng.integers(0, 9, k), rng.integers(0, 9, k), start, rng.integers(0, 99, k), rng.integers(0, 99, k), np.arange(seq, seq + k)])
            seq += k
            w.add(*(batch[:, i] for i in range(5)))
            rows = rows[np.argsort(rows[:, 2], kind="stable")]
            rows = np.vstack([rows, batch])
            if len(rows) > max_flows:
                rows = rows[np.lexsort((rows[:, 5], rows[:, 2]))][len(rows) - int(max_flows * 0.9):]
        elif op == "evict":
            before = int(rng.integers(0, 50))
            assert w.evict(before) == int((rows[:, 2] < before).sum())
            rows = rows[rows[:, 2] >= before]
        elif op == "keep":
            rows = rows[np.lexsort((rows[:, 5], rows[:, 2]))]
            mask = rng.random(len(rows)) < 0.7
            assert w.keep(mask) == int((~mask).sum())
            rows = rows[mask]
        else:
            want = rows[np.lexsort((rows[:, 5], rows[:, 2]))]
            got = w.columns()
            assert [c.tolist() for c in got] == [want[:, i].tolist() for i in range(5)]
            assert len(w) == len(want)


def ring_collectives(rng, n_servers, nics_per, n_coll, order, mixed):
    """Random DP traffic for the arrival diagnosis: two jobs' rings, collective after collective, on a coarse clock.

    Each NIC sends a few flows to its ring successor per collective, from its
    server's arrival (or, over a rendezvous, both ends'): late servers,
    back-to-back collectives, ties (times on a 5 us grid), some non-DP
    flows; ``order``: by start, each job's by start one after the other
    (the counting sort), or shuffled (the sort); ``mixed``: some NICs' flows
    of the other job (the per-flow groups).
    """
    n_nic = n_servers * nics_per
    server_of = np.array([f"srv{i // nics_per}" for i in range(n_nic)], dtype=object)
    label = np.where(np.arange(n_servers) < max(2, n_servers // 2), 0, 1).repeat(nics_per)
    rail = np.arange(n_nic) % nics_per
    comp = label * nics_per + (rail if rng.random() < 0.5 else 0)  # a ring per rail, or one over the rails
    rows = []
    grid = 5_000
    for j in (0, 1):
        nics = np.flatnonzero(label == j)
        succ = {x: nics[(k + nics_per) % len(nics)] for k, x in enumerate(nics)}
        late = rng.integers(0, n_servers) if rng.random() < 0.7 else -1
        t0 = 0
        for _ in range(n_coll):
            t0 += int(rng.choice([60_000, 200_000, 1_000_000]))
            delay = rng.integers(0, 8, n_servers) * grid
            if late >= 0 and rng.random() < 0.8:
                delay[late] += int(rng.integers(1, 6)) * 400_000
            rendezvous = rng.random() < 0.5
            for x in nics:
                y = succ[x]
                s = delay[x // nics_per] if not rendezvous else max(delay[x // nics_per], delay[y // nics_per])
                for k in range(int(rng.integers(1, 4))):
                    st0 = t0 + s + k * int(rng.choice([grid, 2 * grid]))
                    rows.append((j, x, y, st0, st0 + int(rng.integers(1, 5)) * grid, rng.random() < 0.9))
    f = np.array(rows, dtype=np.int64).reshape(-1, 6)
    if order == "sorted":
        f = f[np.argsort(f[:, 3], kind="stable")]
    elif order == "by_job":
        f = f[np.lexsort((f[:, 3], f[:, 0]))]
    else:
        f = f[rng.permutation(len(f))]
    job = f[:, 0].copy()
    if mixed and len(job):
        flip = rng.random(len(job)) < 0.05
        job[flip] = 1 - job[flip]
    return job, f[:, 1], f[:, 2], f[:, 3], f[:, 4], f[:, 5].astype(bool), comp, server_of


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(2, 6), st.integers(1, 3), st.integers(0, 30), st.sampled_from(["sorted", "by_job", "shuffled"]),
       st.booleans(), st.booleans())
def test_arrival_bursts_equal_the_numpy_reference(seed, n_servers, nics_per, n_coll, order, mixed, with_dst):
    """The compiled burst passes of the arrival diagnosis give the first (numpy and pandas) version's burst table exactly.

    Random rings of two jobs (:func:`ring_collectives`): late servers,
    back-to-back collectives whose tails are handed on, ties, flows by
    start, by job or shuffled, NICs whose flows are of two jobs; with and
    without the destinations (the first receives).
    """
    from reference_arrival import ReferenceArrivalDiagnoser

    from prism.analysis.diagnosis import ArrivalDiagnoser

    rng = np.random.default_rng(seed)
    job, a, b, start, end, is_dp, comp, server_of = ring_collectives(rng, n_servers, nics_per, n_coll, order, mixed)
    names = {0: "job-a", 1: "job-b"}
    args = (job, a.astype(np.int32), start, end, is_dp, comp.astype(np.int32), server_of, names)
    dst = b.astype(np.int32) if with_dst else None
    got = ArrivalDiagnoser().bursts(*args, dst)
    want = ReferenceArrivalDiagnoser().bursts(*args, dst)
    pd.testing.assert_frame_equal(got, want, check_exact=True)


def test_arrival_hand_on_equals_the_numpy_reference():
    """:func:`prism.analysis.diagnosis.arrival._hand_on` (compiled) moves the flows the first version's numpy passes moved."""
    import reference_arrival

    from prism.analysis.diagnosis.arrival import _hand_on

    moved = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        job, a, b, start, end, is_dp, comp, server_of = ring_collectives(rng, 4, 2, 12, "by_job", False)
        srv = a // 2
        gid = job
        o = np.lexsort((start, gid))
        size = np.array([2, 2])
        burst, _ = reference_arrival._cut(gid[o], srv[o], start[o], end[o], size, 4, 20_000)
        want = reference_arrival._hand_on(burst, gid[o], srv[o], b[o] // 2, start[o], end[o], size)
        got = _hand_on(burst, gid[o], srv[o], b[o] // 2, start[o], end[o], size)
        assert got.tolist() == want.tolist()
        moved += int((want != burst).sum())
    assert moved > 0  # the tails were handed on somewhere


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 8), st.integers(1, 6), st.booleans())
def test_arrival_draws_equal_the_python_reference(seed, n_steps, max_rounds, lone):
    """:func:`prism.analysis.diagnosis.arrival.draws` (vectorised) cuts the steps where a plain loop over each step's
    rounds does: steps of random rounds (alike or not) between long pauses, lone collectives, bursts outside steps."""
    from reference_arrival import reference_draws

    from prism.analysis.diagnosis.arrival import draws

    rng = np.random.default_rng(seed)
    t, s0 = [], []
    at = 0
    for _ in range(n_steps):
        s0.append(at)
        if lone and rng.random() < 0.5:
            t.append(at)
            at += int(rng.integers(1, 5)) * 1_000
        for _ in range(int(rng.integers(1, max_rounds + 1))):
            n = int(rng.integers(1, 12))
            t += list(at + np.arange(n) * 10)
            at += n * 10 + int(rng.choice([5, 2_000]))
        at += 3_000
    s0 = np.asarray(s0, np.int64)
    s1 = np.r_[s0[1:], at]
    if rng.random() < 0.3:
        t += list(at + np.arange(3) * 10)  # after the last step
    t = np.asarray(rng.permutation(t), np.int64)
    got = draws(t, s0, s1)
    want = reference_draws(t, s0, s1)
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist() and got[2] == want[2]


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(0, 14), st.integers(2, 5), st.booleans())
def test_arrival_lateness_equals_the_python_reference(seed, n_draws, n_servers, straggler):
    """:func:`prism.analysis.diagnosis.arrival.lateness_test` finds the start, z and margins a plain loop over every
    start finds: random last servers (ties too) and lateness, some with a server far later from a random draw on."""
    from reference_arrival import reference_lateness

    from prism.analysis.diagnosis.arrival import lateness_test

    rng = np.random.default_rng(seed)
    servers = [f"srv{i}" for i in range(n_servers)]
    last = rng.choice(servers + [""], n_draws).astype(object)
    late = rng.lognormal(np.log(5e6), 1.0, n_draws)
    if straggler and n_draws:
        at = int(rng.integers(0, n_draws))
        slow = rng.random(n_draws - at) < 0.85
        last[at:][slow] = servers[0]
        late[at:][slow] *= rng.uniform(1, 400)
    for srv in servers:
        got = lateness_test(last, late, srv)
        want = reference_lateness(last, late, srv)
        assert (got is None) == (want is None), (got, want)
        if got is not None:
            assert got[0] == want[0] and got[2:4] == want[2:4] and got[4:] == pytest.approx(want[4:])
            assert got[1] == pytest.approx(want[1], rel=1e-9, abs=1e-12)


@SETTINGS
@given(st.integers(1, 5000), st.data(), st.floats(0.0, 1.0))
def test_binomial_and_normal_tails_are_scipy_stats(n, data, p):
    """The significance tests' tails (prism.common.tails, from scipy.special so that no process imports
    scipy.stats at start) equal scipy.stats' to the last bit, at the edges too (k <= 0, k > n, p of 0 or 1)."""
    from scipy.stats import binom, norm

    from prism.common.tails import binomial_at_least, normal_above

    k = data.draw(st.integers(-2, n + 2))
    assert binomial_at_least(k, n, p) == float(binom.sf(k - 1, n, p))
    z = data.draw(st.floats(-40.0, 40.0))
    assert normal_above(z) == float(norm.sf(z))


@SETTINGS
@given(st.integers(1, 5000), st.data())
def test_hypergeometric_tail_is_scipy_stats(total, data):
    """The hypergeometric tail (prism.common.tails, summed in log space) is scipy.stats' to 1e-9, at the edges too
    (k below the fewest marked a draw can hold, above the most)."""
    from scipy.stats import hypergeom

    from prism.common.tails import hypergeometric_at_least

    marked = data.draw(st.integers(0, total))
    drawn = data.draw(st.integers(0, total))
    k = data.draw(st.integers(-2, drawn + 2))
    assert hypergeometric_at_least(k, total, marked, drawn) == pytest.approx(float(hypergeom.sf(k - 1, total, marked, drawn)), rel=1e-9, abs=1e-300)
