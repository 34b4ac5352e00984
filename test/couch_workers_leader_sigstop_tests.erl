%% @doc A leader whose node stops without dying: node B, a real `erl'
%% peer on the same store, registers the only worker of a type, so it
%% leads; this node registers a second one. B is frozen with `kill -STOP'.
%% This node's worker is told it leads only after B's registration was
%% reaped by the liveness rule (B's worker is gone from the store when the
%% message arrives, at least the worker's timeout after the stop), with a
%% greater epoch; until then B's worker still leads. After `kill -CONT'
%% B's owner gets `{couch_workers_leader_lost, Ref, Epoch}'.
-module(couch_workers_leader_sigstop_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [wait_for/2]).

-define(PEER_TIMEOUT, 15000).
%% B's worker's timeout.
-define(TIMEOUT_S, 3).

leader_sigstop_test_() ->
    couch_workers_test_util:peer_fixture("a leader's node stopped with SIGSTOP", "lstop", [
        ?TDEF_FE(stopped_leader_is_replaced_after_its_reap_and_told_after_cont, 40)
    ]).

stopped_leader_is_replaced_after_its_reap_and_told_after_cont(#{peer := Peer, os_pid := OsPid, type := T}) ->
    ok = peer:call(Peer, couch_workers_test_owner, start, [owner, T, <<"w">>, #{timeout => ?TIMEOUT_S}], ?PEER_TIMEOUT),
    ok = wait_for(fun() -> length(leader_events(Peer)) =:= 1 end, 5000),
    [{leader, E1}] = leader_events(Peer),
    ?assertEqual({ok, <<"w">>, E1}, couch_workers:leader(T)),
    A = couch_workers:worker_register(T, <<"a">>, #{}, self()),
    T0 = erlang:monotonic_time(millisecond),
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        ?assertEqual({ok, <<"w">>, E1}, couch_workers:leader(T), "stopped, not yet reaped: still the leader"),
        E2 =
            receive
                {couch_workers_leader, A, E} -> E
            after (?TIMEOUT_S + 10) * 1000 -> error(no_leader_message)
            end,
        Told = erlang:monotonic_time(millisecond) - T0,
        io:format(standard_error, "~n    the next leader told ~b ms after SIGSTOP of the leader's node (timeout ~b s)~n", [
            Told, ?TIMEOUT_S
        ]),
        ?assert(Told >= ?TIMEOUT_S * 1000),
        ?assertEqual([<<"a">>], [Id || #{id := Id} <- couch_workers:workers(T)], "B's worker was reaped first"),
        ?assert(E2 > E1),
        ?assertEqual({ok, <<"a">>, E2}, couch_workers:leader(T))
    after
        "" = os:cmd("kill -CONT " ++ OsPid)
    end,
    %% Thawed: B's node reads that another registration leads.
    ok = wait_for(fun() -> length(leader_events(Peer)) =:= 2 end, 10000),
    ?assertEqual([{leader, E1}, {leader_lost, E1}], leader_events(Peer)),
    ok = couch_workers:worker_unregister(A),
    ok = peer:call(Peer, couch_workers_test_owner, stop, [owner], ?PEER_TIMEOUT).

leader_events(Peer) ->
    peer:call(Peer, couch_workers_test_owner, leader_events, [owner], ?PEER_TIMEOUT).
