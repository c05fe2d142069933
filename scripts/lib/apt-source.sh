# shellcheck shell=bash
# Downloads a Debian source package with apt-get through a private apt state directory
# whose deb-src entry is derived from the machine's configured Debian sources; the
# system's apt configuration is never changed. Used by scripts/fetch-criu.sh (CRIU's
# upstream tarball) and scripts/build-crun-criu.sh (crun's source package). Sourced.

# apt_source_download DIR SUITES PACKAGE=VERSION: fetches the source package's files
# (.dsc, tarballs) into DIR/dl, apt's state into DIR (emptied first). apt-get's exit status
# is returned; the caller checks the files it needs (a mirror may lack the packaging files
# while the upstream tarball is there). Logs: DIR/update.log, DIR/source.log. Status 2:
# the machine's apt sources name no Debian archive; 3: the index could not be read.
apt_source_download() {
	local dir=$1 suites=$2 spec=$3 uris
	# The URIs of the machine's Debian archive (not the security archive).
	uris=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null |
		tr ' ' '\n' | grep -v -e security -e '^$' | grep -i debian | head -n1 || true)
	if [ -z "$uris" ] && [ -f /etc/apt/sources.list ]; then
		uris=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list)
	fi
	[ -n "$uris" ] || return 2
	rm -rf "$dir"
	mkdir -p "$dir/lists/partial" "$dir/archives/partial" "$dir/sources.list.d" "$dir/dl"
	cat >"$dir/sources.list.d/src.sources" <<SRC
Types: deb-src
URIs: $uris
Suites: $suites
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	local apt_opts=(-o "Dir::State=$dir" -o "Dir::State::Lists=$dir/lists"
		-o "Dir::Cache=$dir" -o "Dir::Etc::SourceList=/dev/null"
		-o "Dir::Etc::SourceParts=$dir/sources.list.d"
		-o "Dir::State::status=/var/lib/dpkg/status" -o "Debug::NoLocking=1")
	apt-get "${apt_opts[@]}" -qq update >"$dir/update.log" 2>&1 || return 3
	(cd "$dir/dl" && apt-get "${apt_opts[@]}" -qq source --download-only "$spec" >"$dir/source.log" 2>&1)
}
