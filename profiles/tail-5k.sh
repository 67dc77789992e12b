#!/bin/bash
# tail-5k.sh: where the pinboard's tail at 5 000 req/s is. Runs redis-server, a
# pinboard and a fleet-mode counter on 127.0.0.1 (ports 6399, 7100-7101, 7200-7201),
# places 1000 ids, then runs loadgen open loop at 5 000 req/s for $DUR (default 20s)
# and prints the client's latency next to the share of requests above each bound of
# the pinboard's upstream leg (pinned_proxy_upstream_duration_seconds: writing to the
# worker to reading its head) and of the worker's handler time
# (pinned_request_duration_seconds), both read from /metrics before and after.
# Run from the repository root on a quiet machine: profiles/tail-5k.sh
set -euo pipefail
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; redis-cli -p 6399 shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
go build -o "$dir/pinboard" ./cmd/pinboard
go build -o "$dir/counter" ./examples/counter
go build -o "$dir/loadgen" ./cmd/loadgen
T=bench-deployment-token-0123456789abcdef
redis-server --port 6399 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile "$dir/redis.log" --dir "$dir"
until redis-cli -p 6399 ping >/dev/null 2>&1; do sleep 0.1; done
PINBOARD_LISTEN=127.0.0.1:7100 PINBOARD_ADMIN_LISTEN=127.0.0.1:7101 PINBOARD_REDIS_URL=redis://127.0.0.1:6399/0 \
  PINBOARD_TOKEN=$T PINBOARD_RESTART_FENCE=0s "$dir/pinboard" 2>"$dir/pinboard.log" &
until curl -sf -o /dev/null 127.0.0.1:7100/healthz; do sleep 0.1; done
PINNED_LISTEN=127.0.0.1:7200 PINNED_ADMIN_LISTEN=127.0.0.1:7201 PINNED_PINBOARD_URL=http://127.0.0.1:7100 PINNED_TOKEN=$T \
  PINNED_ADVERTISE_URL=http://127.0.0.1:7200 "$dir/counter" -idle-timeout 1h -max-instances 2000000 2>"$dir/worker.log" &
for _ in $(seq 100); do curl -sf -o /dev/null 127.0.0.1:7200/healthz && break; sleep 0.1; done
"$dir/loadgen" -url http://127.0.0.1:7100 -c 64 -requests 20000 -duration 20s >/dev/null
curl -s 127.0.0.1:7101/metrics >"$dir/pb0"; curl -s 127.0.0.1:7201/metrics >"$dir/w0"
"$dir/loadgen" -url http://127.0.0.1:7100 -rate 5000 -c 64 -duration "${DUR:-20s}" 2>/dev/null | sed -n '/^latency/,/^schedule lag/p'
curl -s 127.0.0.1:7101/metrics >"$dir/pb1"; curl -s 127.0.0.1:7201/metrics >"$dir/w1"
above() { # $1 metric, $2 before, $3 after: the share of observations above each bucket bound
  awk -v m="$1" 'FNR==1{f++} index($0, m"_bucket{")==1 { match($0, /le="[^"]+"/); le=substr($0, RSTART+4, RLENGTH-5); v[f, le]+=$NF; if (f==1) order[++n]=le }
    END { tot=v[2,"+Inf"]-v[1,"+Inf"]; printf "%s: %d observations; share above\n", m, tot
          for (i=1; i<=n && order[i]+0<=0.005; i++) { le=order[i]; if (le=="+Inf") continue; printf "  %6.2f ms  %.4f\n", le*1000, 1-(v[2,le]-v[1,le])/tot } }' "$2" "$3"
}
above pinned_proxy_upstream_duration_seconds "$dir/pb0" "$dir/pb1"
above pinned_request_duration_seconds "$dir/w0" "$dir/w1"
