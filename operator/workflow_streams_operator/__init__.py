"""The Kopf operator for WorkflowStream resources (import name differs: stdlib owns ``operator``)."""
