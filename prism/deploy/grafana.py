"""Grafana objects for Prism: the dashboard and the alerts as Grafana-managed rules.

Both are built with grafana-foundation-sdk's typed builders (Grafana 11.6
schema), so a panel or rule field Grafana does not know fails here, at
generation time, not on import into Grafana.

* :func:`dashboard` - jobs, step time and slowdown per job, anomalies, group
  lag, collectives (bus bandwidth, rate, duration per job and kind), a
  switch bandwidth heat map and the daemon's health, with a data source
  and a job variable.
* :func:`alert_provisioning` - the alerts of :mod:`prism.deploy.alerting` as a
  Grafana file-provisioning document (``apiVersion: 1``, ``groups``): query A
  is the Prometheus expression, B reduces it to its last value, C fires when
  B is above zero (each expression returns a positive value only while its
  condition holds, and nothing otherwise; no data is OK).
"""
from __future__ import annotations

import json
import re

from grafana_foundation_sdk.builders import alerting as ga
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import expr as gx
from grafana_foundation_sdk.builders import heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as ga_models
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

from prism.deploy.alerting import ALERTS, GROUP, AlertSettings, prometheus_rules

__all__ = ["dashboard", "dashboard_json", "alert_provisioning", "DASHBOARD_UID", "FOLDER"]

DASHBOARD_UID = "prism-overview"
FOLDER = "Prism"
_DS = DataSourceRef(type_val="prometheus", uid="${datasource}")


def _q(expr: str, legend: str = "", instant: bool = False) -> Dataquery:
    q = Dataquery().expr(expr).datasource(_DS)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q


def _ts(title: str, unit: str, *queries: Dataquery, description: str = "", span: int = 12) -> timeseries.Panel:
    p = timeseries.Panel().title(title).unit(unit).span(span).height(8).datasource(_DS)
    if description:
        p = p.description(description)
    for q in queries:
        p = p.with_target(q)
    return p


