%% @doc couch_workers beside erlfdb in one VM, on a real FoundationDB
%% (docs/fdb.md, "Sharing the client with erlfdb"): whichever starts
%% first, both work on the one libfdb_c network of the process, both see
%% the one `couchdb' directory, stopping either leaves the other working,
%% and the VM exits cleanly with both loaded.
%%
%% libfdb_c selects its API version and starts its network once per OS
%% process, so every test runs in a fresh peer VM (OTP's `peer', a
%% separate `erl') or a separate `erl' of its own; this VM only drives
%% them. Runs when FDB_CLUSTER_FILE is set, with erlfdb built by
%% scripts/build-erlfdb.sh (ERLFDB_EBIN names its ebin/; default
%% _build/erlfdb/ebin): scripts/test-erlfdb.sh. Without erlfdb there, the
%% suite fails; without FDB_CLUSTER_FILE it says SKIPPED.
-module(couch_workers_erlfdb_tests).

-include_lib("eunit/include/eunit.hrl").

%% The tests (named in erlfdb_test_/0).
-export([
    erlfdb_first_then_couch_workers/1,
    couch_workers_first_then_erlfdb/1,
    erlfdb_added_after_couch_workers_owns_the_client/1,
    one_couchdb_directory/1,
    directory_erlfdb_created_is_opened_by_couch_workers/1,
    stop_couch_workers_leaves_erlfdb/1,
    drop_erlfdb_leaves_couch_workers/1,
    vm_exits_cleanly_erlfdb_first/1,
    vm_exits_cleanly_couch_workers_first/1,
    job_add_in_caller_tx/1
]).

%% Run on the peers (through peer:call/4).
-export([
    peer_setup/0,
    erlfdb_start/1,
    erlfdb_roundtrip/2,
    erlfdb_close/1,
    cw_start/1,
    cw_stop/0,
    cw_roundtrip/1,
    fdb_threads/0,
    in_couchdb_dir/3,
    in_dir/4,
    clear_type/2,
    tx_add/5,
    tx_get/3,
    doc_get/2,
    accept_one/1,
    vm_exit_script/4
]).

%% For the suite of job calls inside a caller's transaction
%% (couch_workers_tx_tests), which runs on the same peers.
-export([find_erlfdb/0, with_peer/2, call/3, call/4, name/1, db/1]).

-define(API_VERSION, 710).

%% ---- the suite -------------------------------------------------------------

erlfdb_test_() ->
    case os:getenv("FDB_CLUSTER_FILE") of
        F when F =:= false; F =:= "" ->
            once(skipped, fun() ->
                io:format(user,
                    "~n*** couch_workers_erlfdb_tests: FDB_CLUSTER_FILE is not set: the erlfdb suite is SKIPPED "
                    "(scripts/test-erlfdb.sh runs it on a cluster) ***~n", [])
            end),
            [];
        ClusterFile ->
            case find_erlfdb() of
                {ok, Ebin} ->
                    io:format(user, "~n*** couch_workers_erlfdb_tests: erlfdb from ~ts, cluster ~ts ***~n",
                        [Ebin, ClusterFile]),
                    Ctx = #{cluster => ClusterFile, erlfdb_ebin => Ebin},
                    {inorder, [
                        named(T, Ctx)
                     || T <- [
                            erlfdb_first_then_couch_workers,
                            couch_workers_first_then_erlfdb,
                            erlfdb_added_after_couch_workers_owns_the_client,
                            one_couchdb_directory,
                            directory_erlfdb_created_is_opened_by_couch_workers,
                            stop_couch_workers_leaves_erlfdb,
                            drop_erlfdb_leaves_couch_workers,
                            vm_exits_cleanly_erlfdb_first,
                            vm_exits_cleanly_couch_workers_first,
                            job_add_in_caller_tx
                        ]
                    ]};
                {error, Why} ->
                    io:format(user,
                        "~n*** couch_workers_erlfdb_tests: FDB_CLUSTER_FILE is set but erlfdb is NOT found: ~ts: "
                        "FAILING (build it: scripts/build-erlfdb.sh; or set ERLFDB_EBIN) ***~n", [Why]),
                    [{"erlfdb_found", ?_assertEqual(found, {erlfdb_not_found, unicode:characters_to_binary(Why)})}]
            end
    end.

