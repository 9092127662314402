"""Who owns a stream, and the tenant boundary between Kubernetes namespaces.

A stream defined through Kubernetes belongs to its WorkflowStream object (namespace, name, uid); one
defined over HTTP (or the Durable Streams surface) belongs to no object. The rules, which the store
applies under the run's lock and the stream's row lock:

- **A run belongs to one namespace**: the namespace whose WorkflowStream first defined a stream in it.
  A WorkflowStream elsewhere naming that run is refused (``OwnedElsewhere``), so no namespace can
  define, hold or delete streams of another namespace's runs, nor squat a stream id in them.
- **A stream belongs to one object**: another WorkflowStream naming the same run and stream, even in
  the same namespace, is refused; only the owner's deletion deletes, and only holds made through the
  owner's namespace on the owner object reach it.
- **Streams made over HTTP are not taken over**: an object adopts one only when the platform allows it
  (``WFS_OPERATOR_ADOPT``), the object asks for it (``ADOPT_ANNOTATION``) and the pins mean the same.
- Over HTTP, a stream owned by an object is deleted by deleting the object (``OwnedElsewhere``
  otherwise): the object would otherwise stay behind, claiming a stream that no longer exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import OwnedElsewhere

ADOPT_ANNOTATION = "workflowstreams.dev/adopt"


@dataclass(frozen=True)
class Owner:
    """The WorkflowStream object a stream belongs to."""

    namespace: str
    name: str
    uid: str

    def describe(self) -> str:
        return f"WorkflowStream {self.namespace}/{self.name}"

    def to_json(self) -> dict[str, str]:
        return {"kind": "WorkflowStream", "namespace": self.namespace, "name": self.name, "uid": self.uid}


def check_claim(stream: str, current: Owner | None, claimant: Owner, *, adopt: bool) -> bool:
    """Whether ``claimant`` may act as the owner of a stream now owned by ``current`` (None: made over
    HTTP). True when it must first record itself as owner (an adoption). Raises ``OwnedElsewhere``."""
    if current is not None:
        if current == claimant:
            return False
        raise OwnedElsewhere(
            f"stream {stream} belongs to {current.describe()}; this object cannot define, hold or delete it",
            owner=current.to_json(),
        )
    if not adopt:
        raise OwnedElsewhere(
            f"stream {stream} was created over the HTTP API and belongs to no WorkflowStream; an object adopts"
            f" it only where the operator allows adoption (WFS_OPERATOR_ADOPT=true) and the object is"
            f' annotated {ADOPT_ANNOTATION}: "true"',
            owner=None,
        )
    return True


def check_run(run_id: str, owning_namespace: str | None, claimant: Owner) -> None:
    """A run's streams are defined through one namespace only: the first one that defined a stream in it."""
    if owning_namespace is not None and owning_namespace != claimant.namespace:
        raise OwnedElsewhere(
            f"run {run_id} belongs to namespace {owning_namespace}: its streams are defined there only",
            owner={"kind": "Namespace", "name": owning_namespace},
        )


def check_run_prefix(run_id: str, prefix_template: str, namespace: str) -> None:
    """The platform's optional naming rule: a namespace's runs start with ``prefix_template`` (``{namespace}``
    stands for the namespace), so no namespace can claim a run id first that another one will use."""
    if not prefix_template:
        return
    prefix = prefix_template.replace("{namespace}", namespace)
    if not run_id.startswith(prefix):
        raise OwnedElsewhere(
            f"run {run_id} is outside namespace {namespace}: its runs start with {prefix!r}"
            " (the operator's WFS_OPERATOR_RUN_PREFIX)",
            owner=None,
            run_prefix=prefix,
        )
