#!/bin/sh
# The redis:7 image's entrypoint, as docker-library/redis writes it (redis/Containerfile).
set -e

# first argument an option (-f, --some-option) or a configuration file (something.conf)
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- redis-server "$@"
fi

# started as root: the working directory's files to the redis user, then run as it
if [ "$1" = 'redis-server' ] && [ "$(id -u)" = '0' ]; then
	find . \! -user redis -exec chown redis '{}' +
	exec gosu redis "$0" "$@"
fi

# an appropriate umask, unless one other than the default is set
um="$(umask)"
if [ "$um" = '0022' ]; then
	umask 0077
fi

exec "$@"