%% EUnit may expand the generator more than once: one line is enough.
once(Key, Fun) ->
    case persistent_term:get({?MODULE, Key}, false) of
        true ->
            ok;
        false ->
            persistent_term:put({?MODULE, Key}, true),
            Fun()
    end.

named(Name, Ctx) ->
    {atom_to_list(Name), {timeout, 120, fun() -> ?MODULE:Name(Ctx) end}}.

%% erlfdb's ebin: ERLFDB_EBIN, else already in the code path, else
%% _build/erlfdb/ebin of the repository (rebar3 runs in its root; the
%% directories above the app's are tried too). Given to the peers only:
%% in this VM's code path it would make every other suite's FDB start
%% load erlfdb (couch_workers_fdb_client:prepare/1).
find_erlfdb() ->
    case os:getenv("ERLFDB_EBIN") of
        E when E =/= false, E =/= "" ->
            case is_erlfdb_ebin(E) of
                true -> {ok, filename:absname(E)};
                false -> {error, io_lib:format("ERLFDB_EBIN=~ts holds no erlfdb_nif.beam and erlfdb.app", [E])}
            end;
        _ ->
            case code:which(erlfdb_nif) of
                P when is_list(P) ->
                    {ok, filename:dirname(P)};
                _ ->
                    {ok, Cwd} = file:get_cwd(),
                    Tried = candidates(Cwd) ++ candidates(code:lib_dir(couch_workers)),
                    case [D || D <- Tried, is_erlfdb_ebin(D)] of
                        [D | _] -> {ok, filename:absname(D)};
                        [] -> {error, io_lib:format("ERLFDB_EBIN unset, none of ~p holds it", [lists:usort(Tried)])}
                    end
            end
    end.

candidates(Dir) when is_list(Dir) ->
    Parts = filename:split(filename:absname(Dir)),
    [filename:join(lists:sublist(Parts, N) ++ ["_build", "erlfdb", "ebin"]) || N <- lists:seq(length(Parts), 1, -1)];
candidates(_) ->
    [].

is_erlfdb_ebin(D) ->
    filelib:is_regular(filename:join(D, "erlfdb_nif.beam")) andalso filelib:is_regular(filename:join(D, "erlfdb.app")).

%% ---- (a) erlfdb first ------------------------------------------------------

%% erlfdb opened before couch_workers (as in a CouchDB node): couch_workers
%% runs on erlfdb's network (no network thread of its own), and both work.
erlfdb_first_then_couch_workers(#{cluster := CF} = Ctx) ->
    with_peer(Ctx, fun(P) ->
        Db = call(P, erlfdb_start, [CF]),
        ?assertEqual(ok, call(P, erlfdb_roundtrip, [Db, <<"a1">>])),
        ok = call(P, cw_start, [{fdb_test, CF, name("a")}]),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"a">>])),
        ?assertEqual(ok, call(P, erlfdb_roundtrip, [Db, <<"a2">>])),
        %% One network, erlfdb's: couch_workers started none.
        ?assertEqual([], [T || T <- call(P, fdb_threads, []), T =:= <<"fdb-network">>]),
        ok = call(P, cw_stop, [])
    end).

%% ---- (b) couch_workers first ----------------------------------------------

%% couch_workers started first, erlfdb only in the code path: its start
%% loads erlfdb_nif first (couch_workers_fdb_client:prepare/1), so erlfdb
%% opened afterwards works, on the one network.
couch_workers_first_then_erlfdb(#{cluster := CF} = Ctx) ->
    with_peer(Ctx, fun(P) ->
        ?assertEqual(false, call(P, code, is_loaded, [erlfdb_nif])),
        ok = call(P, cw_start, [{fdb_test, CF, name("b")}]),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"b">>])),
        ?assertMatch({file, _}, call(P, code, is_loaded, [erlfdb_nif])),
        Db = call(P, erlfdb_start, [CF]),
        ?assertEqual(ok, call(P, erlfdb_roundtrip, [Db, <<"b1">>])),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"b2">>])),
        ?assertEqual([], [T || T <- call(P, fdb_threads, []), T =:= <<"fdb-network">>]),
        ok = call(P, cw_stop, [])
    end).

