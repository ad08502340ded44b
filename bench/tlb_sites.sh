#!/bin/bash
# tlb_sites.sh OUT CMD... - run CMD under the tlb:tlb_flush tracepoint with
# kernel stack traces, in a private tracefs instance (root), and print the
# remote IPI sends (reason 4) of CMD's process by call site
# (bench/tlb_sites.py). Used for issue 13's breakdown in docs/benchmarks.md:
#   bench/tlb_sites.sh /tmp/t.txt target/release/examples/thpscan FILE 256 2 1
set -e
T=/sys/kernel/tracing
mountpoint -q $T || mount -t tracefs nodev $T
I=$T/instances/tlb-sites-$$
mkdir $I
trap 'echo 0 > $I/tracing_on; echo 0 > $I/events/tlb/tlb_flush/enable; echo "!stacktrace if reason == 4" > $I/events/tlb/tlb_flush/trigger; rmdir $I' EXIT
echo 65536 > $I/buffer_size_kb
echo 1 > $I/options/record-tgid
echo 'reason == 4' > $I/events/tlb/tlb_flush/filter
echo 'stacktrace if reason == 4' > $I/events/tlb/tlb_flush/trigger
echo 1 > $I/events/tlb/tlb_flush/enable
OUT=$1
shift
echo 1 > $I/tracing_on
"$@" &
PID=$!
wait $PID
echo 0 > $I/tracing_on
cat $I/trace > "$OUT"
python3 "$(dirname "$0")"/tlb_sites.py "$OUT" $PID
