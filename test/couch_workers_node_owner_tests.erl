%% @doc The node belongs to a process of the supervision tree
%% (`couch_workers_node', in `couch_workers_node_sup' with the servers of
%% its handles): the application's stop leaves no node, a restart of that
%% group (its owner killed, the group given up and started again by the
%% top supervisor) starts a new node on which the app works again, and no
%% registration or job subscription of the old node is lost silently:
%% their owners are told `{couch_workers_worker_lost, Ref, stopped}' and
%% `{couch_workers_job_subscription_ended, Ref, stopped}'.
%%
%% A peer node (another OS process on the same store) is the second node
%% that sees the workers go: at once when they were unregistered, only
%% after their 60 s timeout if they had been left to the reaper.
-module(couch_workers_node_owner_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2, wait_membership/3, recv_membership/2]).

-define(PEER_TIMEOUT, 15000).
%% Workers whose timeout no test waits out: only an unregister removes
%% them within a test.
-define(LONG_TIMEOUT_S, 60).

node_owner_test_() ->
    {
        "the node's owner in the supervision tree",
        {
            foreach,
            fun setup/0,
            fun teardown/1,
            [
                ?TDEF_FE(app_stop_leaves_no_node_and_tells_every_owner, 60),
                ?TDEF_FE(killed_node_owner_restarts_the_group_on_a_new_node, 60),
                ?TDEF_FE(a_group_that_gives_up_is_started_again_by_the_top_supervisor, 120),
                ?TDEF_FE(registrations_of_a_node_gone_while_their_server_was_down_are_told, 60),
                ?TDEF_FE(unknown_messages_to_the_node_owner_are_logged_not_fatal, 30)
            ]
        }
    }.

