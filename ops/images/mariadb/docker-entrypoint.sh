#!/bin/bash
# The entrypoint of the mysql/mariadb stand-in: the part of the official images' contract
# mariadb/Containerfile lists.
set -euo pipefail

# MARIADB_<name>, else MYSQL_<name>, else empty
var() { local m="MARIADB_$1" y="MYSQL_$1"; printf '%s' "${!m:-${!y:-}}"; }
# a string for a single-quoted SQL literal
esc() { local s=${1//\\/\\\\}; printf '%s' "${s//\'/\\\'}"; }
log() { echo "$(date -u '+%F %T') [Entrypoint]: $*" >&2; }

if [ "${1#-}" != "$1" ]; then
	set -- mariadbd "$@"
fi
case "$1" in
	mariadbd|mysqld) ;;
	*) exec "$@" ;;
esac

datadir=/var/lib/mysql
socket=/run/mysqld/mysqld.sock

if [ "$(id -u)" = 0 ]; then
	find "$datadir" \! -user mysql -exec chown mysql: '{}' +
	exec gosu mysql "${BASH_SOURCE[0]}" "$@"
fi

if [ ! -d "$datadir/mysql" ]; then
	root_password="$(var ROOT_PASSWORD)"
	if [ -z "$root_password" ]; then
		log "error: the database is uninitialized and no root password is given:" \
			"set MYSQL_ROOT_PASSWORD or MARIADB_ROOT_PASSWORD"
		exit 1
	fi
	database="$(var DATABASE)" user="$(var USER)" password="$(var PASSWORD)"
	log "initializing the database in $datadir"
	mariadb-install-db --datadir="$datadir" --auth-root-authentication-method=normal \
		--skip-test-db --skip-name-resolve >/dev/null
	log "starting a temporary server (socket only)"
	"$@" --skip-networking --socket="$socket" --skip-log-bin &
	pid=$!
	sql() { mariadb --protocol=socket --socket="$socket" -uroot "$@"; }
	for _ in $(seq 300); do
		if sql -e 'SELECT 1' >/dev/null 2>&1; then break; fi
		kill -0 "$pid"  # the server died: set -e ends the script
		sleep 0.1
	done
	health_password="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
	{
		echo "SET @@SESSION.SQL_LOG_BIN=0;"
		# mariadb-install-db's other root users (passwordless) and anonymous ones
		echo "DROP USER IF EXISTS root@'127.0.0.1', root@'::1', root@'$(esc "$(hostname)")';"
		echo "DROP USER IF EXISTS ''@'localhost', ''@'$(esc "$(hostname)")';"
		echo "ALTER USER root@localhost IDENTIFIED BY '$(esc "$root_password")';"
		echo "CREATE USER root@'%' IDENTIFIED BY '$(esc "$root_password")';"
		echo "GRANT ALL ON *.* TO root@'%' WITH GRANT OPTION;"
		for host in 127.0.0.1 ::1 localhost; do
			echo "CREATE USER healthcheck@'$host' IDENTIFIED BY '$health_password';"
			echo "GRANT USAGE ON *.* TO healthcheck@'$host';"
		done
		if [ -n "$database" ]; then
			echo "CREATE DATABASE IF NOT EXISTS \`${database//\`/\`\`}\`;"
		fi
		if [ -n "$user" ] && [ -n "$password" ]; then
			echo "CREATE USER '$(esc "$user")'@'%' IDENTIFIED BY '$(esc "$password")';"
			if [ -n "$database" ]; then
				echo "GRANT ALL ON \`${database//\`/\`\`}\`.* TO '$(esc "$user")'@'%';"
			fi
		fi
	} | sql
	printf '[mariadb-client]\nport=3306\nsocket=%s\nuser=healthcheck\npassword=%s\n' \
		"$socket" "$health_password" > "$datadir/.my-healthcheck.cnf"
	chmod 600 "$datadir/.my-healthcheck.cnf"
	export MYSQL_PWD="$root_password"
	for f in /docker-entrypoint-initdb.d/*; do
		[ -e "$f" ] || continue
		case "$f" in
			*.sh)
				if [ -x "$f" ]; then log "running $f"; "$f"
				else log "sourcing $f"; . "$f"; fi ;;
			*.sql) log "running $f"; sql ${database:+--database="$database"} < "$f" ;;
			*.sql.gz) log "running $f"; gunzip -c "$f" | sql ${database:+--database="$database"} ;;
			*) log "ignoring $f" ;;
		esac
	done
	unset MYSQL_PWD
	kill -TERM "$pid"
	wait "$pid" || true
	log "initialization done"
fi

exec "$@"
