#!/bin/sh
# gpurun setup probe: one read-only round trip that reports what a fresh box offers.
# Usage: sh -s -- PATH... < setup_probe.sh   (PATHs may start with ~/; nothing is created)
# Prints one JSON document between the gpurun reply sentinels; raw tool output is sent as
# text and parsed on the controller, so no shell regex runs here.
# POSIX sh only: it must run on images without bash, python or GNU tools.

LC_ALL=C
export LC_ALL

# JSON string from stdin: escape \ and ", drop control chars except tab/newline.
js() {
    tr -d '\000-\010\013-\037' | awk 'BEGIN { ORS = ""; print "\"" }
        { gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t");
          if (NR > 1) print "\\n"; print }
        END { print "\"" }'
}
jv() { printf '%s' "$1" | js; }
have() { command -v "$1" >/dev/null 2>&1; }
# Run a command, capture up to 200 lines of stdout+stderr as a JSON string.
cap() { "$@" 2>&1 | head -n 200 | js; }

printf '\n<<<GPURUN-REPLY-7f3a>>>\n{'
printf '"probe":1,"user":%s,"home":%s,"uname":%s,' \
    "$(jv "$(id -un 2>/dev/null)")" "$(jv "$HOME")" "$(jv "$(uname -srm 2>/dev/null)")"

# Python: the agent needs >= 3.8.
py=""
for c in python3 python; do
    if have "$c"; then py=$(command -v "$c"); break; fi
done
pyver=""
[ -n "$py" ] && pyver=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)
printf '"python":{"path":%s,"version":%s},' "$(jv "$py")" "$(jv "$pyver")"

# GPUs: the CSV query and the banner (driver + CUDA version), parsed on the controller.
if have nvidia-smi; then
    q=$(nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1)
    qrc=$?
    printf '"nvidia_smi":{"path":%s,"query":%s,"query_rc":%d,"banner":%s},' \
        "$(jv "$(command -v nvidia-smi)")" "$(jv "$q")" "$qrc" "$(nvidia-smi 2>&1 | head -n 6 | js)"
else
    printf '"nvidia_smi":null,'
fi

# Each asked path: expanded, its nearest existing ancestor (physical), df and df -i rows.
printf '"paths":['
sep=""
for p in "$@"; do
    case "$p" in
        "~") e="$HOME" ;;
        "~/"*) e="$HOME/${p#\~/}" ;;
        *) e="$p" ;;
    esac
    q="$e"
    while [ ! -e "$q" ]; do q=$(dirname "$q"); done
    real=$(cd "$q" 2>/dev/null && pwd -P)
    exists=false; [ -e "$e" ] && exists=true
    writable=false; [ -w "$q" ] && writable=true
    printf '%s{"asked":%s,"expanded":%s,"exists":%s,"nearest":%s,"writable":%s,"df":%s,"dfi":%s}' \
        "$sep" "$(jv "$p")" "$(jv "$e")" "$exists" "$(jv "$real")" "$writable" \
        "$(df -Pk "$q" 2>&1 | tail -n 1 | js)" "$(df -Pi "$q" 2>&1 | tail -n 1 | js)"
    sep=","
done
printf '],'

printf '"mounts":%s,' "$(head -c 65536 /proc/mounts 2>/dev/null | js)"

# Memory: cgroup v2, else v1, else the whole machine.
cg_max=""; cg_cur=""
if [ -r /sys/fs/cgroup/memory.max ]; then
    cg_max=$(cat /sys/fs/cgroup/memory.max); cg_cur=$(cat /sys/fs/cgroup/memory.current 2>/dev/null)
elif [ -r /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
    cg_max=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
    cg_cur=$(cat /sys/fs/cgroup/memory/memory.usage_in_bytes 2>/dev/null)
fi
memtotal=$(awk '/^MemTotal:/ { printf "%.0f", $2 * 1024 }' /proc/meminfo 2>/dev/null)
printf '"memory":{"cgroup_max":%s,"cgroup_current":%s,"total":%s},' \
    "$(jv "$cg_max")" "$(jv "$cg_cur")" "$(jv "$memtotal")"

# Tools and boot-hook primitives.
printf '"tools":{'
sep=""
for t in rsync tmux setsid nohup crontab systemctl loginctl tar; do
    printf '%s"%s":%s' "$sep" "$t" "$(have "$t" && echo true || echo false)"
    sep=","
done
printf '},'
sd_user=false
if have systemctl && systemctl --user show-environment >/dev/null 2>&1; then sd_user=true; fi
printf '"systemd_user":%s,' "$sd_user"

# Provider fingerprints (names only, never values of secrets).
printf '"provider_env":{"RUNPOD_POD_ID":%s,"RUNPOD_GPU_COUNT":%s,"CONTAINER_ID":%s},' \
    "$(jv "${RUNPOD_POD_ID:-}")" "$(jv "${RUNPOD_GPU_COUNT:-}")" "$(jv "${CONTAINER_ID:-}")"
nt=false; [ -r /etc/network_turbo ] && nt=true
os=false; [ -f /root/onstart.sh ] && os=true
printf '"files":{"network_turbo":%s,"onstart":%s}' "$nt" "$os"

printf '}\n<<<GPURUN-END-7f3a>>>\n'
