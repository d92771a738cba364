"""Tests for cubicml_lab.store: a real SQLite file per test, real threads, real CSV and Parquet."""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from cubicml_lab.errors import StoreError
from cubicml_lab.store import FINAL_STATUSES, SCHEMA_VERSION, Trial, TrialStore


@pytest.fixture
def gpt_store(tmp_path: Path):
    """A store in a temporary folder with one campaign, 'gpt-cpu' (workload gpt)."""
    with TrialStore(tmp_path / "lab.sqlite") as store:
        store.create_campaign("gpt-cpu", workload="gpt", space={"parameters": []})
        yield store


def _canon(trial: Trial) -> str:
    """Everything but the id, as text that tells 1 from 1.0 from True and NaN from None."""
    record = dataclasses.asdict(trial)
    record.pop("id")
    return json.dumps(record, sort_keys=True)  # allow_nan: NaN -> NaN token, equal to itself


def _populate(store: TrialStore) -> None:
    """Trials in every interesting state: NaN/inf metrics, None error, nested hardware, ..."""
    store.create_campaign("dlrm", workload="dlrm", metadata={"owner": "me", "seeds": [0, 1]})
    hw = {"device": "cpu", "cpu": {"cores": 2, "model": "Xeon é"}, "gpus": []}
    ok = store.add_trial("gpt-cpu", {"micro_batch": 4, "compile": True, "lr": 1.0,
                                     "recompute": "NA"}, workload="gpt", workload_version="0.1")
    store.mark_running(ok, hardware=hw)
    store.finish_trial(ok, status="ok", metrics={"tokens_per_s": 1234.5678901234567,
                                                 "mfu": math.nan, "flops_per_step": 3 * 10**15,
                                                 "loss_curve": [1.0, math.inf, -math.inf]})
    oom = store.add_trial("gpt-cpu", {"micro_batch": 64, "compile": False, "lr": 0.1,
                                      "recompute": "None"}, workload="gpt")
    store.mark_running(oom)
    store.finish_trial(oom, status="failed",
                       error='Traceback:\n  File "x.py", line 1, in <module>\nRuntimeError: a, "b"')
    store.add_trial("gpt-cpu", {"micro_batch": 2, "compile": False, "lr": 0.5,
                                "recompute": ""}, workload="gpt")  # stays pending
    store.record_trial("dlrm", {"tables": 8}, status="timeout", hardware={}, started_at=1.5,
                       ended_at=2.25, workload_version="v2")


def test_lifecycle_pending_running_ok(gpt_store: TrialStore):
    before = time.time()
    tid = gpt_store.add_trial("gpt-cpu", {"micro_batch": 4}, workload="gpt", workload_version="1")
    trial = gpt_store.get_trial(tid)
    assert (trial.status, trial.started_at, trial.ended_at, trial.duration_s) == (
        "pending", None, None, None)
    assert before <= trial.created_at <= time.time()

    gpt_store.mark_running(tid, hardware={"device": "cpu"})
    running = gpt_store.get_trial(tid)
    assert running.status == "running" and running.started_at >= trial.created_at
    assert running.hardware == {"device": "cpu"}

    gpt_store.finish_trial(tid, status="ok", metrics={"tokens_per_s": 10.0},
                           hardware={"torch": "2.13"})
    done = gpt_store.get_trial(tid)
    assert done.status == "ok" and done.metrics == {"tokens_per_s": 10.0}
    assert done.hardware == {"device": "cpu", "torch": "2.13"}  # merged, not replaced
    assert done.duration_s >= 0
    assert done.duration_s == pytest.approx(done.ended_at - done.started_at)
    assert (done.workload, done.workload_version, done.error) == ("gpt", "1", None)
    assert gpt_store.trials("gpt-cpu", status="ok") == [done]


