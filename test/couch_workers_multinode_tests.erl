%% @doc Several Erlang nodes (separate OS processes) sharing one embedded
%% store, as the nodes of a cluster share one FoundationDB.
%%
%% Node A is this EUnit VM; node B is a peer started with OTP's `peer'
%% module over its standard I/O (no distribution, so no epmd and no
%% cookies involved), with this VM's code path. B registers workers in the
%% same store directory; A subscribes. `kill -9' of B's OS process stops
%% its heartbeats without any goodbye: A's reaper must remove B's worker
%% within its timeout plus a second.
-module(couch_workers_multinode_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2, wait_membership/3, recv_membership/2]).

%% Run on the peer (through peer:call/4).
-export([peer_register/3, peer_subscribe/1]).

-define(PEER_TIMEOUT, 15000).

multinode_test_() ->
    couch_workers_test_util:peer_fixture(
        "couch_workers on several nodes",
        "mn",
        [
            ?TDEF_FE(peer_worker_seen_with_its_options, 30),
            ?TDEF_FE(kill_9_of_peer_removes_its_worker_in_time, 30),
            ?TDEF_FE(peer_app_stop_removes_its_workers_at_once, 30)
        ]
    ).

%% ---- tests ---------------------------------------------------------------

peer_worker_seen_with_its_options(#{peer := Peer, type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    ok = peer:call(Peer, ?MODULE, peer_register, [T, <<"b1">>, #{timeout => 5, node => <<"B">>}], ?PEER_TIMEOUT),
    {_, W, _} = wait_membership(S, fun(W) -> maps:is_key(<<"b1">>, W) end, 5000),
    ?assertEqual(#{<<"b1">> => #{<<"timeout">> => 5, <<"node">> => <<"B">>}}, W),
    %% And the other way round: B sees a worker of A.
    ok = peer:call(Peer, ?MODULE, peer_subscribe, [T], ?PEER_TIMEOUT),
    Ref = couch_workers:worker_register(T, <<"a1">>, #{node => <<"A">>}, self()),
    wait_for(
        fun() ->
            case peer:call(Peer, couch_workers, get_workers, [T], ?PEER_TIMEOUT) of
                {ok, _, #{<<"a1">> := #{<<"node">> := <<"A">>}, <<"b1">> := _}} -> true;
                _ -> false
            end
        end,
        5000
    ),
    ok = couch_workers:worker_unregister(Ref),
    ok = couch_workers:membership_unsubscribe(S).

kill_9_of_peer_removes_its_worker_in_time(#{peer := Peer, os_pid := OsPid, type := T}) ->
    TimeoutS = 2,
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    ok = peer:call(Peer, ?MODULE, peer_register, [T, <<"b1">>, #{timeout => TimeoutS}], ?PEER_TIMEOUT),
    wait_membership(S, fun(W) -> maps:is_key(<<"b1">>, W) end, 5000),
    %% Alive past its timeout: B's heartbeats keep it.
    timer:sleep(TimeoutS * 1000 + 500),
    ?assertMatch({ok, _, #{<<"b1">> := _}}, couch_workers:get_workers(T)),
    T0 = erlang:monotonic_time(millisecond),
    "" = os:cmd("kill -9 " ++ OsPid),
    {_, W, _} = wait_membership(S, fun(W) -> not maps:is_key(<<"b1">>, W) end, (TimeoutS + 5) * 1000),
    Elapsed = erlang:monotonic_time(millisecond) - T0,
    io:format(standard_error, "~n    worker of the killed node left after ~b ms (timeout ~b s)~n", [
        Elapsed, TimeoutS
    ]),
    ?assertEqual(#{}, W),
    ?assert(Elapsed =< (TimeoutS + 1) * 1000),
    %% Not before its timeout could have passed since its last heartbeat
    %% (renewed about every third of it).
    ?assert(Elapsed >= (TimeoutS * 1000) div 3),
    ok = couch_workers:membership_unsubscribe(S).

peer_app_stop_removes_its_workers_at_once(#{peer := Peer, type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    [
        ok = peer:call(Peer, ?MODULE, peer_register, [T, Id, #{timeout => 60}], ?PEER_TIMEOUT)
     || Id <- [<<"b1">>, <<"b2">>]
    ],
    wait_membership(S, fun(W) -> map_size(W) =:= 2 end, 5000),
    T0 = erlang:monotonic_time(millisecond),
    ok = peer:call(Peer, application, stop, [couch_workers], ?PEER_TIMEOUT),
    %% Unregistered by the stop, long before their 60 s timeout (a third
    %% of it is room for a loaded machine).
    wait_membership(S, fun(W) -> W =:= #{} end, 20000),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 20000),
    ok = couch_workers:membership_unsubscribe(S).

%% ---- run on the peer -----------------------------------------------------

%% Registers in a long-lived process of the peer (the worker's owner);
%% answers only ok or the error: references do not travel well between
%% non-distributed nodes.
peer_register(Type, Id, Opts) ->
    Caller = self(),
    spawn(fun() ->
        Result = couch_workers:worker_register(Type, Id, Opts, self()),
        Caller ! {registered, self(), Result},
        receive stop -> ok end
    end),
    receive
        {registered, _, Ref} when is_reference(Ref) -> ok;
        {registered, _, Error} -> Error
    after 10000 -> {error, timeout}
    end.

peer_subscribe(Type) ->
    Caller = self(),
    spawn(fun() ->
        _ = couch_workers:membership_subscribe(Type, nil, self()),
        Caller ! subscribed,
        drain()
    end),
    receive
        subscribed -> ok
    after 10000 -> {error, timeout}
    end.

drain() ->
    receive
        _ -> drain()
    end.
