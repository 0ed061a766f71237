#!/usr/bin/env bash
# For stages longer than one call on the GPU machine (model, scale): the
# first call starts `bench/gpu_check.sh STAGES` in a session of its own,
# from a copy of the tree (the next call's copy of the working tree must
# not rewrite the files a running job imports); every call, the first
# included, waits up to WAIT seconds (default 540) for it to end, then
# leaves its logs and tables in $OUT (out.tgz) and prints the end of them.
#   bash bench/gpu_background.sh scale        # again until it says "ended"
set -u
W=/tmp/sf-background
cd "$(dirname "$0")/.."
if [ ! -f "$W/started" ]; then
  rm -rf "$W"; mkdir -p "$W/out"
  cp -a . "$W/src"
  touch "$W/started"
  (cd "$W/src" && OUT="$W/out" setsid nohup bash -c \
     'bash bench/gpu_check.sh "$@"; echo $? > '"$W/done" sh "$@" > "$W/log" 2>&1 < /dev/null &)
  echo "started: bench/gpu_check.sh $* (in $W/src)"
fi
for _ in $(seq 1 "${WAIT:-540}"); do [ -f "$W/done" ] && break; sleep 1; done
tar czf "${OUT:-/tmp}/out.tgz" -C "$W" out log 2>/dev/null
tail -c 8000 "$W/log"
if [ -f "$W/done" ]; then echo "ended (exit $(cat "$W/done"))"; else echo "still running"; fi