%% The order docs/fdb.md says cannot work: erlfdb reaches the code path
%% only after couch_workers started its own client. Loading erlfdb then
%% fails (its on_load meets 2201), cleanly: the VM and couch_workers go
%% on.
erlfdb_added_after_couch_workers_owns_the_client(#{cluster := CF, erlfdb_ebin := Ebin} = Ctx) ->
    with_peer(
        Ctx,
        fun(P) ->
            ok = call(P, cw_start, [{fdb_test, CF, name("b3")}]),
            ?assertEqual(ok, call(P, cw_roundtrip, [<<"b3">>])),
            ?assertMatch([_], [T || T <- call(P, fdb_threads, []), T =:= <<"fdb-network">>]),
            true = call(P, code, add_patha, [Ebin]),
            ?assertMatch({error, on_load_failure}, call(P, code, ensure_loaded, [erlfdb_nif])),
            ?assertEqual(ok, call(P, cw_roundtrip, [<<"b4">>])),
            ok = call(P, cw_stop, [])
        end,
        [without_erlfdb]
    ).

%% ---- (c) one directory ----------------------------------------------------

%% couch_workers on the production directory `couchdb' (store {fdb, File})
%% and erlfdb's `erlfdb_directory:create_or_open(Tx, root(), [<<"couchdb">>])'
%% are one key space: a job couch_workers adds is at the key
%% docs/keyspace.md gives, read by erlfdb; a key erlfdb writes there
%% (a paused marker) is read by couch_workers.
one_couchdb_directory(#{cluster := CF} = Ctx) ->
    with_peer(Ctx, fun(P) ->
        Db = call(P, erlfdb_start, [CF]),
        ok = call(P, cw_start, [{fdb, CF}]),
        T = iolist_to_binary(["cw_erlfdb_", name("c")]),
        J = <<"job-1">>,
        ok = call(P, couch_workers, job_add, [T, J, #{<<"from">> => <<"couch_workers">>}, #{}]),
        try
            %% couch_workers -> erlfdb: the job record, a tuple
            %% (4, State, ...), format 4 (docs/keyspace.md), at ("couch_workers", "jobs", T, J).
            {Prefix, Record} = call(P, in_couchdb_dir, [Db, get, {<<"couch_workers">>, <<"jobs">>, T, J}]),
            ?assert(is_binary(Prefix) andalso byte_size(Prefix) > 0),
            ?assertNotEqual(not_found, Record),
            Tuple = call(P, erlfdb_tuple, unpack, [Record]),
            ?assertEqual(4, element(1, Tuple)),
            ?assertEqual(<<"pending">>, element(2, Tuple)),
            %% erlfdb -> couch_workers: ("couch_workers", "paused", T) = "".
            ?assertEqual(false, call(P, couch_workers_ops, job_paused, [T])),
            {Prefix, ok} = call(P, in_couchdb_dir, [Db, set, {<<"couch_workers">>, <<"paused">>, T}]),
            ?assertEqual(true, call(P, couch_workers_ops, job_paused, [T])),
            {Prefix, ok} = call(P, in_couchdb_dir, [Db, clear, {<<"couch_workers">>, <<"paused">>, T}]),
            ?assertEqual(false, call(P, couch_workers_ops, job_paused, [T]))
        after
            _ = call(P, couch_workers, job_remove, [T, J])
        end,
        {_, Gone} = call(P, in_couchdb_dir, [Db, get, {<<"couch_workers">>, <<"jobs">>, T, J}]),
        ?assertEqual(not_found, Gone),
        ok = call(P, cw_stop, []),
        %% The production directory keeps nothing of this test's type.
        ok = call(P, clear_type, [Db, T])
    end).

%% The other way round: erlfdb creates the directory (as CouchDB's
%% fabric2 does before couch_workers starts), couch_workers opens it, and
%% both use one prefix. On a test directory of this run,
%% ["couch_workers_test", Name] (the one the `fdb_test' store opens), so
%% that the directory is new whatever the cluster holds.
directory_erlfdb_created_is_opened_by_couch_workers(#{cluster := CF} = Ctx) ->
    with_peer(Ctx, fun(P) ->
        Db = call(P, erlfdb_start, [CF]),
        Name = list_to_binary(name("c2")),
        Path = [<<"couch_workers_test">>, Name],
        T = <<"cw_erlfdb_c2">>,
        {Prefix, ok} = call(P, in_dir, [Db, Path, set, {<<"couch_workers">>, <<"paused">>, T}]),
        ok = call(P, cw_start, [{fdb_test, CF, Name}]),
        ?assertEqual(true, call(P, couch_workers_ops, job_paused, [T])),
        ok = call(P, couch_workers, job_add, [T, <<"j">>, #{}, #{}]),
        {Prefix, Record} = call(P, in_dir, [Db, Path, get, {<<"couch_workers">>, <<"jobs">>, T, <<"j">>}]),
        Tuple = call(P, erlfdb_tuple, unpack, [Record]),
        ?assertEqual({4, <<"pending">>}, {element(1, Tuple), element(2, Tuple)}),
        %% The fdb_test store removes its directory when it stops.
        ok = call(P, cw_stop, []),
        ?assertEqual(false, call(P, in_dir, [Db, Path, exists, {}]))
    end).

%% ---- (d) stopping one leaves the other --------------------------------------

%% application:stop(couch_workers) leaves erlfdb working (the network is
%% erlfdb's and stays up), and couch_workers starts again on it.
stop_couch_workers_leaves_erlfdb(#{cluster := CF} = Ctx) ->
    with_peer(Ctx, fun(P) ->
        Db = call(P, erlfdb_start, [CF]),
        Store = {fdb_test, CF, name("d")},
        ok = call(P, cw_start, [Store]),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"d1">>])),
        ok = call(P, cw_stop, []),
        ?assertEqual(ok, call(P, erlfdb_roundtrip, [Db, <<"d1">>])),
        ok = call(P, cw_start, [Store]),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"d2">>])),
        ?assertEqual(ok, call(P, erlfdb_roundtrip, [Db, <<"d2">>])),
        ok = call(P, cw_stop, []),
        %% And once more, with a new erlfdb handle too.
        ok = call(P, cw_start, [Store]),
        Db2 = call(P, erlfdb_start, [CF]),
        ?assertEqual(ok, call(P, erlfdb_roundtrip, [Db2, <<"d3">>])),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"d3">>])),
        ok = call(P, cw_stop, [])
    end).

%% erlfdb's handles dropped (the database closed, its resources
%% collected) and its application stopped: couch_workers goes on.
drop_erlfdb_leaves_couch_workers(#{cluster := CF} = Ctx) ->
    with_peer(Ctx, fun(P) ->
        Db = call(P, erlfdb_start, [CF]),
        ?assertEqual(ok, call(P, erlfdb_roundtrip, [Db, <<"e1">>])),
        ok = call(P, cw_start, [{fdb_test, CF, name("e")}]),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"e1">>])),
        ok = call(P, erlfdb_close, [Db]),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"e2">>])),
        ok = call(P, application, stop, [erlfdb]),
        ?assertEqual(ok, call(P, cw_roundtrip, [<<"e3">>])),
        ok = call(P, cw_stop, [])
    end).

%% ---- (e) the VM exits cleanly ---------------------------------------------

vm_exits_cleanly_erlfdb_first(Ctx) ->
    [vm_exit(Ctx, erlfdb_first, How, N) || How <- [init_stop, halt], N <- [1, 2]],
    ok.

vm_exits_cleanly_couch_workers_first(Ctx) ->
    [vm_exit(Ctx, couch_workers_first, How, N) || How <- [init_stop, halt], N <- [1]],
    ok.

%% A separate `erl' with both loaded runs a few operations of each, then
%% init:stop() (or halt(0)); exit status 0, its last line printed, no crash
%% dump, no signal.
vm_exit(#{cluster := CF, erlfdb_ebin := Ebin}, Order, How, N) ->
    Dir = tmp_dir(),
    Dump = filename:join(Dir, "erl_crash.dump"),
    Name = name("x"),
    Eval = lists:flatten(io_lib:format("~p:vm_exit_script(~p, ~p, ~p, ~p).", [?MODULE, CF, Order, How, Name])),
    Erl = os:find_executable("erl"),
    Args = lists:append([["-pa", Pa] || Pa <- own_paths(Ebin)]) ++ ["-noshell", "-noinput", "-eval", Eval],
    Port = open_port({spawn_executable, Erl}, [
        exit_status,
        stderr_to_stdout,
        binary,
        {cd, Dir},
        {args, Args},
        {env, [{"ERL_CRASH_DUMP", Dump}]}
    ]),
    {Status, Out} = collect(Port, [], 90000),
    _ = file:del_dir_r(Dir),
    Label = {Order, How, N},
    ?assertEqual({Label, 0, Out}, {Label, Status, Out}),
    ?assertNotEqual({Label, nomatch}, {Label, binary:match(Out, <<"vm_exit_script done">>)}),
    ?assertEqual({Label, nomatch}, {Label, binary:match(Out, [<<"Segmentation">>, <<"Abort">>, <<"crash dump">>, <<"panicked">>])}),
    ?assertEqual({Label, false}, {Label, filelib:is_regular(Dump)}).

collect(Port, Acc, Timeout) ->
    receive
        {Port, {data, D}} -> collect(Port, [D | Acc], Timeout);
        {Port, {exit_status, S}} -> {S, iolist_to_binary(lists:reverse(Acc))}
    after Timeout ->
        catch port_close(Port),
        {timeout, iolist_to_binary(lists:reverse(Acc))}
    end.

%% Run in the separate `erl' (-eval): both clients, a few operations, then
%% the exit under test. Any failure ends the VM with status 3.
vm_exit_script(CF, Order, How, Name) ->
    try
        ok = peer_setup(),
        Db =
            case Order of
                erlfdb_first ->
                    D = erlfdb_start(CF),
                    ok = cw_start({fdb_test, CF, Name}),
                    D;
                couch_workers_first ->
                    ok = cw_start({fdb_test, CF, Name}),
                    erlfdb_start(CF)
            end,
        ok = erlfdb_roundtrip(Db, <<"x1">>),
        ok = cw_roundtrip(<<"x1">>),
        %% Work in flight on both when the VM goes down.
        T = iolist_to_binary(["x_", Name]),
        _ = [couch_workers:job_add(T, integer_to_binary(I), #{}, #{}) || I <- lists:seq(1, 20)],
        _ = erlfdb:transactional(db(Db), fun(Tx) -> erlfdb:get(Tx, <<"k">>) end),
        io:format("vm_exit_script done~n"),
        case How of
            init_stop -> init:stop();
            halt -> erlang:halt(0)
        end
    catch
        C:R:S ->
            io:format("vm_exit_script failed: ~p:~p~n~p~n", [C, R, S]),
            erlang:halt(3)
    end.

%% ---- on the peers ----------------------------------------------------------

%% erlfdb configured as CouchDB must (docs/fdb.md): API version 710.
peer_setup() ->
    logger:set_primary_config(level, warning),
    _ = application:load(erlfdb),
    _ = application:load(couch_workers),
    ok = application:set_env(erlfdb, api_version, ?API_VERSION),
    ok.

%% Opens a database handle and keeps it on the peer (a NIF resource does
%% not survive the trip to the test VM and back): the tests name it by the
%% key returned.
erlfdb_start(CF) ->
    {ok, _} = application:ensure_all_started(erlfdb),
    Db = erlfdb:open(list_to_binary(CF)),
    Key = {?MODULE, db, erlang:unique_integer([positive])},
    persistent_term:put(Key, Db),
    Key.

db({?MODULE, db, _} = Key) -> persistent_term:get(Key);
db(Db) -> Db.

%% A set, a get and a clear of one key, and a get of it in a second
%% transaction.
erlfdb_roundtrip(DbKey, Tag) ->
    Db = db(DbKey),
    K = erlfdb_tuple:pack({<<"couch_workers_erlfdb_tests">>, Tag, integer_to_binary(erlang:unique_integer([positive]))}),
    V = <<"v-", Tag/binary>>,
    ok = erlfdb:set(Db, K, V),
    V = erlfdb:get(Db, K),
    ok = erlfdb:clear(Db, K),
    not_found = erlfdb:get(Db, K),
    ok.

%% The database handle dropped and collected (erlfdb has no close: the
%% resource goes with its last reference), and the erlfdb app stopped.
erlfdb_close(DbKey) ->
    ok = erlfdb_roundtrip(DbKey, <<"last">>),
    _ = persistent_term:erase(DbKey),
    _ = [erlang:garbage_collect(Pid) || Pid <- processes()],
    ok.

cw_start(Store) ->
    ok = application:set_env(couch_workers, store, Store),
    {ok, _} = application:ensure_all_started(couch_workers),
    ok.

cw_stop() ->
    application:stop(couch_workers).

%% A job added, read, accepted by a registered worker and finished.
cw_roundtrip(Tag) ->
    T = iolist_to_binary(["rt_", Tag, "_", integer_to_binary(erlang:unique_integer([positive]))]),
    J = <<"j1">>,
    ok = couch_workers:job_add(T, J, #{<<"tag">> => Tag}, #{}),
    {ok, #{state := pending, info := #{<<"tag">> := Tag}}} = couch_workers:job_get(T, J),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    true = is_reference(W),
    {ok, #{id := J} = Handle} = couch_workers:job_accept(W, #{timeout => 5000}),
    ok = couch_workers:job_finish(Handle, #{<<"done">> => true}),
    {ok, #{state := finished}} = couch_workers:job_get(T, J),
    ok = couch_workers:job_remove(T, J),
    ok = couch_workers:worker_unregister(W),
    ok.

%% The names of this OS process's threads (Linux /proc; [] elsewhere).
fdb_threads() ->
    Task = "/proc/self/task",
    case file:list_dir(Task) of
        {ok, Tids} ->
            [string:trim(C) || Tid <- Tids, {ok, C} <- [file:read_file(filename:join([Task, Tid, "comm"]))]];
        _ ->
            []
    end.

%% Op on the key Tuple under erlfdb's directory ["couchdb"]; returns the
%% directory's prefix and the result.
in_couchdb_dir(DbKey, Op, Tuple) ->
    in_dir(DbKey, [<<"couchdb">>], Op, Tuple).

%% The same under erlfdb's directory Path (created when missing; `exists':
%% whether it is there, nothing created).
in_dir(DbKey, Path, exists, _Tuple) ->
    erlfdb:transactional(db(DbKey), fun(Tx) ->
        erlfdb_directory:exists(Tx, erlfdb_directory:root(), Path)
    end);
in_dir(DbKey, Path, Op, Tuple) ->
    erlfdb:transactional(db(DbKey), fun(Tx) ->
        Dir = erlfdb_directory:create_or_open(Tx, erlfdb_directory:root(), Path),
        Key = erlfdb_directory:pack(Dir, Tuple),
        Result =
            case Op of
                get -> erlfdb:wait(erlfdb:get(Tx, Key));
                set -> erlfdb:set(Tx, Key, <<>>);
                clear -> erlfdb:clear(Tx, Key)
            end,
        {erlfdb_directory:key(Dir), Result}
    end).

%% Clears every key of job type T under ["couchdb"] (docs/keyspace.md:
%% the type is the third element of these keys).
clear_type(DbKey, T) ->
    erlfdb:transactional(db(DbKey), fun(Tx) ->
        Dir = erlfdb_directory:create_or_open(Tx, erlfdb_directory:root(), [<<"couchdb">>]),
        lists:foreach(
            fun(Sub) ->
                Prefix = erlfdb_directory:pack(Dir, {<<"couch_workers">>, Sub, T}),
                erlfdb:clear_range(Tx, <<Prefix/binary, 0>>, <<Prefix/binary, 255>>),
                erlfdb:clear(Tx, Prefix)
            end,
            [<<"jobs">>, <<"pending">>, <<"scheduled">>, <<"counts">>, <<"by_state">>, <<"types">>,
             <<"paused">>, <<"jobs_vs">>, <<"workers">>]
        )
    end),
    ok.

%% ---- job calls inside the caller's transaction ------------------------------

%% A document key and `job_add/5' in one erlfdb transaction: an abort
%% (throw) leaves neither, a commit both; the committed job is pending, a
%% `job_get/3' in a later transaction answers what `job_get/2' does, and a
%% worker accepts it.
job_add_in_caller_tx(#{cluster := CF} = Ctx) ->
    with_peer(Ctx, fun(P) ->
        Db = call(P, erlfdb_start, [CF]),
        ok = call(P, cw_start, [{fdb_test, CF, name("tx")}]),
        T = iolist_to_binary(["cw_tx_", name("t")]),
        Doc = erlfdb_tuple_key(T),
        ?assertEqual(aborted, call(P, tx_add, [Db, T, <<"j1">>, Doc, abort])),
        ?assertEqual({error, not_found}, call(P, couch_workers, job_get, [T, <<"j1">>])),
        ?assertEqual(not_found, call(P, doc_get, [Db, Doc])),
        ?assertEqual(committed, call(P, tx_add, [Db, T, <<"j1">>, Doc, commit])),
        ?assertEqual(<<"doc">>, call(P, doc_get, [Db, Doc])),
        {ok, Job} = call(P, couch_workers, job_get, [T, <<"j1">>]),
        ?assertMatch(#{state := pending, info := #{<<"doc">> := Doc}}, Job),
        ?assertEqual({ok, Job}, call(P, tx_get, [Db, T, <<"j1">>])),
        ?assertEqual({error, not_found}, call(P, tx_get, [Db, T, <<"j2">>])),
        %% A second add of the id, in a transaction of its own: refused,
        %% and the refusal is the call's answer (the transaction commits).
        ?assertEqual({already_exists, committed}, call(P, tx_add, [Db, T, <<"j1">>, Doc, commit])),
        ?assertMatch({ok, #{id := <<"j1">>}}, call(P, accept_one, [T])),
        ok = call(P, couch_workers, job_remove, [T, <<"j1">>]),
        ok = call(P, cw_stop, [])
    end).

erlfdb_tuple_key(T) ->
    <<"couch_workers_erlfdb_tests/doc/", T/binary>>.

%% On the peer: in one transaction, the document and the job; then
%% `commit' returns, `abort' throws out of the transaction.
tx_add(DbKey, T, J, Doc, Outcome) ->
    try
        erlfdb:transactional(db(DbKey), fun(Tx) ->
            erlfdb:set(Tx, Doc, <<"doc">>),
            Added = couch_workers:job_add(Tx, T, J, #{<<"doc">> => Doc}, #{}),
            case {Outcome, Added} of
                {abort, ok} -> throw(aborted);
                {commit, ok} -> committed;
                {commit, {error, Why}} -> {Why, committed}
            end
        end)
    catch
        throw:aborted -> aborted
    end.

tx_get(DbKey, T, J) ->
    erlfdb:transactional(db(DbKey), fun(Tx) -> couch_workers:job_get(#{tx => Tx}, T, J) end).

doc_get(DbKey, Doc) ->
    erlfdb:get(db(DbKey), Doc).

accept_one(T) ->
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    try
        couch_workers:job_accept(W, #{timeout => 5000})
    after
        couch_workers:worker_unregister(W)
    end.

%% ---- peers -----------------------------------------------------------------

with_peer(Ctx, Fun) ->
    with_peer(Ctx, Fun, []).

%% A fresh VM (its own libfdb_c) with this VM's code path (the app and the
%% tests) and erlfdb's ebin (none with `without_erlfdb'), set up by
%% peer_setup/0; always stopped after.
with_peer(#{erlfdb_ebin := Ebin}, Fun, Opts) ->
    Erl = os:find_executable("erl"),
    Erlfdb =
        case lists:member(without_erlfdb, Opts) of
            true -> none;
            false -> Ebin
        end,
    Args = lists:append([["-pa", P] || P <- own_paths(Erlfdb)]),
    {ok, Peer, _Node} = peer:start(#{exec => Erl, connection => standard_io, args => Args, wait_boot => 30000}),
    OsPid = peer:call(Peer, os, getpid, [], 15000),
    try
        ok = call(Peer, peer_setup, []),
        Fun(Peer)
    after
        catch peer:stop(Peer),
        _ = os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null")
    end.

call(Peer, F, A) ->
    call(Peer, ?MODULE, F, A).

call(Peer, M, F, A) ->
    peer:call(Peer, M, F, A, 60000).

%% This VM's code path without OTP's own, and erlfdb's ebin (unless
%% `none').
own_paths(Erlfdb) ->
    OtpLib = code:lib_dir(),
    Own = [P || P <- code:get_path(), not lists:prefix(OtpLib, P), P =/= "."],
    case Erlfdb of
        none -> [P || P <- Own, not is_erlfdb_ebin(P)];
        _ -> [Erlfdb | Own]
    end.

name(Tag) ->
    "cw_erlfdb_" ++ Tag ++ "_" ++ os:getpid() ++ "_" ++ integer_to_list(erlang:unique_integer([positive])).

tmp_dir() ->
    Dir = filename:join("/tmp", name("vm")),
    ok = filelib:ensure_dir(filename:join(Dir, "x")),
    Dir.
