"""What the deployment files are generated from: alert rules and Grafana dashboards.
"""
