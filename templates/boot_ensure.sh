#!/bin/sh
# gpurun boot hook for host @@HOST@@: after a reboot, start the agent again (idempotent).
# Written by `gpurun setup`; the cron / onstart / systemd entry only runs this file.
STATE=@@STATE@@
PY=@@PYTHON@@
pyz=$(ls -t "$STATE"/bin/agent-*.pyz 2>/dev/null | head -n 1)
# No agent pushed yet: the first gpurun call against this host will push and start it.
[ -n "$pyz" ] || exit 0
build=$(basename "$pyz" .pyz)
build=${build#agent-}
printf '{"build": "%s", "detach": "%s"}\n' "$build" @@DETACH@@ |
    "$PY" "$pyz" ensure --state-dir "$STATE" >> "$STATE/boot.log" 2>&1
