#!/usr/bin/env bash
# The entrypoint of the postgres:15 image hack/images.sh builds, written for noops to behave as
# the official image's does (docker-library/postgres), so a pod spec that works on one works on
# the other:
# - `postgres ...` (or arguments starting with `-`): as root, takes ownership of PGDATA and the
#   socket folder, then runs again as the postgres user (gosu); with an empty PGDATA, runs initdb
#   (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, POSTGRES_INITDB_ARGS, POSTGRES_INITDB_WALDIR,
#   POSTGRES_HOST_AUTH_METHOD, each also as <VAR>_FILE), then the scripts of
#   /docker-entrypoint-initdb.d on a socket-only server, then execs postgres as PID 1;
# - anything else is run as it is.
set -Eeo pipefail

# file_env VAR [default]: VAR from the environment or from the file VAR_FILE names, not both.
file_env() {
  local var=$1 file_var="${1}_FILE" default=${2:-} value
  if [ -n "${!var:-}" ] && [ -n "${!file_var:-}" ]; then
    echo >&2 "error: both $var and $file_var are set (but are exclusive)"
    exit 1
  fi
  value=$default
  if [ -n "${!var:-}" ]; then value=${!var}; elif [ -n "${!file_var:-}" ]; then value=$(< "${!file_var}"); fi
  export "$var"="$value"
  unset "$file_var"
}

wants_server() {
  [ "${1:-}" = postgres ] || return 1
  local arg
  for arg in "$@"; do
    case $arg in -'?' | --help | --describe-config | -V | --version) return 1 ;; esac
  done
}

make_directories() {
  mkdir -p "$PGDATA"
  chmod 00700 "$PGDATA" 2>/dev/null || :
  mkdir -p /var/run/postgresql || :
  chmod 03775 /var/run/postgresql 2>/dev/null || :
  if [ -n "${POSTGRES_INITDB_WALDIR:-}" ]; then
    mkdir -p "$POSTGRES_INITDB_WALDIR"
    chmod 700 "$POSTGRES_INITDB_WALDIR"
  fi
  if [ "$(id -u)" = 0 ]; then
    find "$PGDATA" \! -user postgres -exec chown postgres '{}' +
    find /var/run/postgresql \! -user postgres -exec chown postgres '{}' +
    [ -z "${POSTGRES_INITDB_WALDIR:-}" ] || find "$POSTGRES_INITDB_WALDIR" \! -user postgres -exec chown postgres '{}' +
  fi
}

# initdb, with a passwd entry for an arbitrary uid (nss_wrapper) when the uid has none.
run_initdb() {
  local wrapper="" passwd_file group_file
  if ! getent passwd "$(id -u)" >/dev/null 2>&1; then
    wrapper=$(find /usr/lib /lib -name libnss_wrapper.so 2>/dev/null | head -1)
    if [ -n "$wrapper" ]; then
      passwd_file=$(mktemp) group_file=$(mktemp)
      echo "postgres:x:$(id -u):$(id -g):PostgreSQL:$PGDATA:/bin/false" > "$passwd_file"
      echo "postgres:x:$(id -g):" > "$group_file"
    fi
  fi
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of arguments, as upstream splits it
  if [ -n "$wrapper" ]; then
    LD_PRELOAD=$wrapper NSS_WRAPPER_PASSWD=$passwd_file NSS_WRAPPER_GROUP=$group_file \
      initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
      ${POSTGRES_INITDB_WALDIR:+--waldir "$POSTGRES_INITDB_WALDIR"} $POSTGRES_INITDB_ARGS
    rm -f "$passwd_file" "$group_file"
  else
    initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
      ${POSTGRES_INITDB_WALDIR:+--waldir "$POSTGRES_INITDB_WALDIR"} $POSTGRES_INITDB_ARGS
  fi
}

psql_as_owner() { psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --no-password --no-psqlrc "$@"; }

run_init_scripts() {
  local f
  for f in /docker-entrypoint-initdb.d/*; do
    case $f in
      *.sh) if [ -x "$f" ]; then echo "running $f"; "$f"; else echo "sourcing $f"; . "$f"; fi ;;
      *.sql) echo "running $f"; PGHOST= PGHOSTADDR= psql_as_owner --dbname "$POSTGRES_DB" -f "$f" ;;
      *.sql.gz) echo "running $f"; gunzip -c "$f" | PGHOST= PGHOSTADDR= psql_as_owner --dbname "$POSTGRES_DB" ;;
      *.sql.xz) echo "running $f"; xzcat "$f" | PGHOST= PGHOSTADDR= psql_as_owner --dbname "$POSTGRES_DB" ;;
      *.sql.zst) echo "running $f"; zstd -dc "$f" | PGHOST= PGHOSTADDR= psql_as_owner --dbname "$POSTGRES_DB" ;;
      *) [ ! -e "$f" ] || echo "ignoring $f" ;;
    esac
  done
}

initialize() {
  file_env POSTGRES_PASSWORD
  file_env POSTGRES_USER postgres
  file_env POSTGRES_DB "$POSTGRES_USER"
  file_env POSTGRES_INITDB_ARGS
  : "${POSTGRES_HOST_AUTH_METHOD:=}"
  if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
    echo >&2 "error: the database is uninitialized and no superuser password is given: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust, which lets anyone in)"
    exit 1
  fi
  ls /docker-entrypoint-initdb.d/ >/dev/null
  run_initdb
  local method=${POSTGRES_HOST_AUTH_METHOD:-$(postgres -C password_encryption "${@:2}")}
  printf '\nhost all all all %s\n' "$method" >> "$PGDATA/pg_hba.conf"
  export PGPASSWORD=${PGPASSWORD:-$POSTGRES_PASSWORD}
  # A server on the socket only, for the database and the init scripts.
  local options="-c listen_addresses='' -p ${PGPORT:-5432}"
  [ $# -lt 2 ] || options="$(printf '%q ' "${@:2}")$options"
  NOTIFY_SOCKET= PGUSER=${PGUSER:-$POSTGRES_USER} pg_ctl -D "$PGDATA" -w start -o "$options"
  if [ "$POSTGRES_DB" != postgres ]; then
    psql_as_owner --dbname postgres --set db="$POSTGRES_DB" <<<"SELECT 'CREATE DATABASE :\"db\"' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \gexec"
  fi
  run_init_scripts
  pg_ctl -D "$PGDATA" -m fast -w stop
  unset PGPASSWORD
  echo "PostgreSQL init process complete; ready for start up."
}

[ "${1:0:1}" != - ] || set -- postgres "$@"
if wants_server "$@"; then
  make_directories
  if [ "$(id -u)" = 0 ]; then exec gosu postgres "$0" "$@"; fi
  if [ -s "$PGDATA/PG_VERSION" ]; then
    echo "PostgreSQL database directory appears to contain a database; skipping initialization"
  else
    initialize "$@"
  fi
fi
exec "$@"
