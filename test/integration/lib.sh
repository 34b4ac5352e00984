# Shared by the integration scripts of test/integration (sourced, not run).
#
# ROOT: this checkout. A scratch directory per run under
# ${CW_IT_DIR:-/tmp}, removed on exit unless CW_IT_KEEP=1.
# CARGO_TARGET_DIR: one cargo target for every build of a run (the
# checkout's target/ unless set), so the Rust dependencies are compiled
# once, not once per integration build.

set -euo pipefail

ROOT=$(CDPATH= cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SCRATCH=$(mktemp -d "${CW_IT_DIR:-/tmp}/cw_it.XXXXXX")
cleanup() {
    if [ "${CW_IT_KEEP:-0}" = 1 ]; then
        echo "it: kept $SCRATCH"
    else
        rm -rf "$SCRATCH"
    fi
}
trap cleanup EXIT

say() { echo "it[$IT_NAME]: $*"; }
fail() { echo "it[$IT_NAME]: FAILED: $*" >&2; exit 1; }

# The checkout's files as a clone of it would hold them (tracked files and
# new ones not ignored, so uncommitted work is what is tested; nothing
# built: no priv/*.so, no target/, no _build/), with their times kept to
# the nanosecond (a POSIX tar: the default one keeps whole seconds). Cargo
# fingerprints a build script by its package's newest file time, and
# the core's and the NIF's crate names and hashes do not depend on where
# the workspace is: with the times kept, the copy's cargo run in the
# shared CARGO_TARGET_DIR finds the checkout's build fresh, where a
# truncated time compiled the core and the NIF again (2 min 8 s of a
# 2-core machine, 5 Dec 2026).
copy_checkout() {
    dest=$1
    mkdir -p "$dest"
    (cd "$ROOT" && git ls-files -z -co --exclude-standard | tar --null --format=posix -cf - -T -) | tar -xf - -C "$dest"
}

# A git repository whose main branch holds those files: what a rebar3
# project can name as {git, "file://...", {branch, "main"}}.
git_snapshot() {
    dest=$1
    copy_checkout "$dest"
    git -C "$dest" init -q -b main
    git -C "$dest" add -A
    git -C "$dest" -c user.name=it -c user.email=it@localhost commit -q -m "snapshot of $ROOT"
}

# The app's version, from its .app.src.
app_vsn() {
    sed -n 's/.*{vsn, *"\([^"]*\)".*/\1/p' "$ROOT/src/couch_workers.app.src" | head -n 1
}

# A release's lib/couch_workers-VSN holds the NIF, and no Rust.
check_release_app_dir() {
    dir=$1
    [ -d "$dir/ebin" ] || fail "$dir/ebin missing"
    [ -f "$dir/ebin/couch_workers.app" ] || fail "$dir/ebin/couch_workers.app missing"
    [ -f "$dir/priv/libcouch_workers_nif.so" ] || fail "$dir/priv/libcouch_workers_nif.so missing"
    for not_shipped in native target Cargo.toml Cargo.lock _build; do
        [ ! -e "$dir/$not_shipped" ] || fail "the release ships $dir/$not_shipped"
    done
    rust=$(find "$dir" -name '*.rs' | head -n 1)
    [ -z "$rust" ] || fail "the release ships Rust sources ($rust)"
    say "release app dir $dir: ebin, priv/libcouch_workers_nif.so, no Rust sources or target/"
}

# Boots a release with the erl of the ERTS it ships (which finds its root
# from its own place: the release's lib/ alone, not the system's) and its
# boot script (which starts couch_workers), in a working directory of its
# own, with the source tree at $hidden moved away so nothing can come from
# it; checks that the app runs from the release's lib/ and answers
# worker_register/4.
boot_release() {
    rel_root=$1; boot=$2; config=$3; hidden=$4
    erl_bin=$(ls "$rel_root"/erts-*/bin/erl 2>/dev/null | head -n 1)
    [ -n "$erl_bin" ] || fail "the release at $rel_root ships no erts-*/bin/erl"
    run_dir="$SCRATCH/run.$IT_NAME"
    mkdir -p "$run_dir"
    mv "$hidden" "$hidden.moved-away"
    set +e
    (cd "$run_dir" && CW_REL_ROOT="$rel_root" timeout 120 "$erl_bin" -noshell -boot "$boot" -boot_var ROOT "$rel_root" $config -eval '
        Lib = filename:join(os:getenv("CW_REL_ROOT"), "lib"),
        Which = code:which(couch_workers_nif),
        Priv = code:priv_dir(couch_workers),
        Apps = [A || {A, _, _} <- application:which_applications()],
        Ref = couch_workers:worker_register(<<"it_replicator">>, <<"it-1">>, #{timeout => 5}, self()),
        Sub = couch_workers:membership_subscribe(<<"it_replicator">>, nil, self()),
        Members = receive {couch_workers_membership, _, M, _, Sub} -> M after 5000 -> timeout end,
        ok = couch_workers:worker_unregister(Ref),
        io:format("it: nif module ~s~nit: priv dir ~s~nit: apps ~p~nit: register ~p~nit: members ~p~n",
                  [Which, Priv, Apps, Ref, Members]),
        Ok = lists:prefix(Lib, Which) andalso lists:prefix(Lib, Priv)
            andalso lists:member(couch_workers, Apps) andalso is_reference(Ref)
            andalso is_map_key(<<"it-1">>, Members),
        io:format("it: ~s~n", [case Ok of true -> "BOOT_OK"; false -> "BOOT_WRONG" end]),
        halt(case Ok of true -> 0; false -> 1 end).' ) > "$run_dir/boot.log" 2>&1
    rc=$?
    set -e
    mv "$hidden.moved-away" "$hidden"
    grep '^it: ' "$run_dir/boot.log" | sed "s/^/it[$IT_NAME]: /" || true
    if [ $rc -ne 0 ]; then
        cat "$run_dir/boot.log" >&2
        fail "the release did not boot and answer (exit $rc)"
    fi
    say "the release booted from $rel_root/lib and answered worker_register/4"
}
