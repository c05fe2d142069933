# shellcheck shell=bash
# The test peer of CRIU's image-streamer protocol (test/gpu/streamer.py, playing
# criu-image-streamer) for the --stream cases of test/gpu/run.sh and test/sdma/run.sh.
# Sourced after scripts/lib/cases.sh (fail, alive); bash only.

streamer() { /usr/bin/python3 "$top/test/gpu/streamer.py" "$@"; }

# stream_start MODE DIR STREAM: starts the peer (capture or serve) on DIR in the
# background, its requests logged to DIR/streamer-MODE.log; sets STREAMER_PID.
stream_start() {
	local mode=$1 dir=$2 stream=$3 i
	mkdir -p "$dir"
	# A previous peer's "socket-init" must not be read as this one's: the
	# background job truncates the file only once it runs.
	rm -f "$dir/streamer-$mode.out"
	streamer "$mode" "$dir" "$stream" >"$dir/streamer-$mode.out" 2>"$dir/streamer-$mode.log" &
	STREAMER_PID=$!
	for ((i = 0; i < 400; i++)); do
		grep -q socket-init "$dir/streamer-$mode.out" 2>/dev/null && return 0
		alive "$STREAMER_PID" || break
		sleep 0.05
	done
	fail "the test streamer did not start ($mode): $(cat "$dir/streamer-$mode.log")"
}
