"""What every command shares: the catalog (read once, on first use), the workspace, -v, and the
command-line settings that replace the catalog's for one run."""

from __future__ import annotations

from pathlib import Path

import click


class State:
    # The state of the command running now: its error, printed after click has let go of it, names
    # the catalog file the command read (``catalog_file_name``).
    current: State | None = None

    def __init__(self, catalog_path: Path | None, verbose: bool):
        self.catalog_path = catalog_path
        self.verbose = verbose
        self._catalog = None
        State.current = self

    def catalog_file_name(self) -> str | None:
        """The name of the catalog file this command reads (``--catalog``), None where it reads
        none of its own naming."""
        if self._catalog is not None:
            return self._catalog.file_name
        return Path(self.catalog_path).name if self.catalog_path else None

    @property
    def catalog(self):
        if self._catalog is None:
            from pipeline.runtimes import load_catalog

            self._catalog = load_catalog(self.catalog_path)
        return self._catalog

    def context(self, force: bool = False):
        from pipeline.launchers.restart import forced_done_before
        from pipeline.running.reporting import Reporter
        from pipeline.stages.base import RunContext
        from pipeline.workspace import Workspace

        return RunContext(
            catalog=self.catalog,
            workspace=Workspace(self.catalog.root),
            reporter=Reporter(verbose=self.verbose),
            force=force,
            # Going on after a fault in a fresh process: what --force already redid stays done.
            done=forced_done_before(),
        )

    def override(
        self, calib_dir=None, calib_samples=None, eval_dir=None, repeat=None, racing=None, sanitize=None, streams=None, by=None, energy=None
    ) -> None:
        """This run's command-line settings in place of the catalog's."""
        self._catalog = self.catalog.with_overrides(calib_dir, calib_samples, eval_dir, repeat, racing, sanitize, streams, by, energy)

    def use_catalog(self, catalog) -> None:
        """This run's catalog from here on (a planned variant measured before it is in the file)."""
        self._catalog = catalog

    def override_evaluation(self, **settings) -> None:
        """This run's [evaluation] settings (data, metric) in place of the catalog's; None keeps it."""
        update = {key: value for key, value in settings.items() if value is not None}
        if update:
            evaluation = self.catalog.evaluation.model_copy(update=update)
            self._catalog = self.catalog.model_copy(update={"evaluation": evaluation})

    def toolchains(self, toolchains: tuple[str, ...], trts: tuple[str, ...], archs: tuple[str, ...] = ()) -> list[str]:
        """The toolchains named by --toolchain and --trt (or the catalog's default), with --arch
        applied to those that compile ahead of time (a sweep may mix them with others)."""
        from pipeline.running.errors import UsageError

        names = self.catalog.toolchains_named(toolchains, trts)
        if archs:
            refusals = []
            for name in names:
                try:
                    self._catalog = self.catalog.with_targets(name, archs)
                except UsageError as exc:
                    refusals.append(exc)
            if len(refusals) == len(names):
                raise refusals[0]
        return names

    def holding_workspace(self, wait: bool):
        """The workspace lock, for commands that run stages (pipeline/workspace/lock.py)."""
        from pipeline.running.reporting import Reporter
        from pipeline.workspace import Workspace
        from pipeline.workspace.lock import workspace_lock

        return workspace_lock(Workspace(self.catalog.root).manifests_dir, Reporter(verbose=self.verbose), wait)


pass_state = click.make_pass_decorator(State)
