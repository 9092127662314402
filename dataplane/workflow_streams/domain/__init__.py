"""Pure domain rules: no I/O here. The HTTP layer, the workers and the operator all call these."""
