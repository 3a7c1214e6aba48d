"""The files a model instance serves: settled before they are read, compared with those of the
model's last load once its tables are open, and recorded for the next load.

A Triton instance reads its model's files twice: ``initialize`` checks them (and a ranking
model reads its dense and network files), the tables are read when they open (at load with a
warm-up request, else on the first request). Around both (:mod:`hps_core.load_record`):

- before: the instance waits until none of the files changed within a second, so that it never
  reads one that is being written (a copy under way), and fails naming the file if one keeps
  changing for a minute;
- after the tables opened: a table file that changed while they were read, or a ps.json,
  dense or network file that changed since ``initialize`` read it, means that what the
  instance holds may mix old and new contents, so the load fails, naming the file ("load the
  model again once the files are written"); a model without a warm-up request refuses every
  request until a load, rather than serve such a copy;
- then the files are compared with those the model version's last load in this server read. A
  load someone asked for (``hps reload``, a version switch) reads the changed files on
  purpose: it says which at INFO. A restart after a stub died (the stub watchdog's reload,
  :func:`~hps_core.load_record.is_restart`) ought to serve what the last load served, but
  its tables are built from the files as they are: when those changed in place without a
  reload, it serves other rows than the model served before the stub died, and says so with
  an ERROR naming each table and file, and the gauge ``hps_files_changed_at_restart`` (labels
  ``model``, ``instance``, ``device``: how many files differ; 0 when none does or the load is
  not a restart). Every instance of the model is restarted together, so all of them serve the
  same files afterwards.

Example:
    >>> files = ServedFiles.settle(settings)  # first in initialize  # doctest: +SKIP
    >>> service = LookupService(settings, files)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any

from hps_core.config import load_ps_config
from hps_core.errors import HPSError, ModelFileError
from hps_core.formats.uris import ModelPath
from hps_core.load_record import (
    RELOAD_PARAMETER,
    FileStamp,
    LoadRecord,
    LoadRecords,
    changes,
    describe_changes,
    is_restart,
    model_files,
    read_stamps,
    settled_stamps,
)
from hps_core.wording import plural
from triton_backend.model_settings import ModelSettings

logger = logging.getLogger("hps_core")

_READ_AT_INITIALIZE = frozenset({"ps.json", "dense_file", "network_file"})
"""What :func:`~hps_core.load_record.model_files` calls the files a model reads in
``initialize`` (the tables are read when they open)."""
CHANGED_AT_RESTART = (
    "hps_files_changed_at_restart",
    "Files the instance's restart after a stub exit read that differ from the model's last "
    "load (0: the same files, or not a restart)",
)


class ServedFiles:
    """The files of one model instance, from ``initialize`` to its tables' opening.

    Use :meth:`settle` to make one.

    Args:
        settings: the instance's settings.
        files: :func:`~hps_core.load_record.model_files` of its model (empty when its
            ps.json does not parse: the model's own checks say why).
        records: the server's load records, or ``None`` (a server not started by
            ``hps serve`` or ``TritonServer``: nothing is compared).
    """

    def __init__(
        self,
        settings: ModelSettings,
        files: dict[str, tuple[str, ModelPath]],
        records: LoadRecords | None,
    ) -> None:
        self.settings = settings
        self.files = files
        self.records = records
        marker = settings.config.get("parameters", {}).get(RELOAD_PARAMETER, {})
        self.load = str(marker.get("string_value", ""))
        """Which load of the model this is (its :data:`RELOAD_PARAMETER`; empty for the first)."""
        self.restart = is_restart(self.load)
        """Whether this load is the stub watchdog's restart of the model."""
        self.initial: dict[str, FileStamp] = {}
        """The files as ``initialize`` read them (set by :meth:`settle`)."""
        self.stamps: dict[str, FileStamp] = {}
        """The files as the tables' opening read them (set by :meth:`before_opening`)."""
        self.changed: dict[str, str] = {}
        """Files that differ from the last load's record, with what changed (set by
        :meth:`opened`)."""
        self._failure: ModelFileError | None = None
        self._gauge: Any = None  # the family and its metric, kept as long as it is served

    @classmethod
    def settle(cls, settings: ModelSettings) -> ServedFiles:
        """The instance's files once none is being written (call it first in ``initialize``).

        Args:
            settings: the instance's settings.

        Returns:
            The files, stamped.

        Raises:
            ModelFileError: a file kept changing (naming it).
        """
        try:
            model = load_ps_config(settings.ps_json).model(settings.hps_model)
        except HPSError:
            files = {}  # the model's checks report the ps.json, with every problem in it
        else:
            files = model_files(settings.ps_json, model)
        served = cls(settings, files, LoadRecords.from_environment())
        served.initial = served.stamps = settled_stamps(files)
        return served

    def before_opening(self) -> None:
        """Stamp the files again, settled, right before the tables open (the first request's,
        when the model has no warm-up request, may come long after ``initialize``).

        Raises:
            ModelFileError: an earlier opening saw the files change while it read them, or a
                file keeps changing.
        """
        if self._failure is not None:
            raise self._failure
        self.stamps = settled_stamps(self.files)

    def opened(self, device: str) -> None:
        """After the tables opened: fail if a file changed while they were read; compare the
        files with the last load's record, say what changed, publish the gauge and record
        this load.

        Args:
            device: the instance's device label (``cpu`` or ``gpuN``), for the gauge.

        Raises:
            ModelFileError: a file changed since the instance read it (naming it).
        """
        s = self.settings
        now = read_stamps(self.files)
        # The tables were read since before_opening; the ps.json, dense and network files in
        # initialize: none of them may have changed since it was read.
        read_before = {k: v for k, v in self.initial.items() if v.what in _READ_AT_INITIALIZE}
        during = changes(read_before, {k: now[k] for k in read_before if k in now})
        during.update(changes(self.stamps, now))
        if during:
            self._failure = ModelFileError(
                f"model '{s.triton_model}': files changed while the instance read them, so "
                f"what it read may mix old and new contents: {self._describe(during, now)}. "
                "Load the model again once the files are written"
            )
            raise self._failure
        if self.records is None:
            return
        record = self.records.read(s.triton_model, s.version)
        served = None if record is None else record.baseline(self.load)
        self.changed = changes(served, now)
        if self.changed and self.restart:
            logger.error(
                "model '%s' version %d, instance %s: restarted after a stub process exited, it "
                "serves %s that changed since the model's last load, which no reload asked for: "
                "%s. The model served the previous rows until the stub exited; every instance "
                "now serves the files as they are on disk. Load a model again after changing "
                "its files (hps reload %s), so that the change is served when you choose",
                s.triton_model, s.version, s.instance_name or "?",
                plural(len(self.changed), "file"), self._describe(self.changed, now),
                s.triton_model,
            )  # fmt: skip
        elif self.changed:
            logger.info(
                "model '%s' version %d: read again %s changed since its last load: %s",
                s.triton_model, s.version, plural(len(self.changed), "file"),
                self._describe(self.changed, now),
            )  # fmt: skip
        self._publish(device)
        self.records.write(s.triton_model, s.version, LoadRecord(self.load, now, served))

    def _describe(self, found: dict[str, str], now: dict[str, FileStamp]) -> str:
        """:func:`describe_changes`, naming a ps.json written from the user's (a HugeCTR
        repository's translation) by the user's."""
        text = describe_changes(found, now)
        source = self.settings.source_ps_json
        if source is None:
            return text
        return text.replace(str(self.settings.ps_json), f"the translation of {source}")

    def _publish(self, device: str) -> None:
        # Imported here: only a stub has Triton's module (tests put a stand-in in its place).
        import triton_python_backend_utils as pb_utils

        s = self.settings
        family = pb_utils.MetricFamily(
            name=CHANGED_AT_RESTART[0],
            description=CHANGED_AT_RESTART[1],
            kind=pb_utils.MetricFamily.GAUGE,
        )
        labels = {"model": s.triton_model, "instance": s.instance_name, "device": device}
        metric = family.Metric(labels=labels)
        metric.set(len(self.changed) if self.restart else 0)
        self._gauge = (family, metric)
