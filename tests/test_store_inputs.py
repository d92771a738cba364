"""Tests for cubicml_lab.store at its edges: every bad input ends in a StoreError that names the
field and the fix, and leaves what is stored as it was. Real SQLite files under tmp_path."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from cubicml_lab.errors import StoreError
from cubicml_lab.store import TrialStore


@pytest.fixture
def store(tmp_path: Path):
    """A store with campaign 'c' (workload gpt): one finished trial and one running."""
    with TrialStore(tmp_path / "lab.sqlite") as s:
        s.create_campaign("c", workload="gpt")
        s.record_trial("c", {"mb": 1}, status="ok", metrics={"throughput": 10.0})
        tid = s.add_trial("c", {"mb": 2}, workload="gpt")
        s.mark_running(tid, hardware={"device": "cpu"})
        yield s


def _state(store: TrialStore) -> tuple:
    """Everything stored, to compare before and after a refused call."""
    return (store.trials(), [store.campaign_info(n) for n in store.campaigns()],
            sorted(p.name for p in store.path.parent.iterdir() if not p.name.startswith("lab.")))


def _refused(store: TrialStore, call, *patterns: str) -> str:
    """Run ``call``; it must raise a StoreError matching every pattern and change nothing."""
    before = _state(store)
    with pytest.raises(StoreError) as info:
        call()
    text = str(info.value)
    for pattern in patterns:
        assert pattern in text, text
    assert "hint:" in text, text
    assert _state(store) == before
    return text


# -------------------------------------------------------------------- export
def test_export_to_a_folder_or_an_unwritable_path_is_refused(store: TrialStore, tmp_path: Path):
    (tmp_path / "out.csv").mkdir()
    _refused(store, lambda: store.export(tmp_path / "out.csv"), "out.csv: it is a folder")
    _refused(store, lambda: store.export(tmp_path), "from its suffix ''", ".csv or .parquet")
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    _refused(store, lambda: store.export(tmp_path / "notes.txt" / "t.csv"), "cannot export to",
             "choose a folder you can write to")
    _refused(store, lambda: store.export("/proc/trials.parquet"), "cannot export to")
    _refused(store, lambda: store.export(tmp_path / "t.xlsx"), "suffix '.xlsx'")
    _refused(store, lambda: store.export(None), "path must be a path", "got None")
    _refused(store, lambda: store.export(tmp_path / "t.csv", campaign=3),
             "campaign name must be a non-empty string, got 3")


def _store_named(path: Path) -> TrialStore:
    store = TrialStore(path)
    store.create_campaign("c", workload="gpt")
    store.record_trial("c", {"mb": 1}, status="ok", metrics={"throughput": 10.0})
    return store


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_never_overwrites_a_store(tmp_path: Path, monkeypatch, suffix: str):
    own = tmp_path / f"lab{suffix}"  # a store whose name looks like an export
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.csv").symlink_to(own)
    other = _store_named(tmp_path / f"other{suffix}")
    other.close()
    monkeypatch.chdir(tmp_path / "sub")
    with _store_named(own) as store:
        before = store.trials()
        for spelling in [own, str(own), tmp_path / "sub" / ".." / own.name, Path("..") / own.name,
                         tmp_path / "link.csv"]:
            if Path(spelling).suffix == suffix:
                _refused(store, lambda s=spelling: store.export(s), "trial store's own file")
        _refused(store, lambda: store.export(tmp_path / f"other{suffix}"), "SQLite database")
        assert store.trials() == before
    with sqlite3.connect(own) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    with TrialStore(tmp_path / f"other{suffix}") as again:
        assert len(again.trials()) == 1


def test_failed_export_leaves_no_file_behind(store: TrialStore, tmp_path: Path):
    target = tmp_path / "out" / "t.parquet"
    store.export(target)  # works, and leaves only the target
    assert [p.name for p in target.parent.iterdir()] == ["t.parquet"]
    (tmp_path / "out" / "t2.csv").mkdir()
    _refused(store, lambda: store.export(tmp_path / "out" / "t2.csv"), "is a folder")
    assert sorted(p.name for p in target.parent.iterdir()) == ["t.parquet", "t2.csv"]


# -------------------------------------------------------------------- import
def test_import_of_bad_csv_names_the_problem(store: TrialStore, tmp_path: Path):
    bad = tmp_path / "bad.csv"
    cases = [
        (b"campaign,status,config\nc,ok,\"{\"\"a\"\": 1}\"\n\xff\xfe\n", "not UTF-8 text",
         "byte 0xff"),
        (b"campaign,status,config\nc,ok,{},surplus\n", "row 1 has 4 cells but the header has 3",
         "nothing was imported"),
        (b"campaign,status,config,config\nc,ok,{},{}\n", "repeated columns ['config']", ""),
        (b"campaign,status,config\nc,ok,\"{}\"x\n", "malformed CSV", ""),
        (b"campaign,status,config\nc,ok,{a: 1}\n", "column 'config'", "row 1"),
        (b"campaign,status,config,metrics\nc,ok,{},\"" + b"[" * 5000 + b"]" * 5000 + b"\"\n",
         "column 'metrics'", "nests too deeply"),
        (b"campaign,status,config,metrics\nc,ok,{},\"{\"\"x\"\": 99999999999999999999}\"\n",
         "64-bit integer range", "row 1"),
        (b"campaign,status,config,metrics\nc,ok,{},\"{\"\"x\"\": true}\"\n",
         "metrics['x'] = True is a bool", ""),
        (b"trial_id,campaign,status,config\n1e999,c,ok,{}\n", "'1e999' is not a trial id", ""),
        (b"campaign,status,config\n3,crashed,{}\n", "status 'crashed'", "row 1"),
    ]
    for content, *patterns in cases:
        bad.write_bytes(content)
        _refused(store, lambda: store.import_(bad), str(bad), *[p for p in patterns if p])


def test_import_accepts_a_byte_order_mark(store: TrialStore, tmp_path: Path):
    path = store.export(tmp_path / "t.csv")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as spreadsheet programs save it
    assert store.import_(path, campaign="copy") == 2
    assert [t.config for t in store.trials("copy")] == [{"mb": 1}, {"mb": 2}]


def test_import_of_bad_parquet_names_the_problem(store: TrialStore, tmp_path: Path):
    import pandas as pd

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    _refused(store, lambda: store.import_(bad), "cannot read", "as Parquet")
    pd.DataFrame({"campaign": ["c"], "status": ["ok"], "config": [[1, 2]]}).to_parquet(bad)
    _refused(store, lambda: store.import_(bad), "row 1, column 'config'", "not text or a number")
    pd.DataFrame({"campaign": ["c"], "status": ["ok"], "config": ['{"mb": 9}'],
                  "error": pd.Series([None], dtype="string")}).to_parquet(bad)
    assert store.import_(bad) == 1  # nulls of any kind are empty cells
    assert store.trials("c")[-1].config == {"mb": 9} and store.trials("c")[-1].error is None


# -------------------------------------------------------------------- values
@pytest.mark.parametrize("metrics, pattern", [
    ({"x": 2**63}, "metrics['x'] = 9223372036854775808 is outside the 64-bit integer range"),
    ({"x": 10**5000}, "metrics['x'] = <an int of 16610 bits> is outside the 64-bit"),
    ({"x": [1.0, -2**70]}, "metrics['x'][1]"),
    ({"ok": True}, "metrics['ok'] = True is a bool, not a number"),
    ({"ok": np.bool_(False)}, "metrics['ok'] = False is a bool"),
    ({"a": {"b": [True]}}, "metrics['a']['b'][0] = True is a bool"),
    ({"x": {1, 2}}, "metrics['x'] = {1, 2} (set) is not JSON-serialisable"),
    ({"x": {"y": object()}}, "metrics['x']['y'] = <object object"),
    ({3: 1.0}, "metrics: key 3 is int, not str"),
    ({"\udcff": 1.0}, "not Unicode text (a lone surrogate)"),
    ([("x", 1.0)], "metrics must be a dict, got list"),
    ("fast", "metrics must be a dict, got str"),
])
def test_bad_metrics_are_refused_and_change_nothing(store: TrialStore, metrics, pattern: str):
    running = store.trials("c", status="running")[0].id
    _refused(store, lambda: store.finish_trial(running, status="ok", metrics=metrics), pattern)
    _refused(store, lambda: store.record_trial("c", {"mb": 3}, status="ok", metrics=metrics),
             pattern)


def test_deep_nesting_is_refused_but_reasonable_nesting_kept(store: TrialStore):
    deep: object = 1.0
    for _ in range(5000):
        deep = [deep]
    _refused(store, lambda: store.record_trial("c", {"mb": 3}, status="ok",
                                               metrics={"x": deep}), "nests deeper than 64")
    _refused(store, lambda: store.create_campaign("d", metadata={"x": deep}),
             "metadata['x']", "nests deeper")
    fine = {"curve": [[1.0, math.nan]] * 3, "per_rank": {"0": {"mem": [1, 2]}}}
    tid = store.record_trial("c", {"mb": 3}, status="ok", metrics=fine)
    assert store.get_trial(tid).metrics["per_rank"] == {"0": {"mem": [1, 2]}}
    edge = store.record_trial("c", {"mb": 4}, status="ok", metrics={"n": 2**63 - 1,
                                                                    "m": -2**63})
    assert store.get_trial(edge).metrics == {"n": 2**63 - 1, "m": -2**63}


def test_nonfinite_values_where_refused(store: TrialStore):
    _refused(store, lambda: store.add_trial("c", {"lr": math.nan}, workload="gpt"),
             "config['lr'] = nan (float) is not a finite JSON scalar")
    _refused(store, lambda: store.add_trial("c", {"lr": 2**64}, workload="gpt"),
             "config['lr'] = 18446744073709551616 is outside the 64-bit")
    _refused(store, lambda: store.record_trial("c", {"mb": 1}, status="ok", started_at=math.inf),
             "started_at must be finite unix seconds", "time.time()")
    _refused(store, lambda: store.record_trial("c", {"mb": 1}, status="ok", ended_at=10**400),
             "ended_at must be finite unix seconds or None, got <an int of")
    _refused(store, lambda: store.get_trial(2**64), "trial id must be an int")
    _refused(store, lambda: store.reset_trial(True), "trial id must be an int, got True")


def test_campaign_names_and_other_text_must_be_text(store: TrialStore):
    calls = [lambda: store.create_campaign(3), lambda: store.create_campaign(None),
             lambda: store.create_campaign("  "), lambda: store.trials(campaign=3),
             lambda: store.add_trial(["c"], {"mb": 1}, workload="gpt"),
             lambda: store.campaign_info(b"c"), lambda: store.to_dataframe(4.5),
             lambda: store.update_campaign_metadata(7, {"a": 1}),
             lambda: store.import_(store.path, campaign=0)]
    for call in calls:
        _refused(store, call, "campaign name must be a non-empty string", "name the campaign")
    _refused(store, lambda: store.create_campaign("c\udc80"), "campaign name",
             "lone surrogate")
    _refused(store, lambda: store.add_trial("c", {"mb": 1}, workload=3), "workload must be a "
             "string, got 3")
    _refused(store, lambda: store.trials(status=5), "status must be a status or a list",
             "status=['ok', 'oom']")
    _refused(store, lambda: store.trials(status=["ok", "great"]), "status 'great'")


def test_undecodable_error_text_is_kept_escaped(store: TrialStore):
    running = store.trials("c", status="running")[0].id
    store.finish_trial(running, status="failed", error="Traceback\nbad byte \udcff")
    assert store.get_trial(running).error == "Traceback\nbad byte \\udcff"


def test_store_path_must_be_a_path(tmp_path: Path):
    for bad, pattern in [(3, "path must be a path (str or pathlib.Path), got 3"),
                         ("", "is not a usable file path"),
                         (str(tmp_path / "a\x00b.sqlite"), "is not a usable file path")]:
        with pytest.raises(StoreError, match=pattern.replace("(", r"\(").replace(")", r"\)")):
            TrialStore(bad)
    assert list(tmp_path.iterdir()) == []
