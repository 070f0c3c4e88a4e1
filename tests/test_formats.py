"""The format registry drives reading and writing: every registered format round-trips, none lacks a part."""
import inspect

import pandas as pd
import pytest

from prism.ingest import formats
from prism.ingest.formats import FlowFormat, FormatReader, register
from prism.ingest.readers import FlowReader, detect_format, write_flows
from prism.ingest.records import FlowFormatError, RejectCounter

#: every suffix the registry says is written: a format registered later is tested without editing this file
WRITTEN = [s.lstrip(".") for s in formats.written_suffixes()]


def _canon(df):
    out = df[["start_ns", "duration_ns", "src", "dst", "size", "switches"]].copy()
    for c in ("src", "dst", "switches"):
        out[c] = out[c].astype(str)
    return out.reset_index(drop=True)


@pytest.mark.parametrize("fmt", formats.names())
def test_every_registered_format_has_a_reader_and_a_writer(fmt):
    f = formats.by_name(fmt)
    assert issubclass(f.reader, FormatReader) and not inspect.isabstract(f.reader), f"{fmt}: no concrete reader"
    assert callable(f.write), f"{fmt}: no writer"
    assert f.suffixes and all(formats.by_suffix(s) is f for s in f.suffixes)


@pytest.mark.parametrize("written", WRITTEN)
def test_every_written_suffix_round_trips_through_write_flows_and_flow_reader(sample, tmp_path, written):
    path = tmp_path / f"flows.{written}"
    write_flows(sample, path)
    fmt, gz = detect_format(str(path))
    assert gz == written.endswith(".gz") and "." + written.removesuffix(".gz") in formats.by_name(fmt).suffixes
    rejects = RejectCounter()
    reader = FlowReader(str(path), rejects=rejects, chunk_rows=1000)
    got = pd.concat(list(reader), ignore_index=True)
    pd.testing.assert_frame_equal(_canon(got), _canon(sample))
    assert rejects.total == 0 and reader.rows_read == len(sample) and reader.bytes_total == path.stat().st_size


@pytest.mark.parametrize("fmt", formats.names())
def test_every_read_suffix_is_read_by_its_format(sample, tmp_path, fmt):
    """Suffixes beyond the written one (.pq, .ndjson, .json) and upper case reach the same reader."""
    f = formats.by_name(fmt)
    first = tmp_path / f"flows{f.suffixes[0]}"
    write_flows(sample.head(50), first)
    for s in f.suffixes[1:] + (f.suffixes[0].upper(),):
        other = tmp_path / f"other{s}"
        other.write_bytes(first.read_bytes())
        assert detect_format(str(other)) == (fmt, False)
        assert sum(map(len, FlowReader(str(other)))) == 50


def test_register_refuses_a_format_without_a_reader_or_a_writer_or_with_a_taken_suffix():
    class NoRead(FormatReader):
        pass

    with pytest.raises(TypeError, match="reader must be a FormatReader"):
        register(FlowFormat("tsv", "TSV", (".tsv",), object, lambda flows, path, gz: None))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="writer must be callable"):
        register(FlowFormat("tsv", "TSV", (".tsv",), NoRead, None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the suffix .csv is csv's"):
        register(FlowFormat("tsv", "TSV", (".tsv", ".csv"), NoRead, lambda flows, path, gz: None))
    with pytest.raises(ValueError, match="that name is taken"):
        register(FlowFormat("csv", "TSV", (".tsv",), NoRead, lambda flows, path, gz: None))
    assert "tsv" not in formats.names() and formats.by_suffix(".tsv") is None  # nothing half-registered


def test_a_registered_format_is_read_written_and_offered_everywhere(sample, tmp_path, monkeypatch):
    """A new format is one module's worth (a reader, a writer) and one register() call: then
    write_flows, FlowReader, detect_format's error, the collectors' --out and prism synth --format know it."""
    from prism.ingest.formats import registry
    from prism.ingest.records import validate_flows

    class PickleReader(FormatReader):
        def read(self):
            df = pd.read_pickle(self.path, compression="gzip" if self.gzipped else None)
            self.rows_read += len(df)
            yield validate_flows(df, self.rejects, self.path)

    def write_pickle(flows, path, gzipped):
        flows.to_pickle(path, compression="gzip" if gzipped else None)

    monkeypatch.setattr(registry, "_BY_NAME", dict(registry._BY_NAME))
    monkeypatch.setattr(registry, "_BY_SUFFIX", dict(registry._BY_SUFFIX))
    register(FlowFormat("pickle", "pickle", (".pkl",), PickleReader, write_pickle))

    write_flows(sample, tmp_path / "f.pkl.gz")
    got = pd.concat(list(FlowReader(str(tmp_path / "f.pkl.gz"))), ignore_index=True)
    pd.testing.assert_frame_equal(_canon(got), _canon(sample))
    with pytest.raises(FlowFormatError, match=r"use one of .*\.pkl"):
        detect_format(str(tmp_path / "f.txt"))

    from collectors.collect import FileSink
    from prism.cli import build_parser

    FileSink(str(tmp_path / "out.pkl.gz"))  # accepted as --out
    args = build_parser().parse_args(["synth", "--out", str(tmp_path), "--format", "pkl.gz"])
    assert args.format == "pkl.gz"


def test_unknown_suffixes_are_named_with_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"flows\.txt: unknown flow format \(parquet, csv, csv\.gz, jsonl, jsonl\.gz\)"):
        write_flows(pd.DataFrame(), tmp_path / "flows.txt")
    with pytest.raises(ValueError, match=r"unknown flow format \(parquet"):
        write_flows(pd.DataFrame(), tmp_path / "flows.parquet.gz")  # Parquet compresses inside the file
    from collectors.collect import FileSink

    with pytest.raises(ValueError, match=r"--out .*flows\.txt: unknown flow format; use \.parquet, \.csv, \.csv\.gz, \.jsonl or \.jsonl\.gz, "
                                         r"or kafka://HOST:PORT/TOPIC"):
        FileSink(str(tmp_path / "flows.txt"))
