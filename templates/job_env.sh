# gpurun job environment for host @@HOST@@ (profile @@PROFILE@@), written by `gpurun setup`.
# Every job sources this file with POSIX sh before its command; re-running setup rewrites
# it. Nothing here may fail or exit: a failing `.` would abort the job's shell.
export PYTHONUNBUFFERED=1
# Caches on the data disk, not the small system disk (storage fails on hidden caches).
export HF_HOME=@@HF_HOME@@
export PIP_CACHE_DIR=@@PIP_CACHE@@
@@PROXY@@
@@ENV@@
