#!/usr/bin/env bash
# Builds erlfdb (CouchDB's FoundationDB binding) with erlc and cc, without
# rebar3 or its plugins (pc), for the suite that runs couch_workers beside
# erlfdb in one VM (test/couch_workers_erlfdb_tests.erl, docs/fdb.md).
#
#   scripts/build-erlfdb.sh [BUILD_DIR]
#   scripts/build-erlfdb.sh --check    # only: is the source there?
#
# ERLFDB_SRC    erlfdb's source tree (git clone
#               https://github.com/apache/couchdb-erlfdb); default
#               ../shared/erlfdb beside the repository (the team's
#               machines). It is read in place, never copied or written.
# BUILD_DIR     where the build goes; default _build/erlfdb in the
#               repository (ERLFDB_BUILD_DIR also names it). Gets
#               ebin/*.beam, ebin/erlfdb.app and priv/erlfdb_nif.so.
#
# The NIF is compiled against the libfdb_c that scripts/fdb-env.sh finds
# (its include/ directory, else /usr/include and /usr/local/include),
# linked with -lfdb_c and an rpath to that library's directory, with
# FDB_API_VERSION defined as erlfdb's rebar.config.script does it: the
# highest API version of the installed client, read from the protocol
# version `fdbcli --version` prints (FDB_API_VERSION overrides it).
#
# Up to date (nothing compiled) when every output is newer than every
# input and the recorded flags match.
set -eu

ROOT=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
SRC=${ERLFDB_SRC:-$ROOT/../shared/erlfdb}
CHECK=no
[ "${1:-}" = --check ] && { CHECK=yes; shift; }
OUT=${1:-${ERLFDB_BUILD_DIR:-$ROOT/_build/erlfdb}}

if [ ! -f "$SRC/src/erlfdb_nif.erl" ] || [ ! -d "$SRC/c_src" ]; then
    echo "build-erlfdb: no erlfdb source at $SRC (git clone https://github.com/apache/couchdb-erlfdb, then set ERLFDB_SRC)" >&2
    exit 1
fi
SRC=$(cd "$SRC" && pwd)
[ "$CHECK" = yes ] && exit 0

# shellcheck source=fdb-env.sh
. "$ROOT/scripts/fdb-env.sh"
if [ "$FDB_FOUND" != yes ]; then
    echo "build-erlfdb: FoundationDB (libfdb_c, fdbcli) not found; see scripts/fdb-env.sh" >&2
    exit 1
fi

# The header directory: beside the library (a FoundationDB tree), else
# where the official packages put it.
INC=""
if [ -n "$FDB_LIB_DIR" ] && [ -f "$FDB_LIB_DIR/../include/foundationdb/fdb_c.h" ]; then
    INC=$(cd "$FDB_LIB_DIR/../include" && pwd)
else
    for d in /usr/include /usr/local/include; do
        if [ -f "$d/foundationdb/fdb_c.h" ]; then INC=$d; break; fi
    done
fi
if [ -z "$INC" ]; then
    echo "build-erlfdb: foundationdb/fdb_c.h not found (next to $FDB_LIB_DIR, /usr/include, /usr/local/include)" >&2
    exit 1
fi

# erlfdb's rebar.config.script: the API version bits of fdbcli's protocol
# version (0x0FFF00000), printed in hex: 7.1 -> 710.
if [ -z "${FDB_API_VERSION:-}" ]; then
    PROTO=$("$FDB_CLI" --version | sed -n 's/^protocol \([0-9a-f]*\).*/\1/p')
    if [ -z "$PROTO" ]; then
        echo "build-erlfdb: no protocol version in '$FDB_CLI --version'" >&2
        exit 1
    fi
    FDB_API_VERSION=$(printf '%x' $(( (0x$PROTO & 0x0FFF00000) >> 20 )))
fi

ERTS_INC=$(erl -noshell -noinput -eval \
    'io:format("~ts", [filename:join([code:root_dir(), "erts-" ++ erlang:system_info(version), "include"])]), halt().')
if [ ! -f "$ERTS_INC/erl_nif.h" ]; then
    ERTS_INC=$(erl -noshell -noinput -eval 'io:format("~ts", [filename:join(code:root_dir(), "usr/include")]), halt().')
fi

CC=${CC:-cc}
CFLAGS="-O2 -g -Wall -Werror -fPIC -I$SRC/c_src -I$INC -I$ERTS_INC -DFDB_API_VERSION=$FDB_API_VERSION"
if [ -n "$FDB_LIB_DIR" ]; then
    LDFLAGS="-shared -L$FDB_LIB_DIR -Wl,-rpath,$FDB_LIB_DIR -lfdb_c"
else
    LDFLAGS="-shared -lfdb_c"
fi
STAMP_WANT="src=$SRC cc=$CC cflags=$CFLAGS ldflags=$LDFLAGS"

EBIN=$OUT/ebin
PRIV=$OUT/priv
NIF=$PRIV/erlfdb_nif.so
STAMP=$OUT/build.stamp

# Newest-input check: any source newer than the oldest output rebuilds.
up_to_date() {
    [ -f "$STAMP" ] && [ -f "$NIF" ] && [ -f "$EBIN/erlfdb.app" ] || return 1
    [ "$(cat "$STAMP")" = "$STAMP_WANT" ] || return 1
    for f in "$SRC"/src/*.erl; do
        b=$EBIN/$(basename "$f" .erl).beam
        [ -f "$b" ] || return 1
    done
    newer=$(find "$SRC/src" "$SRC/c_src" "$SRC/include" "$INC/foundationdb" \
        -newer "$STAMP" -type f -print 2>/dev/null | head -n 1)
    [ -z "$newer" ]
}

if up_to_date; then
    echo "build-erlfdb: $OUT is up to date (FDB_API_VERSION=$FDB_API_VERSION, $SRC)"
    exit 0
fi

echo "build-erlfdb: building erlfdb from $SRC into $OUT (FDB_API_VERSION=$FDB_API_VERSION, headers $INC, libfdb_c ${FDB_LIB_DIR:-on the loader path})"
mkdir -p "$EBIN" "$PRIV" "$OUT/obj"
rm -f "$STAMP"

erlc -o "$EBIN" -I "$SRC/include" +debug_info "$SRC"/src/*.erl
# erlfdb.app.src holds a literal vsn: it is the .app as it is.
cp "$SRC/src/erlfdb.app.src" "$EBIN/erlfdb.app.tmp.$$"
mv "$EBIN/erlfdb.app.tmp.$$" "$EBIN/erlfdb.app"

OBJS=""
for c in "$SRC"/c_src/*.c; do
    o=$OUT/obj/$(basename "$c" .c).o
    # shellcheck disable=SC2086
    $CC $CFLAGS -c "$c" -o "$o"
    OBJS="$OBJS $o"
done
# A library a running VM has loaded is replaced by a new file, never
# overwritten in place.
# shellcheck disable=SC2086
$CC $OBJS $LDFLAGS -o "$NIF.tmp.$$"
rm -f "$NIF"
mv "$NIF.tmp.$$" "$NIF"

echo "$STAMP_WANT" > "$STAMP.tmp.$$"
mv "$STAMP.tmp.$$" "$STAMP"
echo "build-erlfdb: built $EBIN and $NIF"
