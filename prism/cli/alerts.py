"""``prism alerts``: alert rules and dashboards written with your thresholds."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prism.common.argtypes import output_directory
from prism.common.output import EXIT_BAD_INPUT


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "alerts",
        help="write the alert rules (Prometheus and Grafana) and the Grafana dashboard, with your thresholds",
        description=(
            "Write OUT/prism-rules.yaml (a Prometheus rule file), OUT/grafana/alert-rules.yaml (Grafana alerting "
            "provisioning) and OUT/grafana/prism-dashboard.json. Thresholds and durations are settings: --set "
            "NAME=VALUE (names as in prism/deploy/alerting.py's AlertSettings, e.g. step_slowdown_ratio=1.3, "
            "switch_degraded_for=10m, selector='job=\"prism\",cluster=\"a\"'). --chart DIR regenerates the Helm "
            "chart's generated files instead (its thresholds are chart values)."
        ),
    )
    p.add_argument("--out", default=None, type=output_directory, help="output directory (made if missing)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE", help="change a threshold, duration or the selector (repeatable)")
    p.add_argument("--datasource-uid", default="prometheus", help="UID of the Prometheus data source the Grafana rules query (default: %(default)s)")
    p.add_argument("--chart", default=None, metavar="DIR", help="write the chart's templates/prometheusrule.yaml and files/prism-dashboard.json")
    p.add_argument("--list", action="store_true", help="print the settings and their defaults, and exit")
    p.set_defaults(func=cmd_alerts)


def cmd_alerts(args: argparse.Namespace) -> int:
    import dataclasses

    from prism.deploy import alerting

    if args.list:
        for f in dataclasses.fields(alerting.AlertSettings):
            print(f"{f.name:<26} {f.default!s}")
        return 0
    if not args.out and not args.chart:
        print("prism alerts: give --out DIR and/or --chart DIR (or --list)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.chart and args.settings:
        print("prism alerts: --set does not apply to --chart; set the chart's prometheusRule.settings values instead", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        settings = alerting.settings_from_strings(args.settings)
    except ValueError as e:
        print(f"prism alerts: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    import yaml

    from prism.deploy import grafana

    written = []
    if args.out:
        out = Path(args.out)
        (out / "grafana").mkdir(parents=True, exist_ok=True)
        files = {
            out / "prism-rules.yaml": alerting.GENERATED_HEADER + alerting.rules_yaml(settings),
            out / "grafana" / "alert-rules.yaml": alerting.GENERATED_HEADER + yaml.safe_dump(
                grafana.alert_provisioning(settings, args.datasource_uid), sort_keys=False, width=1000),
            out / "grafana" / "prism-dashboard.json": grafana.dashboard_json(settings),
        }
    else:
        files = {}
    if args.chart:
        chart = Path(args.chart)
        if not (chart / "Chart.yaml").is_file():
            print(f"prism alerts: {chart} is not a Helm chart (no Chart.yaml)", file=sys.stderr)
            return EXIT_BAD_INPUT
        (chart / "files").mkdir(exist_ok=True)
        files[chart / "templates" / "prometheusrule.yaml"] = alerting.helm_prometheus_rule()
        files[chart / "files" / "prism-dashboard.json"] = grafana.dashboard_json()
    for path, text in files.items():
        path.write_text(text)
        written.append(str(path))
    print("wrote " + ", ".join(written))
    return 0