def test_invalid_transitions_raise_and_change_nothing(gpt_store: TrialStore):
    tid = gpt_store.add_trial("gpt-cpu", {"micro_batch": 1}, workload="gpt")
    with pytest.raises(StoreError, match="needs 'running'"):
        gpt_store.reset_trial(tid)
    gpt_store.mark_running(tid)
    with pytest.raises(StoreError, match="trial .* is 'running'"):
        gpt_store.mark_running(tid)
    with pytest.raises(StoreError, match="allowed: ok, oom, failed, timeout"):
        gpt_store.finish_trial(tid, status="running")
    with pytest.raises(StoreError, match="status 'done'"):
        gpt_store.finish_trial(tid, status="done")
    gpt_store.finish_trial(tid, status="oom")
    finished = gpt_store.get_trial(tid)
    for again in (lambda: gpt_store.finish_trial(tid, status="ok", metrics={"x": 1}),
                  lambda: gpt_store.mark_running(tid), lambda: gpt_store.reset_trial(tid)):
        with pytest.raises(StoreError, match="is 'oom'"):
            again()
    assert gpt_store.get_trial(tid) == finished
    with pytest.raises(StoreError, match="no trial with id 999"):
        gpt_store.get_trial(999)
    with pytest.raises(StoreError, match="no trial with id 999"):
        gpt_store.mark_running(999)


def test_reset_and_finish_from_pending(gpt_store: TrialStore):
    tid = gpt_store.add_trial("gpt-cpu", {"micro_batch": 1}, workload="gpt")
    gpt_store.mark_running(tid, hardware={"device": "cpu"})
    gpt_store.reset_trial(tid)
    reset = gpt_store.get_trial(tid)
    assert (reset.status, reset.started_at, reset.hardware) == ("pending", None, {})
    gpt_store.finish_trial(tid, status="failed", error="")  # a pending trial may fail to launch
    failed = gpt_store.get_trial(tid)
    assert (failed.status, failed.error, failed.started_at) == ("failed", None, None)
    assert failed.ended_at is not None


