"""MLflow: one MLflow run per algorithm, in an experiment named after the suite directory.

The tracking URI is `MLFLOW_TRACKING_URI` when set, else a file store `<out>/mlruns` beside the suite.
The run's id is kept in `<run>/<algorithm>/mlflow.json`, so a resumed run logs on into the same MLflow run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from fedistill import disk
from fedistill.config import RunConfig
from fedistill.engine.summary import results_markdown
from fedistill.engine.tracking_values import (
    Communication,
    artifacts,
    communication_scalars,
    config_params,
    final_scalars,
    history,
    resumed_round,
    row_scalars,
)
from fedistill.errors import ConfigError

log = logging.getLogger("fedistill")

#: MLflow's limits per `log_batch` call.
MAX_PARAMS, MAX_METRICS, MAX_PARAM_LENGTH = 100, 1000, 6000
#: A metric every logged round carries (its traffic total): which rounds a reopened MLflow run holds.
EVERY_ROUND = next(iter(communication_scalars({})))


def tracking_uri(run_dir: Path) -> str:
    """`MLFLOW_TRACKING_URI`, else the file store `<out>/mlruns` (the suite is `<out>/<suite>/`).

    MLflow 3 keeps its file store in maintenance mode and refuses it unless `MLFLOW_ALLOW_FILE_STORE`
    says otherwise; for this embedded default it is allowed (unless the variable is already set).
    """
    if uri := os.environ.get("MLFLOW_TRACKING_URI"):
        return uri
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (run_dir.resolve().parent.parent / "mlruns").as_uri()


#: Seconds the start waits for a tracking server's first answer (MLflow's client retries for minutes).
PROBE_TIMEOUT_S = 10.0


def check_reachable(uri: str) -> None:
    """ConfigError at once when an http(s) tracking server cannot be reached at all (refused, unknown host,
    no answer within PROBE_TIMEOUT_S): MLflow's own client would retry for minutes before saying so. Any
    HTTP answer, even an error status (a proxy, a server without /health), counts as reachable, and so does a
    TLS failure: the server answered, and MLflow's client may trust a certificate this probe does not
    (MLFLOW_TRACKING_SERVER_CERT_PATH, REQUESTS_CA_BUNDLE, MLFLOW_TRACKING_INSECURE_TLS)."""
    import http.client
    import ssl
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (ValueError, http.client.InvalidURL) as exc:  # a port that is no number, a broken IPv6 address
        raise ConfigError(f"track = mlflow: MLFLOW_TRACKING_URI = {uri!r} is no valid URL ({exc})") from None
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        if isinstance(why, ssl.SSLError) or isinstance(exc, ssl.SSLError):
            return
        raise ConfigError(
            f"track = mlflow: {uri} does not answer ({why}); start the tracking server, or set "
            "MLFLOW_TRACKING_URI to one that runs (unset: a file store beside the runs)"
        ) from None


class MlflowTracker:
    """Logs params at the start, metrics per round, and the run's results and files at the end."""

    def __init__(self) -> None:
        """ConfigError when MLflow is missing or its tracking server unreachable: made before the run writes
        anything (validate_setup)."""
        try:
            import mlflow.exceptions
            import mlflow.tracking  # noqa: F401
        except ImportError:
            raise ConfigError(
                "track = mlflow needs MLflow: pip install -e '.[track]' (or fedistill[track])"
            ) from None
        check_reachable(os.environ.get("MLFLOW_TRACKING_URI", ""))  # also before the run writes anything
        self.client: Any = None
        self.run_id = ""
        self.step = 0
        # the last round the MLflow run already holds (one an interrupted run logged); -1: none, as step 0
        # holds the set-up's traffic (FedIOD's stage 1)
        self.logged = -1

    def start(self, config: RunConfig, run_dir: Path, *, resume: bool = False) -> None:
        """On `resume`, log on into the MLflow run an interrupted run left, else create one with the config
        as params; ConfigError without a reachable server."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = tracking_uri(run_dir)
        # a resumed run that has no round left to train logs its final metrics at its last round, as
        # TensorBoard does, not at step 0
        self.step = resumed_round(run_dir)
        try:
            self.client = MlflowClient(tracking_uri=uri)
            # a new run in the folder of one that never did any work gets its own: that one's params differ
            reopened = self._reopen(run_dir, uri) if resume else ""
            self.run_id = reopened or self._create(config, run_dir, uri)
            if not reopened and self.step:  # `track` added on resume, or the MLflow run is gone
                for row, communication in history(run_dir):
                    self.log_round(row, communication)
        except MlflowException as exc:
            raise ConfigError(f"track = mlflow: {uri}: {exc.message}") from None

    def _reopen(self, run_dir: Path, uri: str) -> str:
        """The MLflow run an interrupted run logged to, when it is still there; else ""."""
        path = run_dir / "mlflow.json"
        if not path.is_file():
            return ""
        recorded = json.loads(path.read_text(encoding="utf-8"))
        if recorded.get("tracking_uri") != uri:
            return ""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(recorded["run_id"])
        except MlflowException:
            return ""
        if run.info.lifecycle_stage != "active":
            return ""
        self.client.update_run(run.info.run_id, status="RUNNING")
        history = self.client.get_metric_history(run.info.run_id, EVERY_ROUND)
        self.logged = max((int(m.step) for m in history), default=-1)
        log.info("mlflow: logging on into run %s", run.info.run_id)
        return str(run.info.run_id)

    def _create(self, config: RunConfig, run_dir: Path, uri: str) -> str:
        from mlflow.entities import Param

        name = run_dir.resolve().parent.name
        experiment = self.client.get_experiment_by_name(name)
        if experiment and experiment.lifecycle_stage != "active":  # deleted: its name stays taken
            raise ConfigError(
                f"track = mlflow: the MLflow experiment {name!r} in {uri} is deleted; restore it (mlflow "
                f"experiments restore --experiment-id {experiment.experiment_id}), remove it for good "
                "(mlflow gc), or run under another --name"
            )
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        run = self.client.create_run(
            experiment_id, run_name=config.algorithm, tags={"fedistill.run_dir": str(run_dir.resolve())}
        )
        run_id = str(run.info.run_id)
        params = [Param(k, v[:MAX_PARAM_LENGTH]) for k, v in config_params(config).items()]
        for at in range(0, len(params), MAX_PARAMS):
            self.client.log_batch(run_id, params=params[at : at + MAX_PARAMS])
        if (run_dir / "config.toml").is_file():
            self.client.log_artifact(run_id, str(run_dir / "config.toml"))
        record = {"tracking_uri": uri, "experiment_id": experiment_id, "run_id": run_id}
        disk.write_text(run_dir / "mlflow.json", json.dumps(record, indent=2) + "\n")
        return run_id

    def _log_metrics(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        for at in range(0, len(metrics), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[at : at + MAX_METRICS])

    def log_round(self, row: dict[str, Any], communication: Communication) -> None:
        """Log the round's metrics and traffic at the round's step, unless the MLflow run holds that round
        already: MLflow keeps every value logged at a step, so a round an interrupted run logged after its
        last checkpoint, run again on resume, would count twice in its history."""
        self.step = int(row["round"])
        if self.step <= self.logged:
            return
        self._log_metrics(row_scalars(row) | communication_scalars(communication), self.step)

    def finish(self, summary: dict[str, Any], run_dir: Path) -> None:
        """Log the final metrics, the results table and the run's files, then mark the MLflow run finished."""
        self._log_metrics(final_scalars(summary), self.step)
        self.client.log_text(self.run_id, results_markdown([summary]), "results.md")
        self.client.log_artifact(self.run_id, str(run_dir / "summary.json"))
        for folder, paths in artifacts(run_dir).items():
            for path in paths:
                self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder)
        self.client.set_terminated(self.run_id, "FINISHED")

    def abort(self) -> None:
        """Mark the MLflow run killed, when one was started."""
        if self.run_id:
            self.client.set_terminated(self.run_id, "KILLED")
