%% @doc Owners are told: a registration that a later
%% registration of the same `(Type, Id)' on another node replaced is over,
%% and its owner gets `{couch_workers_worker_lost, Ref, superseded}' (at
%% its next heartbeat, within about a third of its timeout). Its `Ref' is
%% then forgotten: `job_accept/2' refuses it, `worker_unregister/1' of it
%% removes nothing, and a register of the same key on this node starts a
%% new registration, which replaces the other node's in turn (whose owner
%% is told). Node B is a real `erl' peer on the same store.
-module(couch_workers_owners_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [wait_for/2, wait_membership/3, recv_membership/2, no_membership/2]).

-define(PEER_TIMEOUT, 15000).

owners_test_() ->
    couch_workers_test_util:peer_fixture(
        "owners told when another node's registration replaces theirs",
        "own",
        [
            ?TDEF_FE(registration_replaced_by_another_node_tells_its_owner, 30),
            ?TDEF_FE(replaced_while_the_local_server_restarts_is_forgotten_by_its_successor, 30),
            ?TDEF_FE(worker_notify_checks_its_arguments, 10)
        ]
    ).

registration_replaced_by_another_node_tells_its_owner(#{peer := Peer, type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    RefA = couch_workers:worker_register(T, <<"w">>, #{timeout => 1, node => <<"A">>}, self()),
    wait_membership(S, fun(W) -> maps:is_key(<<"w">>, W) end, 5000),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, JA} = couch_workers:job_accept(RefA, #{}),

    %% B registers the same id: its registration replaces A's (and gives
    %% A's running job back).
    ok = peer:call(Peer, couch_workers_test_owner, start, [owner_b, T, <<"w">>, #{timeout => 1, node => <<"B">>}], ?PEER_TIMEOUT),
    wait_membership(S, fun(W) -> W =:= #{<<"w">> => #{<<"timeout">> => 1, <<"node">> => <<"B">>}} end, 5000),
    T0 = erlang:monotonic_time(millisecond),
    receive
        {couch_workers_worker_lost, RefA, superseded} -> ok
    after 5000 -> error(owner_not_told)
    end,
    io:format(standard_error, "~n    A's owner told ~b ms after B's registration (timeout 1 s)~n", [
        erlang:monotonic_time(millisecond) - T0
    ]),
    %% RefA is over.
    wait_for(fun() -> couch_workers_local:lookup(RefA) =:= error end, 5000),
    ?assertEqual({error, not_found}, couch_workers:job_accept(RefA, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(JA, #{})),
    ok = couch_workers:worker_unregister(RefA),
    %% B's registration lives on (past its timeout: its heartbeats renew
    %% it, A's no longer do), and A's owner hears nothing more.
    no_membership(S, 1500),
    ?assertMatch({ok, _, #{<<"w">> := #{<<"node">> := <<"B">>}}}, couch_workers:get_workers(T)),
    ?assertEqual(nothing, owner_message(0)),
    ?assertEqual([], peer:call(Peer, couch_workers_test_owner, events, [owner_b], ?PEER_TIMEOUT)),

    %% A registers again: a new registration, which replaces B's.
    RefA2 = couch_workers:worker_register(T, <<"w">>, #{timeout => 1, node => <<"A">>}, self()),
    ?assert(is_reference(RefA2)),
    ?assertNotEqual(RefA, RefA2),
    wait_membership(S, fun(W) -> W =:= #{<<"w">> => #{<<"timeout">> => 1, <<"node">> => <<"A">>}} end, 5000),
    wait_for(
        fun() -> peer:call(Peer, couch_workers_test_owner, events, [owner_b], ?PEER_TIMEOUT) =:= [{lost, superseded}] end,
        5000
    ),
    no_membership(S, 1500),
    ?assertEqual(nothing, owner_message(0)),
    ok = couch_workers:worker_unregister(RefA2),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ok = couch_workers:membership_unsubscribe(S).

%% The server's own notice of the replacement is lost with it (queued
%% while it was suspended, then it is killed): the restarted server learns
%% it when it points the registration's events at itself.
replaced_while_the_local_server_restarts_is_forgotten_by_its_successor(#{peer := Peer, type := T}) ->
    RefA = couch_workers:worker_register(T, <<"w">>, #{timeout => 1}, self()),
    Local = whereis(couch_workers_local),
    ok = sys:suspend(Local),
    ok = peer:call(Peer, couch_workers_test_owner, start, [owner_b, T, <<"w">>, #{timeout => 1}], ?PEER_TIMEOUT),
    receive
        {couch_workers_worker_lost, RefA, superseded} -> ok
    after 5000 -> error(owner_not_told)
    end,
    wait_for(fun() -> queue_len(Local) >= 1 end, 5000),
    exit(Local, kill),
    wait_for(fun() -> is_pid(whereis(couch_workers_local)) andalso whereis(couch_workers_local) =/= Local end, 5000),
    wait_for(fun() -> couch_workers_local:lookup(RefA) =:= error end, 5000),
    ?assertEqual([], ets:lookup(couch_workers_local, {T, <<"w">>})),
    %% Told once.
    ?assertEqual(nothing, owner_message(500)),
    ok.

queue_len(Pid) ->
    {message_queue_len, N} = process_info(Pid, message_queue_len),
    N.

worker_notify_checks_its_arguments(#{type := T}) ->
    NifRef = make_ref(),
    ok = couch_workers_nif:worker_register(NifRef, T, <<"n">>, #{}),
    {ok, Reg} = couch_workers_nif:wait(NifRef, 10000),
    ?assertError(badarg, couch_workers_nif:worker_notify(Reg, self(), not_a_ref)),
    ?assertError(badarg, couch_workers_nif:worker_notify(Reg, not_a_pid, make_ref())),
    ?assertError(badarg, couch_workers_nif:worker_notify(make_ref(), self(), make_ref())),
    ?assertEqual(ok, couch_workers_nif:worker_notify(Reg, self(), make_ref())),
    U = make_ref(),
    ok = couch_workers_nif:worker_unregister(U, Reg),
    ?assertEqual(ok, couch_workers_nif:wait(U, 10000)).

owner_message(Timeout) ->
    receive
        {couch_workers_worker_reaped, _} = M -> M;
        {couch_workers_worker_lost, _, _} = M -> M
    after Timeout -> nothing
    end.
