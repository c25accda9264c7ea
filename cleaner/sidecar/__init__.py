"""The sidecar: kafka-cleaner next to a Kafka broker, on the broker's data volume.

Modes (``spec.mode`` of the policy): ``observe`` only reads; ``compact`` runs the cleaner
while it holds each log dir's ``.lock`` (a stopped broker, a maintenance window);
``stage`` leaves cleaned segments as ``.swap`` sets that the broker's own start-up
commits. HTTP: ``/healthz``, ``/readyz``, ``/metrics`` (Prometheus) and ``/status`` (the
JSON report the operator reads).
"""
