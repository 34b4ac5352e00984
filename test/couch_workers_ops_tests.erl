%% @doc Operations' reads, cluster-wide from the store: node A (this VM)
%% sees the worker types and workers that node B (a peer `erl' on the same
%% store) registered, with options, timeout, heartbeat age and running
%% jobs, with no subscription anywhere.
-module(couch_workers_ops_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

%% Run on the peer (through peer:call/4).
-export([peer_worker/4]).

-define(PEER_TIMEOUT, 15000).

ops_multinode_test_() ->
    couch_workers_test_util:peer_fixture(
        "operations' reads on two nodes",
        "ops",
        [
            ?TDEF_FE(peer_workers_seen_with_options_timeout_age_and_running, 60),
            ?TDEF_FE(a_killed_peers_workers_leave_worker_types, 60)
        ]
    ).

ops_local_test_() ->
    {
        "operations' reads on one node",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun couch_workers_test_util:stop_app/1,
            fun(_) ->
                [
                    {"get_workers/1 is the subscription cache; workers/1 the store",
                        ?_test(get_workers_is_the_cache_workers_is_the_store())},
                    {"bad arguments", ?_test(bad_arguments())}
                ]
            end
        }
    }.

%% ---- tests ---------------------------------------------------------------

peer_workers_seen_with_options_timeout_age_and_running(#{peer := Peer, type := T}) ->
    ?assertNot(lists:member(T, couch_workers:worker_types())),
    ?assertEqual([], couch_workers:workers(T)),
    [ok = couch_workers:job_add(T, Id, #{}, #{}) || Id <- [<<"j1">>, <<"j2">>, <<"j3">>]],
    %% b1 takes two jobs and keeps them running; b2 takes none.
    {ok, [<<"j1">>, <<"j2">>]} = peer:call(Peer, ?MODULE, peer_worker, [T, <<"b1">>, #{timeout => 9, node => <<"B">>}, 2], ?PEER_TIMEOUT),
    {ok, []} = peer:call(Peer, ?MODULE, peer_worker, [T, <<"b2">>, #{}, 0], ?PEER_TIMEOUT),
    ?assert(lists:member(T, couch_workers:worker_types())),
    [B1, B2] = couch_workers:workers(T),
    ?assertMatch(#{id := <<"b1">>, opts := #{<<"timeout">> := 9, <<"node">> := <<"B">>}, timeout := 9, running := 2}, B1),
    ?assertMatch(#{id := <<"b2">>, opts := #{}, timeout := 15, running := 0}, B2),
    %% Heartbeats renew about every third of the timeout: b1's (9 s) is
    %% never much older than 3 s; generous bounds for a loaded machine.
    [?assert(is_integer(Age) andalso Age >= 0 andalso Age < 8000) || #{heartbeat_age_ms := Age} <- [B1, B2]].

a_killed_peers_workers_leave_worker_types(#{peer := Peer, type := T} = Ctx) ->
    {ok, []} = peer:call(Peer, ?MODULE, peer_worker, [T, <<"b1">>, #{timeout => 2}, 0], ?PEER_TIMEOUT),
    ?assertMatch([#{id := <<"b1">>, timeout := 2}], couch_workers:workers(T)),
    couch_workers_test_util:kill_peer(Ctx),
    %% Reaped by A's reaper within its timeout + 1 s (generous here).
    wait_for(fun() -> couch_workers:workers(T) =:= [] end, 10000),
    ?assertNot(lists:member(T, couch_workers:worker_types())).

get_workers_is_the_cache_workers_is_the_store() ->
    T = unique_type("ops_local"),
    W = couch_workers:worker_register(T, <<"a1">>, #{slots => 2}, self()),
    %% The contract: get_workers/1 is the node-local cache of the
    %% subscriptions, `not_found' while none covers the type, even for a
    %% worker registered here; workers/1 reads the store.
    ?assertEqual({error, not_found}, couch_workers:get_workers(T)),
    ?assertMatch([#{id := <<"a1">>, opts := #{<<"slots">> := 2}, timeout := 15, running := 0}], couch_workers:workers(T)),
    ?assert(lists:member(T, couch_workers:worker_types())),
    S = couch_workers:membership_subscribe(T, nil, self()),
    wait_for(fun() -> element(1, couch_workers:get_workers(T)) =:= ok end, 5000),
    ?assertMatch({ok, _, #{<<"a1">> := #{<<"slots">> := 2}}}, couch_workers:get_workers(T)),
    ok = couch_workers:membership_unsubscribe(S),
    ok = couch_workers:worker_unregister(W),
    ?assertEqual([], couch_workers:workers(T)),
    ?assertNot(lists:member(T, couch_workers:worker_types())).

bad_arguments() ->
    ?assertError(badarg, couch_workers:workers(not_a_binary)),
    ?assertError(badarg, couch_workers:workers("list")),
    ?assertEqual({error, key_too_large}, couch_workers:workers(binary:copy(<<"x">>, 10001))),
    %% A type with bytes no text would hold, and the empty type.
    ?assertEqual([], couch_workers:workers(<<0, 255, 0>>)),
    ?assertEqual([], couch_workers:workers(<<>>)).

%% ---- run on the peer -----------------------------------------------------

%% Registers worker Id in a process that stays, takes N jobs (each left
%% running) and answers {ok, [JobId]}.
peer_worker(Type, Id, Opts, N) ->
    Caller = self(),
    spawn(fun() ->
        W = couch_workers:worker_register(Type, Id, Opts, self()),
        Taken = [
            case couch_workers:job_accept(W, #{timeout => 5000}) of
                {ok, #{id := JobId}} -> JobId;
                Error -> Error
            end
         || _ <- lists:seq(1, N)
        ],
        Caller ! {taken, Taken},
        receive
            stop -> ok
        end
    end),
    receive
        {taken, Taken} -> {ok, Taken}
    after 10000 -> {error, timeout}
    end.