def test_wal_mode_and_schema_version_on_disk(gpt_store: TrialStore):
    with sqlite3.connect(gpt_store.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1


def test_reopen_sees_data_and_parent_dirs_are_created(tmp_path: Path):
    path = tmp_path / "deep" / "er" / "lab.sqlite"
    with TrialStore(path) as store:
        store.create_campaign("c", workload="gpt", space={"p": 1}, metadata={"note": "x"})
        tid = store.add_trial("c", {"a": 1}, workload="gpt")
        store.mark_running(tid)
        with TrialStore(path) as reader:  # a second connection while the first is open (WAL)
            assert reader.get_trial(tid).status == "running"
        store.finish_trial(tid, status="ok", metrics={"v": 2})
    with TrialStore(path) as again:
        assert again.campaigns() == ["c"]
        info = again.campaign_info("c")
        assert (info["space"], info["workload"], info["metadata"]) == ({"p": 1}, "gpt",
                                                                        {"note": "x"})
        assert again.get_trial(tid).metrics == {"v": 2}
    with pytest.raises(StoreError, match="is closed"):
        again.trials()


def test_newer_schema_version_is_refused(tmp_path: Path):
    path = tmp_path / "lab.sqlite"
    TrialStore(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}") as info:
        TrialStore(path)
    assert str(path) in str(info.value) and "upgrade cubicml-lab" in str(info.value)


@pytest.mark.parametrize("content", [b"hello, I am a CSV file\n1,2,3\n" * 50, b"x"])
def test_non_sqlite_file_is_refused_and_untouched(tmp_path: Path, content: bytes):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(content)
    with pytest.raises(StoreError, match="not an SQLite file") as info:
        TrialStore(path)
    assert str(path) in str(info.value)
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.sqlite"]


def test_foreign_sqlite_database_is_refused_and_untouched(tmp_path: Path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE birds (name TEXT)")
    content = path.read_bytes()
    with pytest.raises(StoreError, match="not a cubicml-lab trial store"):
        TrialStore(path)
    assert path.read_bytes() == content


def test_input_validation_messages(gpt_store: TrialStore):
    with pytest.raises(StoreError, match="non-empty"):
        gpt_store.create_campaign("  ")
    with pytest.raises(StoreError, match="unknown campaign 'nope'.*'gpt-cpu'") as info:
        gpt_store.add_trial("nope", {"a": 1}, workload="gpt")
    assert "create_campaign" in str(info.value)
    with pytest.raises(StoreError, match="unknown campaign 'nope'"):
        gpt_store.campaign_info("nope")
    with pytest.raises(StoreError, match=r"config\['when'\]"):
        gpt_store.add_trial("gpt-cpu", {"a": 1, "when": object()}, workload="gpt")
    with pytest.raises(StoreError, match=r"config\['sizes'\]"):
        gpt_store.add_trial("gpt-cpu", {"sizes": [1, 2]}, workload="gpt")
    with pytest.raises(StoreError, match=r"config\['lr'\]"):
        gpt_store.add_trial("gpt-cpu", {"lr": math.nan}, workload="gpt")
    with pytest.raises(StoreError, match="'gpt'.*'dlrm'"):
        gpt_store.create_campaign("gpt-cpu", workload="dlrm")
    with pytest.raises(StoreError, match="already exists"):
        gpt_store.create_campaign("gpt-cpu", exist_ok=False)
    with pytest.raises(StoreError, match="does not match"):
        gpt_store.add_trial("gpt-cpu", {"a": 1}, workload="dlrm")
    with pytest.raises(StoreError, match="allowed: pending, running, ok"):
        gpt_store.trials(status="finished")
    with pytest.raises(StoreError, match="after ended_at"):
        gpt_store.record_trial("gpt-cpu", {"a": 1}, status="ok", started_at=5.0, ended_at=4.0)
    with pytest.raises(StoreError, match="allowed: ok, oom"):
        gpt_store.record_trial("gpt-cpu", {"a": 1}, status="pending")
    assert gpt_store.trials() == []
    gpt_store.create_campaign("gpt-cpu", workload="gpt")  # same workload: reused, no error
    assert gpt_store.campaigns() == ["gpt-cpu"]


def test_bad_input_keeps_stored_trial(gpt_store: TrialStore):
    tid = gpt_store.add_trial("gpt-cpu", {"a": 1}, workload="gpt")
    gpt_store.mark_running(tid, hardware={"device": "cpu"})
    before = gpt_store.get_trial(tid)
    with pytest.raises(StoreError, match=r"metrics\['bad'\]"):
        gpt_store.finish_trial(tid, status="ok", metrics={"fine": 1.0, "bad": {1, 2}})
    with pytest.raises(StoreError, match="key 3 is int"):
        gpt_store.finish_trial(tid, status="ok", hardware={3: "x"})
    assert gpt_store.get_trial(tid) == before


def test_config_types_and_nonfinite_metrics_round_trip(gpt_store: TrialStore):
    config = {"compile": True, "micro_batch": 4, "lr": 1.0, "recompute": "NaN", "seed": None}
    metrics = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "nested": {"x": [math.nan, 1]}}
    tid = gpt_store.record_trial("gpt-cpu", config, status="ok", metrics=metrics)
    trial = gpt_store.get_trial(tid)
    assert trial.config == config
    assert [type(v) for v in trial.config.values()] == [bool, int, float, str, type(None)]
    assert math.isnan(trial.metrics["nan"]) and math.isnan(trial.metrics["nested"]["x"][0])
    assert (trial.metrics["inf"], trial.metrics["ninf"]) == (math.inf, -math.inf)
    assert trial.workload == "gpt" and trial.ended_at is not None
    with sqlite3.connect(gpt_store.path) as raw:  # stored text is strict JSON
        text = raw.execute("SELECT metrics FROM trials WHERE id = ?", (tid,)).fetchone()[0]
    json.loads(text, parse_constant=lambda token: pytest.fail(f"non-strict JSON {token}"))


def test_to_dataframe_columns_and_dtypes(gpt_store: TrialStore):
    gpt_store.record_trial("gpt-cpu", {"micro_batch": 4, "compile": True, "status": "x"},
                           status="ok", metrics={"tokens_per_s": 10.0, "micro_batch": 3},
                           hardware={"device": "cpu", "cpu": {"cores": 2}})
    gpt_store.record_trial("gpt-cpu", {"micro_batch": 8, "compile": False, "status": "y"},
                           status="oom", error="out of memory")
    df = gpt_store.to_dataframe("gpt-cpu")
    assert list(df.columns) == [
        "trial_id", "campaign", "status", "workload", "workload_version", "created_at",
        "started_at", "ended_at", "duration_s", "error", "micro_batch", "compile",
        "config.status", "tokens_per_s", "metric.micro_batch", "hw.device", "hw.cpu.cores"]
    assert str(df["compile"].dtype) == "bool" and df["compile"].tolist() == [True, False]
    assert str(df["micro_batch"].dtype) == "int64" and df["micro_batch"].tolist() == [4, 8]
    assert str(df["trial_id"].dtype) == "int64"
    assert str(df["tokens_per_s"].dtype) == "float64" and math.isnan(df["tokens_per_s"][1])
    assert df["status"].tolist() == ["ok", "oom"] and df["config.status"].tolist() == ["x", "y"]
    assert df["error"].tolist() == [None, "out of memory"]
    assert df["hw.cpu.cores"][0] == 2 and math.isnan(df["duration_s"][0])


def test_to_dataframe_nullable_config_across_campaigns(gpt_store: TrialStore):
    gpt_store.create_campaign("other", workload="gpt")
    gpt_store.record_trial("gpt-cpu", {"micro_batch": 4, "compile": True}, status="ok")
    gpt_store.record_trial("other", {"d_model": 128}, status="ok")
    df = gpt_store.to_dataframe()
    assert str(df["micro_batch"].dtype) == "Int64" and df["micro_batch"][0] == 4
    assert str(df["compile"].dtype) == "boolean" and bool(df["compile"][0]) is True
    assert df["d_model"].isna().tolist() == [True, False]


def test_to_dataframe_empty_has_fixed_columns(tmp_path: Path):
    with TrialStore(tmp_path / "empty.sqlite") as store:
        df = store.to_dataframe()
    assert df.empty and list(df.columns) == [
        "trial_id", "campaign", "status", "workload", "workload_version", "created_at",
        "started_at", "ended_at", "duration_s", "error"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_export_import_round_trip_is_lossless(gpt_store: TrialStore, tmp_path: Path, suffix: str):
    _populate(gpt_store)
    out = gpt_store.export(tmp_path / "exports" / f"all{suffix}")
    with TrialStore(tmp_path / "copy.sqlite") as copy:
        assert copy.import_(out) == 4
        assert [_canon(t) for t in copy.trials()] == [_canon(t) for t in gpt_store.trials()]
        for name in gpt_store.campaigns():
            original, imported = gpt_store.campaign_info(name), copy.campaign_info(name)
            for key in ("space", "workload", "metadata"):
                assert imported[key] == original[key]
        nan_trial = copy.trials(status="ok")[0]
        assert math.isnan(nan_trial.metrics["mfu"])
        assert nan_trial.config["recompute"] == "NA"  # not read as a missing value
        assert type(nan_trial.config["lr"]) is float and type(nan_trial.config["compile"]) is bool

        one = gpt_store.export(tmp_path / f"gpt{suffix}", campaign="gpt-cpu")
        assert copy.import_(one, campaign="gpt-copy") == 3
        assert copy.campaign_info("gpt-copy")["workload"] == "gpt"
        assert [t.config for t in copy.trials("gpt-copy")] == [
            t.config for t in gpt_store.trials("gpt-cpu")]


def test_export_and_import_refuse_unknown_suffix(gpt_store: TrialStore, tmp_path: Path):
    with pytest.raises(StoreError, match=r"\.csv or \.parquet"):
        gpt_store.export(tmp_path / "trials.json")
    bad = tmp_path / "trials.xlsx"
    bad.write_text("x")
    with pytest.raises(StoreError, match=r"\.csv or \.parquet"):
        gpt_store.import_(bad)
    assert not (tmp_path / "trials.json").exists()


def test_import_missing_columns_names_them(gpt_store: TrialStore, tmp_path: Path):
    path = tmp_path / "tidy.csv"
    gpt_store.record_trial("gpt-cpu", {"a": 1}, status="ok")
    gpt_store.to_dataframe().to_csv(path, index=False)  # the tidy form is not importable
    with pytest.raises(StoreError, match=r"missing columns \['config'\]") as info:
        gpt_store.import_(path)
    assert "unknown columns ['duration_s', 'a']" in str(info.value)
    assert len(gpt_store.trials()) == 1


def test_failed_import_leaves_store_unchanged(gpt_store: TrialStore, tmp_path: Path):
    _populate(gpt_store)
    path = gpt_store.export(tmp_path / "all.csv")
    # Rows 1-3 go to a new campaign 'fresh'; row 4 (dlrm) into existing 'gpt-cpu' (workload gpt):
    # the conflict is found mid-transaction, after 'fresh' and three trials were inserted.
    text = path.read_text(encoding="utf-8").replace(",gpt-cpu,", ",fresh,")
    text = text.replace(",dlrm,timeout,", ",gpt-cpu,timeout,")
    path.write_text(text, encoding="utf-8")
    before = ([_canon(t) for t in gpt_store.trials()], gpt_store.campaigns())
    with pytest.raises(StoreError, match="does not match campaign 'gpt-cpu'"):
        gpt_store.import_(path)
    assert ([_canon(t) for t in gpt_store.trials()], gpt_store.campaigns()) == before

    bad = tmp_path / "bad.csv"
    bad.write_text(text.replace(",timeout,", ",finished,"), encoding="utf-8")
    with pytest.raises(StoreError, match="row 4, column 'status'.*'finished'"):
        gpt_store.import_(bad)
    assert ([_canon(t) for t in gpt_store.trials()], gpt_store.campaigns()) == before


def test_threads_finish_trials_concurrently(gpt_store: TrialStore):
    n_threads, per_thread = 4, 25
    errors: list[BaseException] = []

    def worker(thread: int) -> None:
        try:
            for i in range(per_thread):
                tid = gpt_store.add_trial("gpt-cpu", {"thread": thread, "i": i}, workload="gpt")
                gpt_store.mark_running(tid, hardware={"thread": thread})
                gpt_store.finish_trial(tid, status=FINAL_STATUSES[i % 4],
                                       metrics={"value": thread * 1000 + i})
        except BaseException as err:  # surfaced below: a thread's exception is otherwise lost
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    trials = gpt_store.trials("gpt-cpu")
    assert len(trials) == len({t.id for t in trials}) == n_threads * per_thread
    for t in trials:
        assert t.status in FINAL_STATUSES and t.status == FINAL_STATUSES[t.config["i"] % 4]
        assert t.metrics["value"] == t.config["thread"] * 1000 + t.config["i"]
        assert t.hardware == {"thread": t.config["thread"]}


def test_store_shows_campaign_counts(tmp_store):
    tmp_store.create_campaign("a", workload="gpt")
    tmp_store.create_campaign("b", workload="dlrm")
    tid = tmp_store.add_trial("a", {"micro_batch": 1}, workload="gpt")
    tmp_store.finish_trial(tid, status="oom")
    tmp_store.record_trial("a", {"micro_batch": 2}, status="ok", metrics={"throughput": 1.0})
    text = str(tmp_store)
    assert "a (gpt): 1 ok, 1 oom" in text and "b (dlrm): no trials" in text
    html = tmp_store._repr_html_()
    assert "<table" in html and ">oom<" in html and ">dlrm<" in html
    tmp_store.update_campaign_metadata("b", {"note": "x"})
    assert tmp_store.campaign_info("b")["metadata"]["note"] == "x"
    with pytest.raises(StoreError, match="unknown campaign"):
        tmp_store.update_campaign_metadata("zzz", {"note": "x"})
    tmp_store.close()
    assert "closed" in str(tmp_store) and "closed" in tmp_store._repr_html_()


def test_readable_frame_keeps_a_steady_shape_for_any_trials(gpt_store: TrialStore):
    """The readable form of trials in every state: the objective column even before any ok
    trial, a pending trial's time NaT, a failure's last line, NaN where a metric is missing."""
    import pandas as pd

    from cubicml_lab.store.tables import readable_frame

    empty = readable_frame([], ["micro_batch"])
    assert list(empty.columns) == ["trial_id", "status", "micro_batch", "throughput",
                                   "contended", "started_at", "duration_s", "device_s", "error"]
    _populate(gpt_store)
    table = readable_frame(gpt_store.trials("gpt-cpu"), ["micro_batch", "compile"],
                           objective="tokens_per_s")
    assert list(table.columns) == ["trial_id", "status", "micro_batch", "compile",
                                   "tokens_per_s", "mfu", "contended", "started_at",
                                   "duration_s", "device_s", "error"]
    assert table["status"].tolist() == ["ok", "failed", "pending"]
    assert table["tokens_per_s"].iloc[0] == 1234.5678901234567  # as stored, not rounded
    assert math.isnan(table["tokens_per_s"].iloc[1]) and math.isnan(table["mfu"].iloc[0])
    assert table["error"].tolist() == [None, 'RuntimeError: a, "b"', None]
    assert table["compile"].tolist() == [True, False, False]
    assert table["started_at"].notna().tolist() == [True, True, False]
    assert pd.isna(table["duration_s"].iloc[2]) and not table["contended"].any()
