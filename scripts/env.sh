# Sourced by scripts/bootstrap, scripts/dev and scripts/test: where things live.
# The tool cache ($WFS_CACHE) holds what every checkout may share: Go-built binaries, module downloads.
# The Python environment is per checkout (its editable install points at one checkout's sources), so
# it lives under the cache keyed by the checkout's path; WFS_VENV names another one.
CACHE="${WFS_CACHE:-$HOME/.cache/workflow-streams}"
CHECKOUT="$(pwd -P)"
VENV="${WFS_VENV:-$CACHE/venvs/$(basename "$CHECKOUT")-$(printf '%s' "$CHECKOUT" | sha256sum | cut -c1-12)}"
