"""The sidecar: kafka-cleaner next to a Kafka broker, on the broker's data volume.

Modes (``spec.mode`` of the policy): ``observe`` only reads; ``compact`` runs the cleaner
while it holds each log dir's ``.lock``, in the start-up gate or a maintenance window;
``stage`` cleans where the broker never looks and commits under ``.lock`` while the broker
is stopped (``cleaner.sidecar.service`` has the gate, ``cleaner.sidecar.stage`` the rest).
HTTP: ``/healthz``, ``/startupz``, ``/readyz``, ``/metrics`` (Prometheus) and ``/status``
(the JSON report the operator reads).
"""
