%% @doc Job calls inside a caller's FoundationDB transaction
%% (`couch_workers_tx'; docs/api.md, "Inside a caller's FoundationDB
%% transaction").
%%
%% * Refusals, on whichever store the suites run on (the app in this VM):
%%   `undefined' is the call without `Tx'; a `Tx' of a wrong shape is
%%   `badarg'; on the embedded store every call is `{error, fdb_only}'
%%   and writes nothing; on FoundationDB a tuple that only looks like an
%%   erlfdb transaction raises an error and the app keeps working.
%% * On a live cluster with erlfdb (FDB_CLUSTER_FILE set, erlfdb built by
%%   scripts/build-erlfdb.sh), two peer VMs `a' and `b' that share one
%%   test directory: CouchDB's two patterns (the replicator's: a document
%%   and its job in one transaction, taken by a worker waiting on the other
%%   node; the indexer's: rows and `job_update/3' in every transaction,
%%   fenced at the commit when the job is taken over), a resubmit while the
%%   job runs, the other calls, and the refusals of a committed, a
%%   cancelled and another cluster's transaction.
-module(couch_workers_tx_tests).

-include_lib("eunit/include/eunit.hrl").

-import(couch_workers_erlfdb_tests, [call/4, db/1]).

%% The live tests (named in live_test_/0).
-export([
    replicator_pattern/1,
    wake_up_on_other_node/1,
    update_fenced_at_commit/1,
    indexer_pattern_failover/1,
    resubmit_while_running/1,
    finish_cancel_remove_get/1,
    calls_mix_with_caller_writes/1,
    same_job_twice_in_one_tx/1,
    own_pending_key_cleared_only/1,
    commit_unknown_after_it_landed/1,
    other_process_same_tx/1,
    committed_cancelled_other_cluster/1,
    counted_once_on_commit/1,
    counted_once_after_a_retry/1,
    other_calls_counted/1
]).

%% Run on the peers.
-export([
    start_node/3,
    tx/2,
    parked_start/3,
    doc_tx_add/5,
    doc_tx_add_at/4,
    range/2,
    landed_then_unknown/2,
    waiter_start/2,
    waiter_results/1,
    indexer_start/6,
    owner_start/3,
    owner_call/2,
    telemetry_start/0,
    tx_events/1,
    tx_metrics/1,
    put_key/2
]).

%% How many documents the replicator's wake-up is timed on.
-define(WAKE_SAMPLES, 20).
-define(WAIT_MS, 15000).

%% ---- refusals (the app in this VM) -------------------------------------------

refusals_test_() ->
    couch_workers_test_util:app_fixture(
        "job calls with a Tx: refusals",
        fun() -> couch_workers_test_util:unique_type("tx") end,
        fun(_) -> ok end,
        [
            fun(T) -> {"undefined is the call without Tx", ?_test(undefined_is_own_transaction(T))} end,
            fun(T) -> {"a Tx of a wrong shape is badarg", ?_test(wrong_shape_is_badarg(T))} end,
            fun(T) -> {"a Tx erlfdb did not make: fdb_only or an error", ?_test(not_erlfdb_tx(T))} end
        ]
    ).