setup() ->
    #{dir := Dir} = Ctx = couch_workers_test_util:start_app(),
    Peer = couch_workers_test_util:start_peer(Dir),
    maps:merge(Ctx, Peer#{type => unique_type("owner")}).

teardown(#{dir := Dir} = Ctx) ->
    couch_workers_test_util:stop_peer(Ctx),
    case lists:keymember(couch_workers, 1, application:which_applications()) of
        true -> couch_workers_test_util:stop_app(Ctx);
        false -> file:del_dir_r(Dir)
    end.

%% ---- tests ---------------------------------------------------------------

app_stop_leaves_no_node_and_tells_every_owner(#{peer := Peer, type := T, dir := Dir}) ->
    R1 = couch_workers:worker_register(T, <<"w1">>, #{timeout => ?LONG_TIMEOUT_S}, self()),
    R2 = couch_workers:worker_register(T, <<"w2">>, #{timeout => ?LONG_TIMEOUT_S}, self()),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, J1} = couch_workers:job_accept(R1, #{}),
    {ok, Sub, _} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    wait_peer_sees(Peer, T, [<<"w1">>, <<"w2">>]),
    ok = application:stop(couch_workers),
    %% Nothing of the node is left running: no task, no handle.
    ?assertMatch(
        #{running := false, heartbeats := 0, watchers := 0, reapers := 0, job_dispatchers := 0, job_watchers := 0},
        couch_workers:stats()
    ),
    settled_stats(#{registrations => 0, job_subscriptions => 0}),
    %% Each owner and subscriber was told, and nothing follows.
    ?assertEqual(stopped, recv_lost(R1)),
    ?assertEqual(stopped, recv_lost(R2)),
    ?assertEqual(stopped, recv_sub_ended(Sub)),
    ?assertEqual([], flush_about([R1, R2, Sub], 300)),
    %% The other node sees them gone at once (unregistered, not left to a
    %% 60 s reap), and their running job released, not failed. (On
    %% FoundationDB the suite's directory went with this node's stop.)
    wait_peer_sees(Peer, T, []),
    case couch_workers_test_util:test_store(os:getenv("FDB_CLUSTER_FILE"), Dir, "") of
        {embedded, _} ->
            ?assertMatch(
                {ok, #{state := pending, error := null}},
                peer:call(Peer, couch_workers, job_get, [T, <<"j1">>], ?PEER_TIMEOUT)
            );
        _ ->
            ok
    end,
    ?assertEqual({error, not_started}, couch_workers:job_finish(J1, #{})),
    %% And the app starts again.
    ok = application:start(couch_workers),
    settled_stats(#{running => true, reapers => 1}).

killed_node_owner_restarts_the_group_on_a_new_node(#{peer := Peer, type := T}) ->
    settled_stats(#{running => true, reapers => 1, heartbeats => 0}),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    R1 = couch_workers:worker_register(T, <<"w1">>, #{timeout => ?LONG_TIMEOUT_S}, self()),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    {ok, #{id := <<"j1">>} = J1} = couch_workers:job_accept(R1, #{}),
    {ok, Sub, _} = couch_workers:job_subscribe(T, <<"j2">>, self()),
    %% An acceptor waiting on a type with no jobs when the node goes.
    Self = self(),
    T2 = <<T/binary, "_idle">>,
    Waiter = spawn_link(fun() ->
        %% (Owned by the test process, which is told.)
        R = couch_workers:worker_register(T2, <<"idle">>, #{timeout => ?LONG_TIMEOUT_S}, Self),
        Self ! {waiting, self(), R},
        Self ! {accepted, self(), couch_workers:job_accept(R, #{timeout => 30000})},
        receive stop -> ok end
    end),
    R2 = receive {waiting, Waiter, WR} -> WR after 10000 -> error(no_waiter) end,
    wait_for(fun() -> maps:get(job_waiters, couch_workers:stats()) >= 1 end, 5000),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    wait_peer_sees(Peer, T, [<<"w1">>]),
    Old = whereis(couch_workers_node),
    OldLocal = whereis(couch_workers_local),
    Killed = erlang:monotonic_time(millisecond),
    exit(Old, kill),
    New = couch_workers_test_util:wait_restarted(couch_workers_node, Old),
    couch_workers_test_util:wait_restarted(couch_workers_local, OldLocal),
    %% The owners are told; so is the job subscriber.
    ?assertEqual(stopped, recv_lost(R1)),
    ?assertEqual(stopped, recv_sub_ended(Sub)),
    receive
        {accepted, Waiter, Answer} -> ?assertMatch({error, _}, Answer)
    after 10000 -> error(waiting_accept_not_answered)
    end,
    %% The other node saw w1 leave at once (it was unregistered on the old
    %% node before that stopped, not left to a 60 s reap), and its job was
    %% released.
    wait_peer_sees(Peer, T, []),
    LeftMs = erlang:monotonic_time(millisecond) - Killed,
    ?assert(LeftMs < 10000),
    ?assertMatch({ok, #{state := pending, error := null}}, couch_workers:job_get(T, <<"j1">>)),
    %% A new node runs, with nothing of the old one (the waiter, which
    %% held its registration's handle, gone too).
    ?assertNotEqual(Old, New),
    unlink(Waiter),
    exit(Waiter, kill),
    settled_stats(#{running => true, reapers => 1, heartbeats => 0, registrations => 0, job_subscriptions => 0}),
    %% The old Refs are over (not a silent `not_owner' later): unknown here.
    ?assertEqual({error, not_found}, couch_workers:job_accept(R1, #{})),
    ?assertEqual(error, couch_workers_local:lookup(R1)),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(J1, #{})),
    %% The membership subscription went on, on the new node's watcher.
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    %% And the app works again: register, add, accept, finish.
    R1b = couch_workers:worker_register(T, <<"w1">>, #{timeout => ?LONG_TIMEOUT_S}, self()),
    ?assert(is_reference(R1b)),
    ?assertNotEqual(R1, R1b),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ok = couch_workers:job_add(T, <<"j3">>, #{}, #{}),
    Taken = [
        begin
            {ok, #{id := Id} = J} = couch_workers:job_accept(R1b, #{timeout => 1000}),
            ok = couch_workers:job_finish(J, #{}),
            Id
        end
     || _ <- [1, 2, 3]
    ],
    ?assertEqual([<<"j1">>, <<"j2">>, <<"j3">>], lists:sort(Taken)),
    %% Nothing else arrived about the old Refs.
    ?assertEqual([], flush_about([R1, Sub], 0)),
    ?assertEqual(stopped, recv_lost(R2)),
    ok = couch_workers:worker_unregister(R1b),
    ok = couch_workers:membership_unsubscribe(S).

%% The group's supervisor gives up (its node owner killed more often than
%% its restart intensity allows): it stops its children, exits, and the
%% top supervisor starts it again; the owners were told each time.
a_group_that_gives_up_is_started_again_by_the_top_supervisor(#{type := T}) ->
    Group = whereis(couch_workers_node_sup),
    Top = whereis(couch_workers_sup),
    Refs = kill_owner_until_the_group_restarts(T, Group, 1, []),
    ?assert(length(Refs) > 1),
    ?assertEqual(Top, whereis(couch_workers_sup)),
    wait_for(fun() -> is_pid(whereis(couch_workers_local)) end, 10000),
    [?assertEqual({Ref, stopped}, {Ref, recv_lost(Ref)}) || Ref <- Refs],
    settled_stats(#{running => true, reapers => 1, heartbeats => 0, registrations => 0}),
    R = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    {ok, J} = couch_workers:job_accept(R, #{}),
    ok = couch_workers:job_finish(J, #{}),
    ok = couch_workers:worker_unregister(R).

kill_owner_until_the_group_restarts(T, Group, N, Refs) when N =< 30 ->
    Id = integer_to_binary(N),
    Ref = wait_for(
        fun() ->
            case couch_workers:worker_register(T, Id, #{timeout => ?LONG_TIMEOUT_S}, self()) of
                R when is_reference(R) -> R;
                {error, _} -> false
            end
        end,
        10000
    ),
    Old = whereis(couch_workers_node),
    exit(Old, kill),
    wait_for(
        fun() ->
            case whereis(couch_workers_node) of
                Pid when is_pid(Pid), Pid =/= Old -> true;
                _ -> false
            end
        end,
        20000
    ),
    case whereis(couch_workers_node_sup) of
        Group -> kill_owner_until_the_group_restarts(T, Group, N + 1, [Ref | Refs]);
        _ -> lists:reverse([Ref | Refs])
    end.

%% `couch_workers_local' is down (its supervisor held back) when the node
%% restarts: the restarted server finds registrations of the old node in
%% its table. Their handles are void: it tells their owners and drops
%% them, and nothing heartbeats them any more, so the reaper removes them.
registrations_of_a_node_gone_while_their_server_was_down_are_told(#{type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    R = couch_workers:worker_register(T, <<"w1">>, #{timeout => 1}, self()),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    Local = whereis(couch_workers_local),
    ok = sys:suspend(couch_workers_handles_sup),
    exit(Local, kill),
    wait_for(fun() -> not is_process_alive(Local) end, 5000),
    %% The group stops the (suspended) handle supervisor and starts all again.
    OldOwner = whereis(couch_workers_node),
    exit(OldOwner, kill),
    couch_workers_test_util:wait_restarted(couch_workers_node, OldOwner),
    couch_workers_test_util:wait_restarted(couch_workers_local, Local),
    ?assertEqual(stopped, recv_lost(R)),
    ?assertEqual(error, couch_workers_local:lookup(R)),
    ?assertEqual(0, ets:info(couch_workers_local, size)),
    %% Reaped (timeout 1 s): nobody heartbeats it.
    wait_membership(S, fun(W) -> W =:= #{} end, 10000),
    R2 = couch_workers:worker_register(T, <<"w1">>, #{timeout => 1}, self()),
    ?assertNotEqual(R, R2),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ok = couch_workers:worker_unregister(R2),
    ok = couch_workers:membership_unsubscribe(S).

unknown_messages_to_the_node_owner_are_logged_not_fatal(#{}) ->
    Owner = whereis(couch_workers_node),
    ?assertEqual({error, {bad_call, bogus}}, gen_server:call(couch_workers_node, bogus)),
    gen_server:cast(couch_workers_node, bogus),
    couch_workers_node ! bogus,
    _ = sys:get_state(couch_workers_node),
    ?assertEqual(Owner, whereis(couch_workers_node)),
    settled_stats(#{running => true, reapers => 1}).

%% ---- helpers ---------------------------------------------------------------

%% Waits until the peer, reading the store, sees exactly `Ids' of `T'.
wait_peer_sees(Peer, T, Ids) ->
    wait_for(
        fun() ->
            case peer:call(Peer, couch_workers, workers, [T], ?PEER_TIMEOUT) of
                Workers when is_list(Workers) ->
                    lists:sort([maps:get(id, W) || W <- Workers]) =:= lists:sort(Ids);
                _ ->
                    false
            end
        end,
        10000
    ).

recv_lost(Ref) ->
    receive
        {couch_workers_worker_lost, Ref, Reason} -> Reason
    after 10000 -> error({owner_not_told, Ref})
    end.

recv_sub_ended(Ref) ->
    receive
        {couch_workers_job_subscription_ended, Ref, Reason} -> Reason
    after 10000 -> error({subscriber_not_told, Ref})
    end.

%% Messages that name one of `Refs', arriving within `Timeout' ms.
flush_about(Refs, Timeout) ->
    flush_refs(maps:from_keys(Refs, true), Timeout).

flush_refs(Set, Timeout) ->
    receive
        %% A registration's leadership messages are a stream of their own
        %% (couch_workers_leader_tests): the type's leader changes as the
        %% node's registrations end.
        {Tag, _, _} when Tag =:= couch_workers_leader; Tag =:= couch_workers_leader_lost -> flush_refs(Set, Timeout);
        Msg when tuple_size(Msg) >= 2, is_map_key(element(2, Msg), Set) -> [Msg | flush_refs(Set, Timeout)]
    after Timeout -> []
    end.

%% couch_workers_test_util:settled_stats/1 (the servers GC-ed, and this
%% process: a job_accept leaves the registration's handle on its heap),
%% failing with the counts it saw.
settled_stats(Expected) ->
    erlang:garbage_collect(),
    try
        couch_workers_test_util:settled_stats(Expected)
    catch
        error:{wait_for_timeout, _} -> error({stats, Expected, couch_workers:stats()})
    end.

