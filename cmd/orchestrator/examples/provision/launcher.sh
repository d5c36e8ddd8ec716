#!/bin/sh
# A launcher for Tether's provisioning example (SPEC §14a): it starts
# single-use workers outside any step's process tree. A step cannot start a
# lasting worker itself: the worker kills what a step leaves running when it
# ends (SPEC §10). So a step hands the launcher an enrollment token by
# dropping a file NAME.token into SPOOL (written elsewhere in SPOOL first,
# then renamed, so the launcher never reads half of one), and the launcher
# starts `WORKER-COMMAND… --single-use` with it in $TETHER_WORKER_TOKEN and
# removes the file. In production the launcher is a cloud API or
# `systemd-run --unit tether-worker-N worker connect …`; this one is a shell
# loop for one host.
#
# Usage: launcher.sh SPOOL WORKER-COMMAND...
#   launcher.sh /run/tether-launcher worker connect --url ws://127.0.0.1:7420/control --labels pool=local
set -u
if [ $# -lt 2 ]; then
	echo "usage: launcher.sh SPOOL WORKER-COMMAND..." >&2
	exit 64
fi
spool=$1
shift
mkdir -p "$spool" && chmod 700 "$spool" || exit 1
echo "launcher: watching $spool" >&2
while :; do
	for f in "$spool"/*.token; do
		[ -f "$f" ] || continue
		tok=$(cat "$f")
		rm -f "$f"
		echo "launcher: starting a single-use worker for $(basename "$f")" >&2
		TETHER_WORKER_TOKEN=$tok "$@" --single-use </dev/null &
	done
	sleep 0.2
done
