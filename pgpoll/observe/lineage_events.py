"""OpenLineage run events built from a description of one run (pure: no client, no I/O).

A run is described once (:class:`RunLineage`: the job, its run id, the datasets it reads and writes with
their columns and where each column comes from, the parent run) and :func:`build_event` turns it into the
``START``, ``COMPLETE``, ``FAIL`` or ``ABORT`` event, so what pgpoll emits is tested without a server or a
lineage backend. The facets (OpenLineage's standard ones, as ``openlineage-python`` defines them):

* job: ``jobType`` (``BATCH``, integration ``PGPOLL``, job type ``INGEST``/``SNAPSHOT``/``MATERIALIZE``);
* run: ``processing_engine`` (pgpoll and its version), ``parent`` when a parent run is known,
  ``errorMessage`` on ``FAIL`` (the error's message and its ``fix:`` hint, never a traceback);
* dataset: ``schema`` (the columns and their types: PostgreSQL's type names for a source table, Spark's
  for what pgpoll writes) and ``columnLineage`` where a column is copied from another dataset's column
  (``DIRECT``/``IDENTITY``); an output's ``outputStatistics`` (rows and bytes written) where the run counts
  them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from importlib import metadata

from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import (
    column_lineage_dataset,
    error_message_run,
    job_type_job,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    schema_dataset,
)

from pgpoll.observe.lineage_names import Parent

EVENT_TYPES = {"START": RunState.START, "COMPLETE": RunState.COMPLETE, "FAIL": RunState.FAIL, "ABORT": RunState.ABORT}
INTEGRATION = "PGPOLL"


def pgpoll_version() -> str:
    """The installed pgpoll's version ("unknown" from a source tree that was never installed)."""
    try:
        return metadata.version("pgpoll")
    except metadata.PackageNotFoundError:
        return "unknown"


def producer() -> str:
    """The ``producer`` URI of pgpoll's events: the package and its version."""
    return f"https://pypi.org/project/pgpoll/{pgpoll_version()}/"


@dataclass(frozen=True)
class Column:
    """One column of a dataset: its name, its type, and the columns it is copied from ``(namespace, name, field)``."""

    name: str
    type: str | None = None
    sources: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class DatasetRef:
    """A dataset a run reads or writes, named as :mod:`pgpoll.observe.lineage_names` names it."""

    namespace: str
    name: str
    columns: tuple[Column, ...] = ()
    rows: int | None = None
    size: int | None = None


@dataclass(frozen=True)
class RunLineage:
    """What one run of a job reads and writes, and who started it."""

    job: str  # ingest, snapshot or materialize
    job_namespace: str
    job_name: str
    run_id: str
    inputs: tuple[DatasetRef, ...] = ()
    outputs: tuple[DatasetRef, ...] = ()
    parent: Parent | None = None


def _schema(columns: tuple[Column, ...]) -> schema_dataset.SchemaDatasetFacet:
    return schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=c.name, type=c.type) for c in columns]
    )


def _lineage(columns: tuple[Column, ...]) -> column_lineage_dataset.ColumnLineageDatasetFacet | None:
    fields = {
        c.name: column_lineage_dataset.Fields(
            inputFields=[
                column_lineage_dataset.InputField(
                    namespace=ns, name=name, field=column,
                    transformations=[column_lineage_dataset.Transformation(type="DIRECT", subtype="IDENTITY")],
                )
                for ns, name, column in c.sources
            ]
        )
        for c in columns if c.sources
    }
    return column_lineage_dataset.ColumnLineageDatasetFacet(fields=fields) if fields else None


def _input(d: DatasetRef) -> InputDataset:
    return InputDataset(d.namespace, d.name, facets={"schema": _schema(d.columns)} if d.columns else {})


def _output(d: DatasetRef, final: bool) -> OutputDataset:
    facets: dict[str, object] = {}
    if d.columns:
        facets["schema"] = _schema(d.columns)
        lineage = _lineage(d.columns)
        if lineage is not None:
            facets["columnLineage"] = lineage
    stats = None
    if final and (d.rows is not None or d.size is not None):
        stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(rowCount=d.rows, size=d.size)
    return OutputDataset(
        d.namespace, d.name, facets=facets,  # type: ignore[arg-type]  # (a dict of DatasetFacet subclasses)
        outputFacets={"outputStatistics": stats} if stats is not None else {},
    )


def _parent_facet(parent: Parent) -> parent_run.ParentRunFacet:
    root = None
    if parent.root is not None:
        root = parent_run.Root(
            run=parent_run.RootRun(runId=parent.root.run_id),
            job=parent_run.RootJob(namespace=parent.root.namespace, name=parent.root.name),
        )
    return parent_run.ParentRunFacet(
        run=parent_run.Run(runId=parent.parent.run_id),
        job=parent_run.Job(namespace=parent.parent.namespace, name=parent.parent.name),
        root=root,
    )


def build_event(run: RunLineage, event_type: str, when: datetime, error: str | None = None) -> RunEvent:
    """The event of ``event_type`` (START, COMPLETE, FAIL, ABORT) for ``run`` at ``when``.

    ``START`` carries the datasets known before the run (a materialize's state tables are known only at its
    end); the other events carry them all, with the statistics the run counted.
    """
    final = event_type != "START"
    run_facets: dict[str, object] = {
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(version=pgpoll_version(), name="pgpoll"),
    }
    if run.parent is not None:
        run_facets["parent"] = _parent_facet(run.parent)
    if error is not None:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(message=error, programmingLanguage="python")
    job_facets = {
        "jobType": job_type_job.JobTypeJobFacet(processingType="BATCH", integration=INTEGRATION, jobType=run.job.upper()),
    }
    return RunEvent(
        eventType=EVENT_TYPES[event_type],
        eventTime=when.isoformat(),
        run=Run(runId=run.run_id, facets=run_facets),  # type: ignore[arg-type]
        job=Job(namespace=run.job_namespace, name=run.job_name, facets=job_facets),  # type: ignore[arg-type]
        producer=producer(),
        inputs=[_input(d) for d in run.inputs],
        outputs=[_output(d, final) for d in run.outputs],
    )
