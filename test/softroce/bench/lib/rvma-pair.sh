# Helpers of the two-guest RVMA benchmarks (rvma-guests-bench.sh,
# rvma-counting-bench.sh), sourced by them: each runs a tool pair, server on
# guest 1, client on guest 2, for one size, with iteration counts fitted
# to TCG between guests.
P="$LAB_BIN/rdmaperf"
server=$(lab_peer 1)

iters() { # size test: a one-way trip costs about 1 ms, TCG moves ~15 MB/s between guests
	if [ "${2%_bw}" != "$2" ]; then
		echo $(( $1 >= 1048576 ? 160 : $1 >= 262144 ? 320 : 640 ))
	else
		echo $(( $1 >= 1048576 ? 30 : $1 >= 262144 ? 60 : $1 >= 32768 ? 200 : 500 ))
	fi
}

perftest() { # test size
	local t=$1 s=$2 n
	n=$(iters "$s" "$t")
	lab_pair perftest 18515 "$t" "$s" ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" -- ib_$t -d "$LAB_DEVICE" -x 1 -s "$s" -n "$n" "$server"
}

rdmaperf() { # name test size [flags]
	local name=$1 t=$2 s=$3 n
	shift 3
	n=$(iters "$s" "$t")
	lab_pair "$name" 18516 "$t" "$s" "$P" -d "$LAB_DEVICE" -timeout 10m -- "$P" -d "$LAB_DEVICE" -t "$t" -s "$s" -n "$n" -timeout 10m "$@" "$server"
}
