%% @doc A node that stops without dying: node B, a real
%% `erl' peer on the same store, is frozen with `kill -STOP' (a long GC
%% pause, a VM swapped out, a stopped container) and thawed with
%% `kill -CONT'. Node A (this VM) runs the reaper that judges B's worker.
%%
%% * Stopped for half the worker's timeout: never reaped (its heartbeat
%%   after the thaw renews it in time).
%% * Stopped for three times the timeout: reaped within the timeout plus a
%%   second of the stop (measured and printed), its running job given
%%   back; after the thaw its owner gets `{couch_workers_worker_reaped,
%%   Ref}', the worker rejoins under the same `Ref', and the owner's old
%%   job handle is refused (`not_owner').
-module(couch_workers_sigstop_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [wait_for/2, wait_membership/3, recv_membership/2, no_membership/2]).

-define(PEER_TIMEOUT, 15000).
%% The worker's timeout: heartbeats about every second.
-define(TIMEOUT_S, 3).

sigstop_test_() ->
    couch_workers_test_util:peer_fixture(
        "a node stopped with SIGSTOP",
        "stop",
        [
            ?TDEF_FE(stopped_for_half_the_timeout_is_never_reaped, 30),
            ?TDEF_FE(stopped_for_three_timeouts_is_reaped_and_its_owner_told, 40)
        ]
    ).

stopped_for_half_the_timeout_is_never_reaped(#{peer := Peer, os_pid := OsPid, type := T} = Ctx) ->
    S = start_worker(Ctx),
    freeze(OsPid, ?TIMEOUT_S * 500),
    %% Reaped, it would leave A's membership within the timeout plus a
    %% second; B's owner would hear of it.
    no_membership(S, (?TIMEOUT_S + 1) * 1000),
    ?assertMatch({ok, _, #{<<"w">> := _}}, couch_workers:get_workers(T)),
    ?assertEqual([], peer:call(Peer, couch_workers_test_owner, events, [owner], ?PEER_TIMEOUT)),
    ok = couch_workers:membership_unsubscribe(S).

stopped_for_three_timeouts_is_reaped_and_its_owner_told(#{peer := Peer, os_pid := OsPid, type := T} = Ctx) ->
    S = start_worker(Ctx),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual({ok, <<"j1">>}, peer:call(Peer, couch_workers_test_owner, accept, [owner], ?PEER_TIMEOUT)),
    ?assertEqual(running, couch_workers_test_util:job_state(T, <<"j1">>)),
    T0 = erlang:monotonic_time(millisecond),
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        {_, W, _} = wait_membership(S, fun(W) -> not maps:is_key(<<"w">>, W) end, (?TIMEOUT_S + 5) * 1000),
        Reaped = erlang:monotonic_time(millisecond) - T0,
        io:format(standard_error, "~n    worker of the stopped node reaped ~b ms after SIGSTOP (timeout ~b s)~n", [
            Reaped, ?TIMEOUT_S
        ]),
        ?assertEqual(#{}, W),
        ?assert(Reaped =< (?TIMEOUT_S + 1) * 1000),
        %% Its job was given back while B could not write.
        ?assertEqual(pending, couch_workers_test_util:job_state(T, <<"j1">>)),
        timer:sleep(max(0, 3 * ?TIMEOUT_S * 1000 - (erlang:monotonic_time(millisecond) - T0)))
    after
        "" = os:cmd("kill -CONT " ++ OsPid)
    end,
    %% Thawed: the heartbeat finds the worker reaped, registers it again,
    %% and tells the owner; the worker rejoins.
    wait_membership(S, fun(W) -> maps:is_key(<<"w">>, W) end, 5000),
    wait_for(fun() -> peer:call(Peer, couch_workers_test_owner, events, [owner], ?PEER_TIMEOUT) =:= [reaped] end, 5000),
    ?assertEqual({error, not_owner}, peer:call(Peer, couch_workers_test_owner, finish_old, [owner], ?PEER_TIMEOUT)),
    %% The same Ref takes the job again.
    ?assertEqual({ok, <<"j1">>}, peer:call(Peer, couch_workers_test_owner, accept, [owner], ?PEER_TIMEOUT)),
    ?assertEqual(ok, peer:call(Peer, couch_workers_test_owner, finish_old, [owner], ?PEER_TIMEOUT)),
    ?assertEqual(finished, couch_workers_test_util:job_state(T, <<"j1">>)),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ok = couch_workers:membership_unsubscribe(S).

%% B registers worker `w' (timeout ?TIMEOUT_S) for its owner process; A
%% subscribes and sees it. Returns A's subscription.
start_worker(#{peer := Peer, type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    ok = peer:call(Peer, couch_workers_test_owner, start, [owner, T, <<"w">>, #{timeout => ?TIMEOUT_S}], ?PEER_TIMEOUT),
    wait_membership(S, fun(W) -> maps:is_key(<<"w">>, W) end, 5000),
    S.

freeze(OsPid, Ms) ->
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        timer:sleep(Ms)
    after
        "" = os:cmd("kill -CONT " ++ OsPid)
    end.
