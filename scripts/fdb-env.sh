# Finds FoundationDB (sourced by the scripts that need it; sets nothing
# else). Exports, when found:
#
#   FDB_SERVER   the fdbserver binary
#   FDB_CLI      the fdbcli binary
#   FDB_LIB_DIR  the directory holding libfdb_c.so ("" when the loader
#                finds it on its own, as with the official packages)
#   FDB_CLIENT_LIB_PATH  the same directory when not "", for the
#                foundationdb crate's linker search path (its build script
#                reads this name)
#   FDB_FOUND    "yes" or "no"; FDB_WHERE says where it was found
#
# Where it looks, first match wins:
#   1. COUCH_WORKERS_FDB_DIR: a directory laid out as bin/ (or sbin/),
#      lib/ (and include/), e.g. a FoundationDB built from source;
#   2. an installed FoundationDB (the official packages): fdbserver on the
#      PATH or in /usr/sbin, fdbcli on the PATH or in /usr/bin,
#      libfdb_c.so where the loader finds it;
#   3. ../shared/fdb beside the repository (this project's machines).
#
# The Rust build finds the library the same way (native/fdb_locate.rs)
# and records its directory as the binaries' rpath: no ldconfig, no
# LD_LIBRARY_PATH needed to run what it built.

fdb_env_root=$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]:-$0}")/.." && pwd)

fdb_env_from_dir() {
    local dir=$1 server="" cli=""
    for f in "$dir/bin/fdbserver" "$dir/sbin/fdbserver"; do
        [ -x "$f" ] && { server=$f; break; }
    done
    [ -x "$dir/bin/fdbcli" ] && cli="$dir/bin/fdbcli"
    if [ -n "$server" ] && [ -n "$cli" ] && [ -f "$dir/lib/libfdb_c.so" ]; then
        FDB_SERVER=$server FDB_CLI=$cli FDB_LIB_DIR=$(cd "$dir/lib" && pwd)
        return 0
    fi
    return 1
}

fdb_env_installed() {
    local server cli
    server=$(command -v fdbserver 2>/dev/null || true)
    [ -z "$server" ] && [ -x /usr/sbin/fdbserver ] && server=/usr/sbin/fdbserver
    cli=$(command -v fdbcli 2>/dev/null || true)
    [ -z "$cli" ] && [ -x /usr/bin/fdbcli ] && cli=/usr/bin/fdbcli
    [ -n "$server" ] && [ -n "$cli" ] || return 1
    ldconfig -p 2>/dev/null | grep -q 'libfdb_c\.so' || return 1
    FDB_SERVER=$server FDB_CLI=$cli FDB_LIB_DIR=""
}

FDB_FOUND=no
FDB_WHERE=""
if [ -n "${COUCH_WORKERS_FDB_DIR:-}" ]; then
    if fdb_env_from_dir "$COUCH_WORKERS_FDB_DIR"; then
        FDB_FOUND=yes FDB_WHERE="COUCH_WORKERS_FDB_DIR=$COUCH_WORKERS_FDB_DIR"
    else
        echo "fdb-env: COUCH_WORKERS_FDB_DIR=$COUCH_WORKERS_FDB_DIR has no bin/fdbserver, bin/fdbcli and lib/libfdb_c.so" >&2
    fi
elif fdb_env_installed; then
    FDB_FOUND=yes FDB_WHERE="installed ($FDB_SERVER)"
elif fdb_env_from_dir "$fdb_env_root/../shared/fdb"; then
    FDB_FOUND=yes FDB_WHERE="$(cd "$fdb_env_root/../shared/fdb" && pwd)"
fi
if [ "$FDB_FOUND" = yes ]; then
    export FDB_SERVER FDB_CLI FDB_LIB_DIR
    if [ -n "$FDB_LIB_DIR" ]; then
        FDB_CLIENT_LIB_PATH=$FDB_LIB_DIR
        export FDB_CLIENT_LIB_PATH
    fi
fi
export FDB_FOUND FDB_WHERE
