"""A throwaway kopf operator for fakekube's end-to-end test; it is not the project's operator.

It leans on what the real operator will: a create handler that patches status and posts an Event,
and a delete handler, which makes kopf add its finalizer and remove it once the handler ran. The
resource is a test-only ``Widget`` (``samples.fakekube.test``), defined by the test.
"""

from __future__ import annotations

from typing import Any

import kopf

GROUP, VERSION, PLURAL = "samples.fakekube.test", "v1", "widgets"


@kopf.on.create(GROUP, VERSION, PLURAL)
def create_fn(spec: kopf.Spec, patch: kopf.Patch, body: kopf.Body, **_: Any) -> dict[str, Any]:
    patch.status["phase"] = "Ready"
    kopf.info(body, reason="Created", message=f"widget of size {spec.get('size')}")
    return {"size": spec.get("size")}


@kopf.on.delete(GROUP, VERSION, PLURAL)
def delete_fn(body: kopf.Body, **_: Any) -> None:
    kopf.info(body, reason="Deleting", message="widget released")