undefined_is_own_transaction(T) ->
    ?assertEqual(ok, couch_workers:job_add(undefined, T, <<"j">>, #{<<"a">> => 1}, #{})),
    ?assertMatch({ok, #{state := pending, info := #{<<"a">> := 1}}}, couch_workers:job_get(undefined, T, <<"j">>)),
    ?assertEqual(ok, couch_workers:job_resubmit(undefined, T, <<"j">>, #{<<"a">> => 2}, #{})),
    W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    {ok, H} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assertMatch({ok, #{info := #{<<"a">> := 3}}}, couch_workers:job_update(undefined, H, #{<<"a">> => 3})),
    ?assertEqual(ok, couch_workers:job_finish(undefined, H, #{<<"r">> => 1})),
    ?assertEqual(ok, couch_workers:job_cancel(undefined, T, <<"j">>)),
    ?assertMatch({ok, #{state := finished}}, couch_workers:job_get(T, <<"j">>)),
    ?assertEqual(ok, couch_workers:job_remove(undefined, T, <<"j">>)),
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j">>)),
    ok = couch_workers:worker_unregister(W).

wrong_shape_is_badarg(T) ->
    H = #{type => T, id => <<"j">>, worker => <<"w">>, token => <<0:128>>},
    [
        begin
            ?assertError(badarg, couch_workers:job_add(Bad, T, <<"j">>, #{}, #{})),
            ?assertError(badarg, couch_workers:job_get(Bad, T, <<"j">>)),
            ?assertError(badarg, couch_workers:job_resubmit(Bad, T, <<"j">>, #{}, #{})),
            ?assertError(badarg, couch_workers:job_update(Bad, H, #{})),
            ?assertError(badarg, couch_workers:job_finish(Bad, H, #{})),
            ?assertError(badarg, couch_workers:job_cancel(Bad, T, <<"j">>)),
            ?assertError(badarg, couch_workers:job_remove(Bad, T, <<"j">>))
        end
     || Bad <- [{erlfdb_database, make_ref()}, self(), #{db => x}, {erlfdb_transaction, not_a_ref}, 42]
    ],
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j">>)).

%% `{erlfdb_transaction, Ref}' with a reference erlfdb never made: on the
%% embedded store the NIF refuses before anything is read; on
%% FoundationDB erlfdb (absent from this VM, or refusing the reference)
%% raises. Either way nothing is written and the app keeps answering.
not_erlfdb_tx(T) ->
    Fake = {erlfdb_transaction, make_ref()},
    H = #{type => T, id => <<"j">>, worker => <<"w">>, token => <<0:128>>},
    Calls = [
        fun() -> couch_workers:job_add(Fake, T, <<"j">>, #{}, #{}) end,
        fun() -> couch_workers:job_get(#{tx => Fake}, T, <<"j">>) end,
        fun() -> couch_workers:job_resubmit(Fake, T, <<"j">>, #{}, #{}) end,
        fun() -> couch_workers:job_update(Fake, H, #{}) end,
        fun() -> couch_workers:job_finish(Fake, H, #{}) end,
        fun() -> couch_workers:job_cancel(Fake, T, <<"j">>) end,
        fun() -> couch_workers:job_remove(Fake, T, <<"j">>) end
    ],
    case application:get_env(couch_workers, store) of
        {ok, {embedded, _}} ->
            [?assertEqual({error, fdb_only}, C()) || C <- Calls];
        {ok, _} ->
            [?assertMatch({raised, _}, try C() of Answer -> {answered, Answer} catch _:R -> {raised, R} end) || C <- Calls]
    end,
    ?assertEqual({error, not_found}, couch_workers:job_get(T, <<"j">>)),
    ?assertEqual(ok, couch_workers:job_add(T, <<"after">>, #{}, #{})),
    ?assertEqual(ok, couch_workers:job_remove(T, <<"after">>)).

%% ---- on a live cluster, with erlfdb -------------------------------------------

live_test_() ->
    case {os:getenv("FDB_CLUSTER_FILE"), couch_workers_erlfdb_tests:find_erlfdb()} of
        {F, _} when F =:= false; F =:= "" ->
            [];
        {_, {error, Why}} ->
            [{"erlfdb found", ?_assertEqual(found, {erlfdb_not_found, unicode:characters_to_binary(Why)})}];
        {CF, {ok, Ebin}} ->
            {setup, fun() -> start_nodes(CF, Ebin) end, fun stop_nodes/1, fun(Ctx) ->
                [
                    named(replicator_pattern, Ctx),
                    named(wake_up_on_other_node, Ctx),
                    named(update_fenced_at_commit, Ctx),
                    named(indexer_pattern_failover, Ctx),
                    named(resubmit_while_running, Ctx),
                    named(finish_cancel_remove_get, Ctx),
                    named(calls_mix_with_caller_writes, Ctx),
                    named(same_job_twice_in_one_tx, Ctx),
                    named(own_pending_key_cleared_only, Ctx),
                    named(commit_unknown_after_it_landed, Ctx),
                    named(other_process_same_tx, Ctx),
                    named(committed_cancelled_other_cluster, Ctx),
                    named(counted_once_on_commit, Ctx),
                    named(counted_once_after_a_retry, Ctx),
                    named(other_calls_counted, Ctx)
                ]
            end}
    end.

named(Name, Ctx) ->
    %% The type names the documents and rows too, which live outside the
    %% app's test directory: unique across runs on one cluster.
    Type = iolist_to_binary(["tx_", atom_to_list(Name), "_", os:getpid(), "_",
        integer_to_list(erlang:system_time(microsecond))]),
    {atom_to_list(Name), {timeout, 60, fun() -> ?MODULE:Name(Ctx#{type => Type}) end}}.

%% Two peers with erlfdb and the app on one test directory of `CF'.
start_nodes(CF, Ebin) ->
    Name = couch_workers_erlfdb_tests:name("tx"),
    A = start_peer(Ebin),
    B = start_peer(Ebin),
    DbA = call(peer(A), ?MODULE, start_node, [CF, Name, owner]),
    DbB = call(peer(B), ?MODULE, start_node, [CF, Name, shared]),
    #{a => A, b => B, db_a => DbA, db_b => DbB, cluster => CF}.

stop_nodes(#{a := A, b := B}) ->
    [stop_peer(P) || P <- [B, A]],
    ok.

start_peer(Ebin) ->
    Erl = os:find_executable("erl"),
    OtpLib = code:lib_dir(),
    Paths = [Ebin | [P || P <- code:get_path(), not lists:prefix(OtpLib, P), P =/= "."]],
    Args = lists:append([["-pa", P] || P <- Paths]),
    {ok, Peer, _Node} = peer:start(#{exec => Erl, connection => standard_io, args => Args, wait_boot => 30000}),
    OsPid = peer:call(Peer, os, getpid, [], 15000),
    ok = peer:call(Peer, couch_workers_erlfdb_tests, peer_setup, [], 15000),
    #{peer => Peer, os_pid => OsPid}.

stop_peer(#{peer := Peer, os_pid := OsPid}) ->
    _ = os:cmd("kill -CONT " ++ OsPid),
    catch peer:call(Peer, application, stop, [couch_workers], 15000),
    catch peer:stop(Peer),
    _ = os:cmd("kill -9 " ++ OsPid ++ " 2>/dev/null"),
    ok.

peer(#{peer := P}) -> P.

pcall(Node, M, F, A) -> call(peer(Node), M, F, A).

%% The replicator's pattern: a document and its job in one transaction.
%% Aborted: neither. Committed: both; the job pending, exact in the
%% counts, seen by a subscription, then taken by the worker on `b'.
replicator_pattern(#{a := A, b := B, db_a := Db, type := T}) ->
    Doc = <<"couch_workers_tx_tests/doc/", T/binary>>,
    ?assertEqual(aborted, pcall(A, ?MODULE, doc_tx_add, [Db, T, <<"r1">>, Doc, abort])),
    ?assertEqual({error, not_found}, pcall(B, couch_workers, job_get, [T, <<"r1">>])),
    ?assertEqual([], pcall(A, ?MODULE, range, [Db, Doc])),
    ?assertEqual(committed, pcall(A, ?MODULE, doc_tx_add, [Db, T, <<"r1">>, Doc, commit])),
    ?assertEqual([{Doc, <<"doc">>}], pcall(A, ?MODULE, range, [Db, Doc])),
    ?assertMatch({ok, #{state := pending, info := #{<<"doc">> := Doc}}}, pcall(B, couch_workers, job_get, [T, <<"r1">>])),
    ?assertMatch(#{pending := 1, running := 0}, pcall(B, couch_workers, job_counts, [T])),
    ?assertEqual({already_exists, committed}, pcall(A, ?MODULE, doc_tx_add, [Db, T, <<"r1">>, Doc, commit])),
    Waiter = pcall(B, ?MODULE, waiter_start, [T, 1]),
    ?assertMatch([{<<"r1">>, _}], pcall(B, ?MODULE, waiter_results, [Waiter])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {get_state, T, <<"r1">>}])),
    ?assertMatch(#{pending := 0, finished := 1}, pcall(B, couch_workers, job_counts, [T])).

%% A job added in a committed transaction on `a' wakes an accept already
%% waiting on `b' (as job_add/4 does: the same key written): the time from
%% the commit's return on `a' to the accept's answer on `b' (one host, one
%% clock), over ?WAKE_SAMPLES documents, p99 under 50 ms.
wake_up_on_other_node(#{a := A, b := B, db_a := Db, type := T}) ->
    Waiter = pcall(B, ?MODULE, waiter_start, [T, ?WAKE_SAMPLES]),
    Committed = [
        begin
            Id = integer_to_binary(I),
            Doc = <<"couch_workers_tx_tests/wake/", T/binary, "/", Id/binary>>,
            {committed, At} = pcall(A, ?MODULE, doc_tx_add_at, [Db, T, Id, Doc]),
            %% The worker takes it before the next is added.
            wait_taken(B, T, Id),
            {Id, At}
        end
     || I <- lists:seq(1, ?WAKE_SAMPLES)
    ],
    Taken = pcall(B, ?MODULE, waiter_results, [Waiter]),
    Ms = lists:sort([(maps:get(Id, maps:from_list(Taken)) - At) / 1000 || {Id, At} <- Committed]),
    P99 = lists:nth(min(length(Ms), (length(Ms) * 99 + 99) div 100), Ms),
    io:format(standard_error, "~n    wake-up after a commit in a caller's transaction, ~b jobs: median ~.1f ms, p99 ~.1f ms, max ~.1f ms~n",
        [length(Ms), lists:nth(length(Ms) div 2 + 1, Ms), P99, lists:last(Ms)]),
    ?assert(P99 < 50).

wait_taken(B, T, Id) ->
    wait_until(fun() ->
        case pcall(B, couch_workers, job_get, [T, Id]) of
            {ok, #{state := S}} -> S =/= pending;
            _ -> false
        end
    end, ?WAIT_MS).

%% Fencing at the commit: an update read the job and answered `ok'; then
%% another node cancels it, or removes it: the commit fails with a
%% conflict (1020), and the fun run again answers what the job now is.
update_fenced_at_commit(#{a := A, b := B, db_a := Db, type := T}) ->
    Owner = pcall(A, ?MODULE, owner_start, [tx_fenced_owner, T, <<"w">>]),
    [
        begin
            ok = pcall(B, couch_workers, job_add, [T, Id, #{}, #{}]),
            {ok, H} = pcall(A, ?MODULE, owner_call, [Owner, accept]),
            ?assertMatch(#{id := Id}, H),
            Name = list_to_atom("tx_fenced_" ++ binary_to_list(Id)),
            Updater = pcall(A, ?MODULE, parked_start, [Name, Db, {update, H, #{<<"n">> => 1}}]),
            {parked, 1} = pcall(A, ?MODULE, owner_call, [Updater, wait_parked]),
            ok = pcall(B, couch_workers, Other, [T, Id]),
            ok = pcall(A, ?MODULE, owner_call, [Updater, go]),
            {Codes, Second} = pcall(A, ?MODULE, owner_call, [Updater, wait_done]),
            ?assertEqual([1020], Codes),
            ?assertEqual(Expect, Second)
        end
     || {Id, Other, Expect} <- [{<<"c">>, job_cancel, {error, canceled}}, {<<"r">>, job_remove, {error, not_found}}]
    ],
    ?assertMatch({ok, #{state := canceled}}, pcall(B, couch_workers, job_get, [T, <<"c">>])),
    ?assertEqual({error, not_found}, pcall(B, couch_workers, job_get, [T, <<"r">>])).

%% CouchDB's indexer: two indexers of one job, each writing rows in a
%% loop of transactions that each call job_update(Tx, ...). The first
%% (worker timeout 1 s, on `a') stops inside its 3rd transaction after
%% the update answered; its node is frozen (SIGSTOP) until its worker is
%% reaped and the job taken by the second indexer on `b', which writes
%% its rows; then `a' runs on and tries to commit. Not one row of that
%% transaction (or any later one) of the first indexer lands; every row
%% the second one committed does.
indexer_pattern_failover(#{a := A, b := B, db_a := DbA, db_b := DbB, type := T}) ->
    Rows = <<"couch_workers_tx_tests/rows/", T/binary, "/">>,
    ok = pcall(B, couch_workers, job_add, [T, <<"view">>, #{}, #{}]),
    First = pcall(A, ?MODULE, indexer_start, [tx_indexer_1, DbA, T, <<"i1">>, Rows, #{timeout => 1, park_at => 3}]),
    {parked, 3} = pcall(A, ?MODULE, owner_call, [First, wait_parked]),
    Second = pcall(B, ?MODULE, indexer_start, [tx_indexer_2, DbB, T, <<"i2">>, Rows, #{timeout => 10, stop_at => 5}]),
    #{os_pid := OsPid} = A,
    "" = os:cmd("kill -STOP " ++ OsPid),
    T0 = erlang:monotonic_time(millisecond),
    SecondDone =
        try
            pcall(B, ?MODULE, owner_call, [Second, wait_done])
        after
            "" = os:cmd("kill -CONT " ++ OsPid)
        end,
    Frozen = erlang:monotonic_time(millisecond) - T0,
    {done, SecondCommitted, stopped_at_limit} = SecondDone,
    ok = pcall(A, ?MODULE, owner_call, [First, go]),
    {done, FirstCommitted, {stopped, Why, Codes}} = pcall(A, ?MODULE, owner_call, [First, wait_done]),
    io:format(standard_error, "~n    first indexer frozen ~b ms; its parked commit failed with ~w, then ~w~n",
        [Frozen, Codes, Why]),
    ?assertEqual([1, 2], FirstCommitted),
    ?assertEqual([1, 2, 3, 4, 5], SecondCommitted),
    ?assert(lists:member(Why, [not_owner, not_found])),
    %% The parked transaction did not commit: a conflict (the job's record
    %% changed since its read), or too old if the freeze outlasted 5 s.
    ?assertMatch([C | _] when C =:= 1020; C =:= 1007, Codes),
    Landed = [K || {K, _} <- pcall(B, ?MODULE, range, [DbB, Rows])],
    ?assertEqual(
        lists:sort([<<Rows/binary, "i1/", (integer_to_binary(I))/binary>> || I <- FirstCommitted] ++
            [<<Rows/binary, "i2/", (integer_to_binary(I))/binary>> || I <- SecondCommitted]),
        lists:sort(Landed)
    ).

%% A resubmit in the caller's transaction while the job runs: it waits in
%% the record, and the run's end queues the job again with the new info.
resubmit_while_running(#{a := A, b := B, db_b := Db, type := T}) ->
    Owner = pcall(A, ?MODULE, owner_start, [tx_resubmit_owner, T, <<"w">>]),
    ok = pcall(B, couch_workers, job_add, [T, <<"j">>, #{<<"v">> => 1}, #{}]),
    {ok, H} = pcall(A, ?MODULE, owner_call, [Owner, accept]),
    ?assertEqual({ok, committed}, pcall(B, ?MODULE, tx, [Db, {resubmit, T, <<"j">>, #{<<"v">> => 2}}])),
    ?assertMatch({ok, #{state := running, info := #{<<"v">> := 1}}}, pcall(B, couch_workers, job_get, [T, <<"j">>])),
    ok = pcall(A, couch_workers, job_finish, [H, #{}]),
    ?assertMatch({ok, #{state := pending, info := #{<<"v">> := 2}, attempts := 0}},
        pcall(B, couch_workers, job_get, [T, <<"j">>])).

%% The other calls, each in a transaction of its own, and their answers
%% against the own-transaction twins'.
finish_cancel_remove_get(#{a := A, b := B, db_a := Db, type := T}) ->
    Owner = pcall(A, ?MODULE, owner_start, [tx_finish_owner, T, <<"w">>]),
    ok = pcall(B, couch_workers, job_add, [T, <<"f">>, #{}, #{}]),
    {ok, H} = pcall(A, ?MODULE, owner_call, [Owner, accept]),
    {ok, Job} = pcall(B, couch_workers, job_get, [T, <<"f">>]),
    ?assertEqual({{ok, Job}, committed}, pcall(A, ?MODULE, tx, [Db, {get, T, <<"f">>}])),
    Sub = pcall(B, ?MODULE, owner_start, [tx_sub, T, none]),
    {ok, _, #{state := running}} = pcall(B, ?MODULE, owner_call, [Sub, {subscribe, T, <<"f">>}]),
    {{ok, H1}, committed} = pcall(A, ?MODULE, tx, [Db, {update, H, #{<<"p">> => 1}}]),
    ?assertMatch({ok, #{state := running, info := #{<<"p">> := 1}}}, pcall(B, ?MODULE, owner_call, [Sub, {subscription_saw, <<"f">>}])),
    ?assertMatch(#{info := #{<<"p">> := 1}, token := _}, H1),
    ?assertMatch({ok, #{state := running, info := #{<<"p">> := 1}}}, pcall(B, couch_workers, job_get, [T, <<"f">>])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {finish, H1, #{<<"r">> => 1}}])),
    ?assertMatch({ok, #{state := finished, result := #{<<"r">> := 1}}}, pcall(B, couch_workers, job_get, [T, <<"f">>])),
    ?assertEqual({{error, not_owner}, committed}, pcall(A, ?MODULE, tx, [Db, {finish, H1, #{}}])),
    ok = pcall(B, couch_workers, job_add, [T, <<"c">>, #{}, #{}]),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {cancel, T, <<"c">>}])),
    ?assertMatch({ok, #{state := canceled}}, pcall(B, couch_workers, job_get, [T, <<"c">>])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {remove, T, <<"c">>}])),
    ?assertEqual({{error, not_found}, committed}, pcall(A, ?MODULE, tx, [Db, {remove, T, <<"c">>}])),
    ?assertEqual({{error, not_found}, committed}, pcall(A, ?MODULE, tx, [Db, {get, T, <<"c">>}])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {add_scheduled, T, <<"s">>}])),
    ?assertMatch({ok, #{state := scheduled, run_at := RunAt}} when is_integer(RunAt),
        pcall(B, couch_workers, job_get, [T, <<"s">>])),
    ?assertMatch(#{finished := 1, canceled := 0, pending := 0, running := 0, scheduled := 1},
        pcall(B, couch_workers, job_counts, [T])).

%% Several calls in one transaction, on different jobs, between the
%% caller's own reads and writes: all land with one commit, or none.
calls_mix_with_caller_writes(#{a := A, b := B, db_a := Db, type := T}) ->
    Key = <<"couch_workers_tx_tests/mix/", T/binary>>,
    ok = pcall(B, couch_workers, job_add, [T, <<"old">>, #{}, #{}]),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {mix, T, Key, commit}])),
    ?assertEqual([{Key, <<"2">>}], pcall(A, ?MODULE, range, [Db, Key])),
    ?assertMatch(#{pending := 2, canceled := 1}, pcall(B, couch_workers, job_counts, [T])),
    ?assertEqual({ok, aborted}, pcall(A, ?MODULE, tx, [Db, {mix, T, <<Key/binary, "/2">>, abort}])),
    ?assertMatch(#{pending := 2, canceled := 1}, pcall(B, couch_workers, job_counts, [T])),
    ?assertEqual([], pcall(A, ?MODULE, range, [Db, <<Key/binary, "/2">>])).

%% Several calls on one job in one transaction see each other's writes,
%% which FoundationDB itself would refuse to read back (versionstamped):
%% add then get; update, update again, then finish; add then cancel;
%% add then remove. The counts after the commits are exact.
same_job_twice_in_one_tx(#{a := A, b := B, db_a := Db, type := T}) ->
    {{ok, #{state := pending, info := #{<<"v">> := 1}, vs := Vs}}, committed} =
        pcall(A, ?MODULE, tx, [Db, {add_then_get, T, <<"g">>}]),
    ?assertMatch(<<255, 255, 255, 255, 255, 255, 255, 255, 255, 255, _:16>>, Vs),
    {ok, #{state := pending, vs := Committed}} = pcall(B, couch_workers, job_get, [T, <<"g">>]),
    ?assertNotEqual(Vs, Committed),
    Owner = pcall(A, ?MODULE, owner_start, [tx_twice_owner, T, <<"w">>]),
    {ok, H} = pcall(A, ?MODULE, owner_call, [Owner, accept]),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {update_update_finish, H}])),
    ?assertMatch({ok, #{state := finished, info := #{<<"u">> := 2}, result := #{<<"r">> := 1}}},
        pcall(B, couch_workers, job_get, [T, <<"g">>])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {add_then, job_cancel, T, <<"c">>}])),
    ?assertMatch({ok, #{state := canceled}}, pcall(B, couch_workers, job_get, [T, <<"c">>])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {add_then, job_remove, T, <<"r">>}])),
    ?assertEqual({error, not_found}, pcall(B, couch_workers, job_get, [T, <<"r">>])),
    ?assertEqual(#{scheduled => 0, pending => 0, running => 0, finished => 1, canceled => 1, failed => 0},
        pcall(B, couch_workers, job_counts, [T])),
    ?assertEqual(0, pcall(B, couch_workers, job_pending_count, [T])).

%% A job added and canceled in one transaction: its pending key (named
%% only at the commit) is cleared as the range it may become, with that
%% range in the read conflict set. Another node's job added into that
%% range meanwhile fails the commit (1020); the retry commits; the other
%% job stays pending.
own_pending_key_cleared_only(#{a := A, b := B, db_a := Db, type := T}) ->
    Mine = pcall(A, ?MODULE, parked_start, [tx_own_pending, Db, {add_then, job_cancel, T, <<"mine">>}]),
    {parked, 1} = pcall(A, ?MODULE, owner_call, [Mine, wait_parked]),
    ok = pcall(B, couch_workers, job_add, [T, <<"theirs">>, #{}, #{}]),
    ok = pcall(A, ?MODULE, owner_call, [Mine, go]),
    ?assertEqual({[1020], ok}, pcall(A, ?MODULE, owner_call, [Mine, wait_done])),
    ?assertMatch({ok, #{state := canceled}}, pcall(B, couch_workers, job_get, [T, <<"mine">>])),
    ?assertMatch({ok, #{state := pending}}, pcall(B, couch_workers, job_get, [T, <<"theirs">>])),
    ?assertEqual(1, pcall(B, couch_workers, job_pending_count, [T])),
    Waiter = pcall(B, ?MODULE, waiter_start, [T, 1]),
    ?assertMatch([{<<"theirs">>, _}], pcall(B, ?MODULE, waiter_results, [Waiter])).

%% `commit_unknown_result' after a commit that landed: erlfdb's loop
%% runs the fun again (on_error(1021) resets the transaction), and each
%% call answers on what the landed attempt left, as documented (couch_jobs
%% answers `halt' there for the worker's calls).
commit_unknown_after_it_landed(#{a := A, b := B, db_a := Db, type := T}) ->
    ?assertEqual({ok, {error, already_exists}}, pcall(A, ?MODULE, landed_then_unknown, [Db, {add, T, <<"u">>}])),
    Owner = pcall(A, ?MODULE, owner_start, [tx_unknown_owner, T, <<"w">>]),
    {ok, H} = pcall(A, ?MODULE, owner_call, [Owner, accept]),
    {{ok, _}, {ok, _}} = pcall(A, ?MODULE, landed_then_unknown, [Db, {update, H, #{<<"n">> => 1}}]),
    ?assertEqual({ok, {error, not_owner}}, pcall(A, ?MODULE, landed_then_unknown, [Db, {finish, H, #{}}])),
    ?assertMatch({ok, #{state := finished, info := #{<<"n">> := 1}}}, pcall(B, couch_workers, job_get, [T, <<"u">>])).

%% A call with `Tx' from a process other than the one running the
%% transaction: as erlfdb allows, which is nothing (erlfdb refuses every
%% call on a transaction from another process than its creator: badarg):
%% the call raises erlfdb's badarg, writes nothing, and the transaction
%% still commits its owner's writes.
other_process_same_tx(#{a := A, b := B, db_a := Db, type := T}) ->
    Key = <<"couch_workers_tx_tests/other/", T/binary>>,
    ?assertEqual({{raised, badarg}, committed}, pcall(A, ?MODULE, tx, [Db, {other_process, T, <<"p">>, Key}])),
    ?assertEqual([{Key, <<"mine">>}], pcall(A, ?MODULE, range, [Db, Key])),
    ?assertEqual({error, not_found}, pcall(B, couch_workers, job_get, [T, <<"p">>])).

%% A transaction that committed, one that was cancelled, and one of
%% another cluster: an erlfdb error or `wrong_cluster', nothing written.
committed_cancelled_other_cluster(#{a := A, b := B, db_a := Db, type := T}) ->
    {raised, {erlfdb_error, C1}} = pcall(A, ?MODULE, tx, [Db, {after_commit, T, <<"x">>}]),
    {raised, {erlfdb_error, 1025}} = pcall(A, ?MODULE, tx, [Db, {after_cancel, T, <<"x">>}]),
    ?assertEqual({{error, wrong_cluster}, committed}, pcall(A, ?MODULE, tx, [Db, {other_cluster, T, <<"x">>}])),
    io:format(standard_error, "~n    a call on a committed transaction raised erlfdb error ~b~n", [C1]),
    ?assertEqual({error, not_found}, pcall(B, couch_workers, job_get, [T, <<"x">>])).

%% ---- metrics and telemetry of calls in a caller's transaction -------------------
%%
%% Counted by the node that relayed the call (`a' here), when the caller's
%% transaction commits, once; not by the other node. Exactness: the node
%% reads all its counts at one version, so once a later committed call is
%% counted, an earlier one counted twice (or an aborted one counted) would
%% show in the total.

%% A committed add: jobs_added +1 and one telemetry event; an aborted one
%% (the caller's fun threw): nothing.
counted_once_on_commit(#{a := A, b := B, db_a := Db, type := T}) ->
    ok = pcall(A, ?MODULE, telemetry_start, []),
    Doc = <<"couch_workers_tx_tests/counted/", T/binary>>,
    ?assertEqual(aborted, pcall(A, ?MODULE, doc_tx_add, [Db, T, <<"a1">>, <<Doc/binary, "/a1">>, abort])),
    ?assertEqual(committed, pcall(A, ?MODULE, doc_tx_add, [Db, T, <<"c1">>, <<Doc/binary, "/c1">>, commit])),
    wait_counted(A, T, #{jobs_added => 1}),
    ?assertEqual([{added, 1}], pcall(A, ?MODULE, tx_events, [T])),
    ?assertEqual(committed, pcall(A, ?MODULE, doc_tx_add, [Db, T, <<"c2">>, <<Doc/binary, "/c2">>, commit])),
    wait_counted(A, T, #{jobs_added => 2}),
    ?assertEqual(#{jobs_added => 2}, pcall(A, ?MODULE, tx_metrics, [T])),
    ?assertEqual([{added, 1}, {added, 1}], pcall(A, ?MODULE, tx_events, [T])),
    ?assertEqual(#{}, pcall(B, ?MODULE, tx_metrics, [T])).

%% A transaction whose first attempt made the add, then failed its commit
%% on a conflict (a key it read was written meanwhile) and was run again
%% by the caller's loop: counted once.
counted_once_after_a_retry(#{a := A, b := B, db_a := DbA, db_b := DbB, type := T}) ->
    ok = pcall(A, ?MODULE, telemetry_start, []),
    Key = <<"couch_workers_tx_tests/retry_counted/", T/binary>>,
    Parked = pcall(A, ?MODULE, parked_start, [tx_retry_counted, DbA, {read_then_add, T, <<"r">>, Key}]),
    {parked, 1} = pcall(A, ?MODULE, owner_call, [Parked, wait_parked]),
    ok = pcall(B, ?MODULE, put_key, [DbB, Key]),
    ok = pcall(A, ?MODULE, owner_call, [Parked, go]),
    ?assertEqual({[1020], ok}, pcall(A, ?MODULE, owner_call, [Parked, wait_done])),
    wait_counted(A, T, #{jobs_added => 1}),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [DbA, {add, T, <<"after">>}])),
    wait_counted(A, T, #{jobs_added => 2}),
    ?assertEqual(#{jobs_added => 2}, pcall(A, ?MODULE, tx_metrics, [T])),
    ?assertEqual([{added, 1}, {added, 1}], pcall(A, ?MODULE, tx_events, [T])),
    ?assertEqual(#{}, pcall(B, ?MODULE, tx_metrics, [T])).

%% Finish, cancel, remove and resubmit in the caller's transaction, each
%% counted once; a call that answered an error (a second finish:
%% not_owner) is not.
other_calls_counted(#{a := A, b := B, db_a := Db, type := T}) ->
    ok = pcall(A, ?MODULE, telemetry_start, []),
    Owner = pcall(A, ?MODULE, owner_start, [tx_counted_owner, T, <<"w">>]),
    ok = pcall(B, couch_workers, job_add, [T, <<"f">>, #{}, #{}]),
    ok = pcall(B, couch_workers, job_add, [T, <<"c">>, #{}, #{}]),
    {ok, #{id := Taken} = H} = pcall(A, ?MODULE, owner_call, [Owner, accept]),
    Other = hd([<<"f">>, <<"c">>] -- [Taken]),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {finish, H, #{}}])),
    ?assertEqual({{error, not_owner}, committed}, pcall(A, ?MODULE, tx, [Db, {finish, H, #{}}])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {cancel, T, Other}])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {remove, T, Other}])),
    ?assertEqual({ok, committed}, pcall(A, ?MODULE, tx, [Db, {resubmit, T, Taken, #{<<"v">> => 2}}])),
    Expect = #{jobs_finished => 1, jobs_canceled => 1, jobs_removed => 1, jobs_resubmitted => 1},
    wait_counted(A, T, Expect),
    ?assertEqual(Expect, pcall(A, ?MODULE, tx_metrics, [T])),
    ?assertEqual([{canceled, 1}, {finished, 1}, {removed, 1}, {resubmitted, 1}],
        lists:sort(pcall(A, ?MODULE, tx_events, [T]))),
    %% `b' counted its own two adds only.
    ?assertEqual(#{jobs_added => 2}, pcall(B, ?MODULE, tx_metrics, [T])).

%% Waits until every counter of `Expect' of type `T' on `Node' reached its
%% value.
wait_counted(Node, T, Expect) ->
    wait_until(fun() ->
        Got = pcall(Node, ?MODULE, tx_metrics, [T]),
        maps:fold(fun(K, V, Ok) -> Ok andalso maps:get(K, Got, 0) >= V end, true, Expect)
    end, ?WAIT_MS).

wait_until(Fun, Left) when Left =< 0 ->
    ?assert(Fun());
wait_until(Fun, Left) ->
    case Fun() of
        true ->
            ok;
        false ->
            timer:sleep(5),
            wait_until(Fun, Left - 5)
    end.

%% ---- on the peers --------------------------------------------------------------

start_node(CF, Name, Role) ->
    DbKey = couch_workers_erlfdb_tests:erlfdb_start(CF),
    Store =
        case Role of
            owner -> {fdb_test, CF, Name};
            shared -> {fdb_test, CF, Name, shared}
        end,
    ok = couch_workers_erlfdb_tests:cw_start(Store),
    DbKey.

%% Runs one scenario in `erlfdb:transactional/2': its answer and
%% `committed', or `aborted' (the fun threw), or `{raised, Reason}'.
tx(DbKey, What) ->
    Db = db(DbKey),
    try
        erlfdb:transactional(Db, fun(Tx) -> {in_tx(Tx, What), committed} end)
    catch
        throw:{abort, Answer} -> {Answer, aborted};
        error:Reason -> {raised, Reason}
    end.

in_tx(Tx, {get, T, Id}) ->
    couch_workers:job_get(Tx, T, Id);
in_tx(Tx, {get_state, T, Id}) ->
    {ok, #{state := finished}} = couch_workers:job_get(Tx, T, Id),
    ok;
in_tx(Tx, {update, H, Info}) ->
    couch_workers:job_update(#{tx => Tx}, H, Info);
in_tx(Tx, {finish, H, Result}) ->
    couch_workers:job_finish(Tx, H, Result);
in_tx(Tx, {resubmit, T, Id, Info}) ->
    couch_workers:job_resubmit(Tx, T, Id, Info, #{});
in_tx(Tx, {cancel, T, Id}) ->
    couch_workers:job_cancel(Tx, T, Id);
in_tx(Tx, {remove, T, Id}) ->
    couch_workers:job_remove(Tx, T, Id);
in_tx(Tx, {add_scheduled, T, Id}) ->
    couch_workers:job_add(Tx, T, Id, #{}, #{delay => 3600000});
in_tx(Tx, {add, T, Id}) ->
    couch_workers:job_add(Tx, T, Id, #{}, #{});
in_tx(Tx, {read_then_add, T, Id, Key}) ->
    _ = erlfdb:wait(erlfdb:get(Tx, Key)),
    couch_workers:job_add(Tx, T, Id, #{}, #{});
in_tx(Tx, {add_then_get, T, Id}) ->
    ok = couch_workers:job_add(Tx, T, Id, #{<<"v">> => 1}, #{}),
    couch_workers:job_get(Tx, T, Id);
in_tx(Tx, {update_update_finish, H}) ->
    {ok, H1} = couch_workers:job_update(Tx, H, #{<<"u">> => 1}),
    {ok, H2} = couch_workers:job_update(Tx, H1, #{<<"u">> => 2}),
    couch_workers:job_finish(Tx, H2, #{<<"r">> => 1});
in_tx(Tx, {add_then, Call, T, Id}) ->
    ok = couch_workers:job_add(Tx, T, Id, #{}, #{}),
    {ok, #{state := pending}} = couch_workers:job_get(Tx, T, Id),
    couch_workers:Call(Tx, T, Id);
in_tx(Tx, {mix, T, Key, Outcome}) ->
    not_found = erlfdb:wait(erlfdb:get(Tx, Key)),
    erlfdb:set(Tx, Key, <<"1">>),
    ok = couch_workers:job_add(Tx, T, <<Key/binary, "/new1">>, #{}, #{}),
    <<"1">> = erlfdb:wait(erlfdb:get(Tx, Key)),
    ok = couch_workers:job_cancel(Tx, T, <<"old">>),
    erlfdb:set(Tx, Key, <<"2">>),
    ok = couch_workers:job_add(Tx, T, <<Key/binary, "/new2">>, #{}, #{}),
    case Outcome of
        commit -> ok;
        abort -> throw({abort, ok})
    end;
in_tx(Tx, {other_process, T, Id, Key}) ->
    erlfdb:set(Tx, Key, <<"mine">>),
    Self = self(),
    Pid = spawn(fun() ->
        Self ! {self(), try couch_workers:job_add(Tx, T, Id, #{}, #{}) catch error:R -> {raised, R} end}
    end),
    receive
        {Pid, Answer} -> Answer
    after ?WAIT_MS -> error(other_process_timeout)
    end;
in_tx(Tx, {after_commit, T, Id}) ->
    erlfdb:wait(erlfdb:commit(Tx)),
    couch_workers:job_add(Tx, T, Id, #{}, #{});
in_tx(Tx, {after_cancel, T, Id}) ->
    erlfdb:cancel(Tx),
    couch_workers:job_add(Tx, T, Id, #{}, #{});
in_tx(_Tx, {other_cluster, T, Id}) ->
    %% A cluster file of another cluster (nobody listens there: the check
    %% reads the connection string, which the client knows without it).
    File = filename:join("/tmp", "cw_tx_other_" ++ os:getpid() ++ ".cluster"),
    ok = file:write_file(File, <<"other:other@127.0.0.1:1\n">>),
    Other = erlfdb:open(list_to_binary(File)),
    Answer = couch_workers:job_add(erlfdb:create_transaction(Other), T, Id, #{}, #{}),
    ok = file:delete(File),
    Answer.

%% A transaction run as erlfdb's loop runs it (in_tx/2's `What'), its
%% failed commits' codes kept: the first attempt, once `What' answered
%% `ok' or `{ok, _}', waits for `go' (another node changes the store
%% meanwhile). Its result: `{Codes, LastAnswer}'.
parked_start(Name, DbKey, What) ->
    owner_spawn(Name, fun() ->
        Tx = erlfdb:create_transaction(db(DbKey)),
        attempt(Tx, What, [])
    end).

attempt(Tx, What, Codes) ->
    Answer = in_tx(Tx, What),
    case {Codes, Answer} of
        {[], ok} -> park(1);
        {[], {ok, _}} -> park(1);
        _ -> ok
    end,
    try erlfdb:wait(erlfdb:commit(Tx)) of
        _ -> {lists:reverse(Codes), Answer}
    catch
        error:{erlfdb_error, Code} ->
            erlfdb:wait(erlfdb:on_error(Tx, Code)),
            attempt(Tx, What, [Code | Codes])
    end.

%% Tells whoever asks (`wait_parked') that the transaction waits, then
%% waits for `go'.
park(I) ->
    receive
        {From, wait_parked} -> From ! {self(), {parked, I}}
    end,
    receive
        go -> ok
    end.

%% The document and its job in one transaction; `abort' throws after
%% both were written.
doc_tx_add(DbKey, T, J, Doc, Outcome) ->
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

%% `What' (in_tx/2) in a transaction that commits; then erlfdb's
%% handling of `commit_unknown_result' (1021), as if that commit's outcome
%% had been lost, and `What' again on the reset transaction: both answers.
landed_then_unknown(DbKey, What) ->
    Tx = erlfdb:create_transaction(db(DbKey)),
    First = in_tx(Tx, What),
    erlfdb:wait(erlfdb:commit(Tx)),
    erlfdb:wait(erlfdb:on_error(Tx, 1021)),
    Second = in_tx(Tx, What),
    erlfdb:wait(erlfdb:commit(Tx)),
    {First, Second}.

%% doc_tx_add/5 committed, and when its commit returned (system time, µs).
doc_tx_add_at(DbKey, T, J, Doc) ->
    committed = doc_tx_add(DbKey, T, J, Doc, commit),
    {committed, erlang:system_time(microsecond)}.

%% Sets `Key' in a transaction of its own.
put_key(DbKey, Key) ->
    erlfdb:transactional(db(DbKey), fun(Tx) -> erlfdb:set(Tx, Key, <<"x">>) end),
    ok.

%% The stand-in `telemetry' module (test/telemetry.erl) loaded, its
%% events kept by a collector process of this VM (started once).
telemetry_start() ->
    {module, telemetry} = code:ensure_loaded(telemetry),
    case whereis(tx_telemetry_sink) of
        undefined ->
            Pid = spawn(fun() -> collect([]) end),
            true = register(tx_telemetry_sink, Pid),
            persistent_term:put(couch_workers_test_telemetry_sink, Pid);
        _ ->
            ok
    end,
    ok.

collect(Events) ->
    receive
        {telemetry, _, _, _} = E -> collect([E | Events]);
        {From, events} -> From ! {tx_telemetry_sink, lists:reverse(Events)}, collect(Events)
    end.

%% The telemetry events of calls in callers' transactions of type `T' so
%% far, in order: `{Action, Count}'.
tx_events(T) ->
    tx_telemetry_sink ! {self(), events},
    receive
        {tx_telemetry_sink, Events} ->
            [{Action, N} || {telemetry, [couch_workers, job, Action], #{count := N}, #{type := Ty, in_caller_tx := true}} <- Events, Ty =:= T]
    after ?WAIT_MS -> error(no_telemetry_sink)
    end.

%% This node's job counters of type `T' that are not zero.
tx_metrics(T) ->
    Counters = [jobs_added, jobs_finished, jobs_canceled, jobs_removed, jobs_resubmitted],
    case couch_workers:metrics() of
        #{types := #{T := M}} -> maps:filter(fun(_, V) -> V > 0 end, maps:with(Counters, M));
        #{} -> #{}
    end.

%% Every key under `Prefix'.
range(DbKey, Prefix) ->
    erlfdb:get_range(db(DbKey), Prefix, <<Prefix/binary, 16#ff>>).

%% A worker that accepts `N' jobs (each with an accept already waiting
%% before the job exists), finishes each, and keeps when it got each
%% (system time, µs).
waiter_start(T, N) ->
    Pid = spawn(fun() ->
        W = couch_workers:worker_register(T, <<"waiter">>, #{}, self()),
        Got = [
            begin
                {ok, #{id := Id} = H} = couch_workers:job_accept(W, #{timeout => ?WAIT_MS}),
                At = erlang:system_time(microsecond),
                ok = couch_workers:job_finish(H, #{}),
                {Id, At}
            end
         || _ <- lists:seq(1, N)
        ],
        ok = couch_workers:worker_unregister(W),
        receive
            {results, From} -> From ! {results, self(), Got}
        end
    end),
    Name = list_to_atom("tx_waiter_" ++ integer_to_list(erlang:unique_integer([positive]))),
    true = register(Name, Pid),
    Name.

waiter_results(Name) ->
    Pid = whereis(Name),
    Pid ! {results, self()},
    receive
        {results, Pid, Got} -> Got
    after 2 * ?WAIT_MS -> error(no_waiter_results)
    end.

%% An indexer: registers a worker, accepts the job, then writes rows
%% `Prefix/Name/I' for I = 1, 2, ..., each in a transaction that calls
%% job_update(Tx, ...) first; stops when the update answers an error (or
%% after `stop_at' transactions). With `park_at', the first attempt of
%% that transaction waits after its update for `go'.
indexer_start(Reg, DbKey, T, Name, Prefix, Opts) ->
    owner_spawn(Reg, fun() ->
        W = couch_workers:worker_register(T, Name, #{timeout => maps:get(timeout, Opts)}, self()),
        {ok, H} = couch_workers:job_accept(W, #{timeout => ?WAIT_MS}),
        index(db(DbKey), H, Name, Prefix, Opts, 1, [])
    end).

index(Db, H, Name, Prefix, Opts, I, Committed) ->
    case maps:get(stop_at, Opts, infinity) of
        Stop when is_integer(Stop), I > Stop ->
            {done, lists:reverse(Committed), stopped_at_limit};
        _ ->
            Tx = erlfdb:create_transaction(Db),
            case index_tx(Tx, H, Name, Prefix, Opts, I, []) of
                ok -> index(Db, H, Name, Prefix, Opts, I + 1, [I | Committed]);
                {stopped, Why, Codes} -> {done, lists:reverse(Committed), {stopped, Why, Codes}}
            end
    end.

index_tx(Tx, H, Name, Prefix, Opts, I, Codes) ->
    case couch_workers:job_update(Tx, H, #{<<"n">> => I}) of
        {ok, _} ->
            erlfdb:set(Tx, <<Prefix/binary, Name/binary, "/", (integer_to_binary(I))/binary>>, <<"row">>),
            case {maps:get(park_at, Opts, none), Codes} of
                {I, []} ->
                    park(I);
                _ ->
                    ok
            end,
            try erlfdb:wait(erlfdb:commit(Tx)) of
                _ -> ok
            catch
                error:{erlfdb_error, Code} ->
                    erlfdb:wait(erlfdb:on_error(Tx, Code)),
                    index_tx(Tx, H, Name, Prefix, Opts, I, [Code | Codes])
            end;
        {error, Why} ->
            {stopped, Why, lists:reverse(Codes)}
    end.

%% A process owning a worker (registered on its first `accept') and a
%% subscription, driven by owner_call/2.
owner_start(Name, T, WorkerId) ->
    owner_spawn(Name, fun() -> owner_loop(T, WorkerId, undefined) end).

owner_loop(T, WorkerId, W) ->
    receive
        {From, accept} ->
            W1 =
                case W of
                    undefined -> couch_workers:worker_register(T, WorkerId, #{}, self());
                    _ -> W
                end,
            From ! {self(), couch_workers:job_accept(W1, #{timeout => ?WAIT_MS})},
            owner_loop(T, WorkerId, W1);
        {From, {subscribe, Ty, Id}} ->
            From ! {self(), couch_workers:job_subscribe(Ty, Id, self())},
            owner_loop(T, WorkerId, W);
        {From, {subscription_saw, Id}} ->
            From ! {self(), last_job_event(Id, undefined)},
            owner_loop(T, WorkerId, W)
    end.

%% The last job change the subscription delivered (waiting up to 2 s for
%% the first).
last_job_event(Id, Last) ->
    Wait =
        case Last of
            undefined -> 2000;
            _ -> 200
        end,
    receive
        {couch_workers_job, _, #{id := Id} = Job} -> last_job_event(Id, {ok, Job})
    after Wait -> Last
    end.

%% Runs `Fun()' in a process registered as `Name'; its result is fetched
%% with owner_call(Name, wait_done).
owner_spawn(Name, Fun) ->
    Pid = spawn(fun() ->
        Result = Fun(),
        receive
            {From, wait_done} -> From ! {self(), Result}
        end
    end),
    true = register(Name, Pid),
    Name.

owner_call(Name, go) ->
    whereis(Name) ! go,
    ok;
owner_call(Name, Msg) ->
    Pid = whereis(Name),
    Pid ! {self(), Msg},
    receive
        {Pid, Answer} -> Answer
    after 2 * ?WAIT_MS -> error({no_answer, Msg})
    end.
