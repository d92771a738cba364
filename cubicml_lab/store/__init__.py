"""The trial store: every trial of every campaign, in one SQLite file.

:class:`TrialStore` owns the historical job data of the CubicML loop. One SQLite file (stdlib
``sqlite3``, WAL journal, ``PRAGMA user_version`` = :data:`SCHEMA_VERSION`) holds two tables:
``campaigns`` (name, search space, workload, metadata) and ``trials`` (config, status, metrics,
hardware, workload name and version, timestamps in unix seconds, error text). Each write is one
``BEGIN IMMEDIATE`` transaction, and every input is validated before the transaction starts, so bad
input never costs data already stored: it ends in a :class:`~cubicml_lab.errors.StoreError` naming
the field and the fix. One connection, guarded by a lock, serves every thread, and any number of
processes may open, create and write one file at once (opening checks and creates the schema in
one transaction and waits out other processes' locks).

A trial moves ``pending -> running -> ok | oom | failed | timeout``; ``reset_trial`` takes an
interrupted ``running`` trial back to ``pending``; ``record_trial`` inserts a finished trial in
one step. ``mark_running`` is a trial's claim: of several processes starting one trial, exactly
one succeeds, so processes may share a campaign without running a trial twice; ``claim_trial``
adds a trial only while its campaign has fewer than its budget of trials and no pending or
running trial of the same configuration (one transaction), so processes sharing a campaign share
its budget exactly.

Config, metrics and hardware are stored as strict JSON text, never pickle. Config values are JSON
scalars (int, float, str, bool, None) and read back with their type (``True`` stays ``True``, ``4``
stays ``4``). Non-finite floats in metrics and hardware are stored as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` and read back as floats, so a metric that is exactly one of those
strings also reads back as a float. Non-finite config values are refused, and so are ints
outside 64 bits, bools among metrics, text that is not Unicode and nesting deeper than 64 levels.

``export``/``import_`` write and read the *raw* form: one row per trial with the scalar columns
(``trial_id, campaign, status, workload, workload_version, created_at, started_at, ended_at,
error``), the JSON text columns ``config, metrics, hardware``, and the campaign's own
``campaign_workload, campaign_space, campaign_metadata``. ``to_dataframe`` gives the tidy form for
analysis (one column per knob, metric and hardware field); it cannot be imported back. An export
never overwrites a store: its own file (under any spelling or link) and any SQLite file are
refused.

Modules, importing one way (core -> lifecycle -> campaigns -> connection, tables -> raw_row ->
schema; an import-linter contract keeps it so): :mod:`~cubicml_lab.store.schema` (tables,
statuses, the :class:`Trial` record, opening a file, value checks and JSON encoding),
:mod:`~cubicml_lab.store.tables` (tidy DataFrame, raw CSV/Parquet files),
:mod:`~cubicml_lab.store.raw_row` (one imported raw row, checked),
:mod:`~cubicml_lab.store.connection` (the connection, its lock, one transaction per write),
:mod:`~cubicml_lab.store.campaigns` (the campaigns table), :mod:`~cubicml_lab.store.lifecycle`
(the trial lifecycle's writes, :class:`NoRoom`), :mod:`~cubicml_lab.store.core`
(:class:`TrialStore`: opening a file, reading trials, and the SQL behind export and import).
"""

from .core import NoRoom, TrialStore
from .schema import FINAL_STATUSES, SCHEMA_VERSION, STATUSES, Trial

__all__ = ["FINAL_STATUSES", "SCHEMA_VERSION", "STATUSES", "NoRoom", "Trial", "TrialStore"]
