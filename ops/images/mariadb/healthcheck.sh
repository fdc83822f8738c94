#!/bin/bash
# healthcheck.sh TEST...: the official mariadb image's health check, its --connect and
# --innodb_initialized tests (mariadb/Containerfile); every test given must pass. Run as
# the healthcheck users the entrypoint made, whose password it keeps in the data directory.
set -eo pipefail
datadir=/var/lib/mysql
defaults=()
if [ -f "$datadir/.my-healthcheck.cnf" ]; then
	defaults=(--defaults-extra-file="$datadir/.my-healthcheck.cnf")
fi
query() {  # query PROTOCOL SQL: the single value, or an error message
	mariadb "${defaults[@]}" --protocol "$1" --skip-ssl -B --skip-column-names \
		-e "$2" 2>&1
}

# the real server answers: networking on (the temporary server of the first start has it
# off), asked over the socket, else over TCP, where a refused login still means it answers
connect() {
	local s
	s="$(query socket 'SELECT @@skip_networking')" || true
	case "$s" in
		0) return 0 ;;
		1) return 1 ;;
	esac
	s="$(mariadb "${defaults[@]}" --skip-ssl -h localhost --protocol tcp -B \
		--skip-column-names -e 'SELECT @@skip_networking' 2>&1)" || true
	case "$s" in
		0|ERROR\ 1[0-9][0-9][0-9]\ \(28000\)*) return 0 ;;
		*) return 1 ;;
	esac
}

# InnoDB is up (crash recovery done)
innodb_initialized() {
	[ "$(query socket "SELECT 1 FROM information_schema.ENGINES WHERE engine='innodb' AND support IN ('YES', 'DEFAULT', 'ENABLED')")" = 1 ]
}

if [ $# -eq 0 ]; then
	echo "At least one argument required" >&2
	exit 1
fi
for arg in "$@"; do
	case "$arg" in
		--connect) connect ;;
		--innodb_initialized) innodb_initialized ;;
		*) echo "healthcheck.sh: $arg is not among this stand-in's tests (--connect, --innodb_initialized)" >&2; exit 1 ;;
	esac
done