def dashboard(settings: AlertSettings | None = None) -> gd.Dashboard:
    """The Prism overview dashboard (a builder; ``.build()`` gives the model)."""
    sel = (settings or AlertSettings()).selector
    job = f'{sel},job_id=~"$job_id"' if sel else 'job_id=~"$job_id"'
    return (
        gd.Dashboard("Prism: training jobs and fabric")
        .uid(DASHBOARD_UID)
        .description("Black-box diagnosis of LLM training jobs from mirrored RoCEv2 flows (prism daemon).")
        .tags(["prism", "training", "rdma"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(
            gd.QueryVariable("job_id").label("Job").datasource(_DS)
            .query(f"label_values(prism_job_info{{{sel}}}, job_id)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).multi(True).include_all(True)
        )
        .with_row(gd.Row("Jobs"))
        .with_panel(stat.Panel().title("Jobs").span(4).height(6).datasource(_DS)
                    .with_target(_q(f"max(prism_jobs{{{sel}}})", instant=True)))
        .with_panel(table.Panel().title("Jobs recognised").span(20).height(6).datasource(_DS)
                    .description("GPUs, servers and DP x PP shape of each job.")
                    .with_target(_q(f"max by (job_id, gpus, servers, dp, pp) (prism_job_info{{{job}}})", instant=True)
                                 .format("table")))  # type: ignore[arg-type]  # the SDK's StrEnums (3.11+) read as str under mypy's 3.10
        .with_panel(_ts("Step time per job", "s",
                        _q(f"max by (job_id) (prism_step_duration_seconds{{{job}}})", "{{job_id}}"),
                        description="Duration of each job's last complete step.", span=12))
        .with_panel(_ts("Step slowdown per job", "x",
                        _q(f"max by (job_id) (prism_step_slowdown_ratio{{{job}}})", "{{job_id}}"),
                        description="Last step over the job's baseline (1 = normal).", span=12))
        .with_panel(_ts("Anomalies", "short",
                        _q(f"sum by (kind, job_id) (increase(prism_anomalies_total{{{sel}}}[$__rate_interval]))",
                           "{{kind}} {{job_id}}"),
                        description="Slow steps, regime changes, slow groups, slow switches and links found.", span=12))
        .with_panel(_ts("Group lag", "x",
                        _q(f"max by (job_id, group) (prism_group_lag_ratio{{{job}}})", "{{job_id}} {{group}}"),
                        description="Pipeline-stage compute time of a group (server) over its peers' (1 = normal).", span=12))
        .with_row(gd.Row("Collectives"))
        .with_panel(_ts("Collective bus bandwidth", "Bps",
                        _q(f"max by (job_id, kind) (prism_collective_bus_bandwidth_bytes_per_second{{{job}}})", "{{job_id}} {{kind}}"),
                        description="Per job and kind (DP ring, PP send/recv, EP all-to-all, CP ring), the collectives counted at the last window: "
                                    "wire bytes over sending NICs times duration (NCCL-tests' busbw).", span=8))
        .with_panel(_ts("Collectives per second", "ops",
                        _q(f"max by (job_id, kind) (rate(prism_collectives_total{{{job}}}[$__rate_interval]))", "{{job_id}} {{kind}}"),
                        description="Collectives seen on the network, per job and kind.", span=8))
        .with_panel(_ts("Collective duration p95", "s",
                        _q(f'max by (job_id, kind) (prism_collective_duration_seconds{{{job},quantile="0.95"}})', "{{job_id}} {{kind}}"),
                        description="95th percentile duration of the collectives counted at the last window (first flow start to last flow end).",
                        span=8))
        .with_row(gd.Row("Fabric"))
        .with_panel(
            heatmap.Panel().title("Switch bandwidth (heat map)").span(24).height(10).datasource(_DS)
            .description("Each switch's effective bandwidth over its tier's median, per window (1 = like its peers).")
            .calculate(False)
            .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.AUTO))  # type: ignore[arg-type]  # as above
            .color(heatmap.HeatmapColorOptions().mode("scheme").scheme("RdYlGn").min(0).max(1.2))  # type: ignore[arg-type]  # as above
            .with_target(_q(f"min by (switch) (prism_switch_bandwidth_ratio{{{sel}}})", "{{switch}}"))
        )
        .with_panel(_ts("Switch bandwidth", "Bps",
                        _q(f"max by (switch) (prism_switch_bandwidth_bytes_per_second{{{sel}}})", "{{switch}}"), span=24))
        .with_row(gd.Row("Daemon health"))
        .with_panel(_ts("Flow records", "rps",
                        _q(f"sum(max by (partition) (rate(prism_flows_ingested_total{{{sel}}}[$__rate_interval])))", "ingested"),
                        _q(f"sum by (reason) (max by (partition, reason) (rate(prism_flows_rejected_total{{{sel}}}[$__rate_interval])))",
                           "rejected: {{reason}}"),
                        _q(f"sum by (reason) (max by (partition, reason) (rate(prism_flows_ignored_total{{{sel}}}[$__rate_interval])))",
                           "ignored: {{reason}}"),
                        _q(f"sum(rate(prism_flows_shed_total{{{sel}}}[$__rate_interval]))", "shed"), span=12))
        .with_panel(_ts("Consumer lag", "short",
                        _q(f"sum(prism_consumer_lag_records{{{sel}}})", "records behind"), span=6))
        .with_panel(_ts("Analysis delay", "s",
                        _q(f"time() - max(prism_analysed_until_timestamp_seconds{{{sel}}})", "event time behind now"),
                        _q(f"histogram_quantile(0.95, sum by (le) (rate(prism_window_processing_seconds_bucket{{{sel}}}[$__rate_interval])))",
                           "window analysis p95"), span=6))
        .with_panel(_ts("Replicas up and ready", "short",
                        _q(f"sum(up{{{sel}}})", "up"), _q(f"sum(prism_ready{{{sel}}})", "ready"), span=12))
        .with_panel(_ts("Window", "short",
                        _q(f"sum(prism_window_flows{{{sel}}})", "flows in window"), span=12))
    )


def dashboard_json(settings: AlertSettings | None = None) -> str:
    """The dashboard as Grafana JSON (what the chart's ConfigMap and alerts/grafana/ ship)."""
    return JSONEncoder(sort_keys=True, indent=2).encode(dashboard(settings).build()) + "\n"


def _grafana_template(text: str) -> str:
    # Grafana's templates know $labels but give the queries' values as $values.<refId>
    return re.sub(r"\$value\b", "$values.B.Value", text)


def alert_rules(settings: AlertSettings | None = None, datasource_uid: str = "prometheus") -> list[ga_models.Rule]:
    """Each Prism alert as a typed Grafana rule."""
    settings = settings or AlertSettings()
    prom = {r["alert"]: r for r in prometheus_rules(settings)["groups"][0]["rules"]}
    rules = []
    for alert in ALERTS:
        r = prom[alert.name]
        a = (ga.Query("A").datasource_uid(datasource_uid)
             .relative_time_range(ga_models.RelativeTimeRange(from_val=600, to=0))
             .model(Dataquery().expr(r["expr"]).instant().ref_id("A")))
        b = ga.Query("B").datasource_uid("__expr__").model(gx.TypeReduce().ref_id("B").expression("A").reducer("last"))
        c = ga.Query("C").datasource_uid("__expr__").model(
            gx.TypeThreshold().ref_id("C").expression("B").conditions([
                gx.ExprTypeThresholdConditions().evaluator(
                    gx.ExprTypeThresholdConditionsEvaluator().type("gt").params([0]))
            ]))
        rule = (ga.Rule(alert.name).uid(_uid(alert.name)).condition("C").queries([a, b, c])
                .for_val(r["for"]).no_data_state("OK").exec_err_state("Error")
                .labels(dict(r["labels"]))
                .annotations({k: _grafana_template(v) for k, v in r["annotations"].items()})
                .folder_uid("prism").rule_group(GROUP).org_id(1))
        rules.append(rule.build())
    return rules


def _uid(name: str) -> str:
    return "prism-" + re.sub(r"(?<!^)(?=[A-Z])", "-", name.removeprefix("Prism")).lower()


def alert_provisioning(settings: AlertSettings | None = None, datasource_uid: str = "prometheus",
                       interval: str = "1m") -> dict:
    """A Grafana alerting provisioning file (``provisioning/alerting/*.yaml``) as a mapping."""
    rules = []
    for rule in alert_rules(settings, datasource_uid):
        doc = json.loads(JSONEncoder().encode(rule))
        # provisioning files name the folder and group at the group level
        for key in ("folderUID", "ruleGroup", "orgID", "id", "updated", "provenance"):
            doc.pop(key, None)
        rules.append(doc)
    return {"apiVersion": 1, "groups": [{"orgId": 1, "name": GROUP, "folder": FOLDER, "interval": interval, "rules": rules}]}
