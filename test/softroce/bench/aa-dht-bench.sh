#!/bin/bash
# lab: guests=2 timeout=900
# lab: gobuild=./cmd/aa-dht
#
# DHT inserts per second (the Active Access paper, section 4.1 and Figure
# 7), measured in one boot: guest 1 the target, guest 2 one source
# inserting a random workload of $DHT_N keys (default 2000) into a fresh
# volume, at 5% and 25% collisions, with
#   aa-*-poll / aa-*-event  Active Access: every insert one 8-byte active put,
#                           the handler (polling, or on the module's eventfd)
#                           inserts locally; transparent mode (the module) and
#                           library-mediated mode
#   rma                     the paper's Listing 2: remote compare-and-swap and
#                           fetch-and-add, blocking, busy-polled completions
#   am-poll / am-event      active messages: one 16-byte SEND per insert, a
#                           handler on a busy-polled (or event-driven) receive
#                           completion queue, batched re-posting
# The rate is the source's inserts over the time from its first insert to
# the end of the Flush after its last (every insert applied at the
# target). The target then checks that the volume holds every key exactly
# once. Rounds alternate the designs; medians of $DHT_ROUNDS rounds
# (default 3) and the ratios AA/RMA and AA/AM go to $LAB_OUT/aa-dht-bench.txt.
set -euo pipefail

n=${DHT_N:-2000}
rounds=${DHT_ROUNDS:-3}
designs=${DHT_DESIGNS:-"aa-transparent-poll aa-transparent-event aa-mediated-poll rma am-poll am-event"}
bin=$LAB_BIN/aa-dht
export GODEBUG=asyncpreemptoff=1 # spinning loops: no preemption signal every 10 ms (see cmd/rdmaperf)

flags() {
	case $1 in
	aa-transparent-poll) echo "-table aa -mode transparent -notify poll" ;;
	aa-transparent-event) echo "-table aa -mode transparent -notify event" ;;
	aa-mediated-poll) echo "-table aa -mode mediated -notify poll" ;;
	aa-mediated-event) echo "-table aa -mode mediated -notify event" ;;
	rma) echo "-table rma" ;;
	am-poll) echo "-table am -notify poll" ;;
	am-event) echo "-table am -notify event" ;;
	*) lab_fail "unknown design $1" ;;
	esac
}

server=$(lab_peer 1)
port=7700
: >"$LAB_OUT/results"
for r in $(seq "$rounds"); do
	for c in 0.05 0.25; do
		for d in $designs; do
			port=$((port + 1))
			tag=$d-$c-$r
			# shellcheck disable=SC2046
			if [ "$LAB_ROLE" = server ]; then
				"$bin" serve $(flags "$d") -addr "$LAB_ADDR:$port" -n "$n" -collisions "$c" \
					-until "$LAB_SHARED/barrier.done-$tag" >"$LAB_OUT/serve-$tag.log" 2>&1 &
				pid=$!
				for _ in $(seq 200); do grep -qs serving "$LAB_OUT/serve-$tag.log" && break; sleep 0.05; done
				lab_signal "ready-$tag"
				wait $pid || { cat "$LAB_OUT/serve-$tag.log"; lab_fail "target $tag failed"; }
				lab_signal "checked-$tag"
			else
				lab_wait "ready-$tag"
				line=$("$bin" insert $(flags "$d") -addr "$server:$port" -n "$n" -collisions "$c") ||
					lab_fail "source $tag failed"
				echo "$d $c $line" | tee -a "$LAB_OUT/results"
				lab_signal "done-$tag"
				lab_wait "checked-$tag"
			fi
		done
	done
done

[ "$LAB_ROLE" = server ] && exit 0

median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
rate() { awk -v d="$1" -v c="$2" '$1 == d && $2 == c { sub("rate=", "", $5); print $5 }' "$LAB_OUT/results" | median; }
{
	echo "DHT inserts per second, $n inserts, one source, median of $rounds rounds (one boot)"
	printf '%-22s %12s %12s\n' design 5% 25%
	for d in $designs; do
		printf '%-22s %12s %12s\n' "$d" "$(rate "$d" 0.05)" "$(rate "$d" 0.25)"
	done
	for c in 0.05 0.25; do
		for a in $designs; do
			case $a in aa-*) ;; *) continue ;; esac
			for b in rma am-poll am-event; do
				case " $designs " in *" $b "*) ;; *) continue ;; esac
				awk -v a="$(rate "$a" $c)" -v b="$(rate "$b" $c)" -v n="$a/$b at $c" 'BEGIN { printf "ratio %-40s %.2f\n", n, a / b }'
			done
		done
	done
} | tee "$LAB_OUT/aa-dht-bench.txt"
