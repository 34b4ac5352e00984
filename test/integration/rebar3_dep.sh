#!/usr/bin/env bash
# rebar3, the two ways a BEAM project meets couch_workers:
#   1. in place: in a copy of the checkout, `rebar3 compile`, then
#      `rebar3 shell` (typed into, on a terminal) starts the app on the
#      embedded default and answers worker_register/4;
#   2. as a git dependency: a throwaway project lists
#      {couch_workers, {git, "file://...", {branch, "main"}}} (a git
#      snapshot of this checkout), `rebar3 release` builds the NIF from the
#      dependency's own hook and relx ships it: lib/couch_workers-VSN holds
#      priv/ with the NIF and no Rust; a second compile does not run cargo;
#      a node booted from the release, with the dependency's sources moved
#      away, runs couch_workers from the release and answers
#      worker_register/4.
IT_NAME=rebar3
source "$(dirname "$0")/lib.sh"

command -v rebar3 >/dev/null 2>&1 || fail "rebar3 is not installed: run scripts/setup.sh"
VSN=$(app_vsn)
# In place first: its cargo run finds the checkout's build fresh (a copy
# keeps the files' times), which the git dependency's build, of files
# with new times, would have replaced in the shared CARGO_TARGET_DIR.
say "1. in place: rebar3 compile, rebar3 shell"
INPLACE="$SCRATCH/inplace"
copy_checkout "$INPLACE"
(cd "$INPLACE" && rebar3 compile) > "$SCRATCH/inplace_compile.log" 2>&1 || { cat "$SCRATCH/inplace_compile.log" >&2; fail "rebar3 compile in place"; }
# rebar3 shell wants a terminal (script(1) gives it one) and reads what is
# typed only once its prompt is up: type each line after the prompt.
mkfifo "$SCRATCH/shell.in"
(cd "$INPLACE" && timeout 180 script -qec "rebar3 shell" /dev/null < "$SCRATCH/shell.in" > "$SCRATCH/shell.log" 2>&1) &
shell_pid=$!
exec 3> "$SCRATCH/shell.in"
wait_log() {
    for _ in $(seq 1 1200); do
        grep -aq "$1" "$SCRATCH/shell.log" && return 0
        sleep 0.1
    done
    return 1
}
# (The shell's prompt comes before rebar3 has booted the apps.)
wait_log 'Booted couch_workers' || { exec 3>&-; cat "$SCRATCH/shell.log" >&2; fail "rebar3 shell did not boot couch_workers"; }
printf '%s\n' \
    'Ref = couch_workers:worker_register(<<"it_shell">>, <<"s-1">>, #{}, self()).' \
    'io:format("~nit: shell apps ~w~n", [[A || {A, _, _} <- application:which_applications()]]).' \
    'io:format("~nit: SHELL_~s~n", [case is_reference(Ref) of true -> "OK"; false -> "WRONG" end]).' >&3
wait_log '^it: SHELL_' || true
printf '%s\n' 'q().' >&3
exec 3>&-
wait $shell_pid || true
tr -d '\r' < "$SCRATCH/shell.log" > "$SCRATCH/shell.txt"
mv "$SCRATCH/shell.txt" "$SCRATCH/shell.log"
grep '^it: ' "$SCRATCH/shell.log" | sed "s/^/it[$IT_NAME]: /" || true
grep -q '^it: SHELL_OK' "$SCRATCH/shell.log" || { cat "$SCRATCH/shell.log" >&2; fail "rebar3 shell did not start the app and answer"; }
[ -d "$INPLACE/couch_workers_data" ] || fail "rebar3 shell did not open the embedded default store (./couch_workers_data)"
say "   rebar3 shell started couch_workers on ./couch_workers_data and answered worker_register/4"

REPO="$SCRATCH/couch_workers.git"
PROJ="$SCRATCH/consumer"
git_snapshot "$REPO"
mkdir -p "$PROJ/src"
cat > "$PROJ/rebar.config" <<CONF
{deps, [{couch_workers, {git, "file://$REPO", {branch, "main"}}}]}.
{relx, [
    {release, {consumer, "0.1.0"}, [sasl, couch_workers, consumer]},
    {mode, prod},
    {include_erts, true}
]}.
CONF
cat > "$PROJ/src/consumer.app.src" <<'CONF'
{application, consumer, [
    {description, "A project that depends on couch_workers"},
    {vsn, "0.1.0"},
    {applications, [kernel, stdlib, couch_workers]},
    {env, []}
]}.
CONF

say "2. rebar3 release of a project that depends on couch_workers by git"
(cd "$PROJ" && rebar3 release) > "$SCRATCH/release.log" 2>&1 || { cat "$SCRATCH/release.log" >&2; fail "rebar3 release"; }
grep -E '^build-nif:|Finished|Compiling couch_workers|Assembling|assembled' "$SCRATCH/release.log" | sed "s/^/it[$IT_NAME]:   /" || true
DEP="$PROJ/_build/default/lib/couch_workers"
[ -f "$DEP/priv/libcouch_workers_nif.so" ] || fail "the dependency's hook left no $DEP/priv/libcouch_workers_nif.so"
REL="$PROJ/_build/default/rel/consumer"
check_release_app_dir "$REL/lib/couch_workers-$VSN"

(cd "$PROJ" && rebar3 compile) > "$SCRATCH/compile2.log" 2>&1 || { cat "$SCRATCH/compile2.log" >&2; fail "second rebar3 compile"; }
# (rebar3 does not run a built dependency's hooks again; if it does, the
# hook must find the NIF up to date.)
if grep -q 'build-nif: cargo build' "$SCRATCH/compile2.log"; then
    cat "$SCRATCH/compile2.log" >&2
    fail "the second compile ran cargo"
fi
say "   a second rebar3 compile: cargo not run"

boot_release "$REL" "$REL/releases/0.1.0/start" "-config $REL/releases/0.1.0/sys.config" "$DEP"

say "PASSED"
