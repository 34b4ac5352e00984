%% @doc Membership: subscriptions (nil and module), deliveries, the ETS
%% cache, unsubscribe, ownership, isolation of callbacks, watcher counts.
-module(couch_workers_membership_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [
    unique_type/1,
    wait_for/2,
    wait_membership/3,
    recv_membership/2,
    no_membership/2,
    recv_callback/2,
    set_sink/2,
    clear_sink/1,
    settled_stats/1
]).

membership_test_() ->
    couch_workers_test_util:app_fixture("couch_workers membership", fun setup/0, fun teardown/1, [
        ?TDEF_FE(get_workers_not_found_without_subscription),
        ?TDEF_FE(nil_subscription_gets_empty_membership_at_once),
        ?TDEF_FE(module_subscription_gets_empty_membership_at_once),
        ?TDEF_FE(initial_delivery_has_current_workers),
        ?TDEF_FE(second_subscriber_gets_cached_membership),
        ?TDEF_FE(each_subscribe_makes_a_new_ref),
        ?TDEF_FE(get_workers_after_subscription),
        ?TDEF_FE(deliveries_have_increasing_versionstamps),
        ?TDEF_FE(module_deliveries_follow_changes),
        ?TDEF_FE(subscriber_for_another_pid),
        ?TDEF_FE(unsubscribe_nil_no_delivery_after),
        ?TDEF_FE(unsubscribe_flushes_queued_deliveries),
        ?TDEF_FE(unsubscribe_module_no_call_after),
        ?TDEF_FE(unsubscribe_from_inside_callback),
        ?TDEF_FE(last_unsubscribe_stops_watcher),
        ?TDEF_FE(one_watcher_per_type),
        ?TDEF_FE(subscriber_exit_ends_subscription),
        ?TDEF_FE(module_subscriber_exit_ends_subscription),
        ?TDEF_FE(crashing_callback_does_not_disturb_others),
        ?TDEF_FE(slow_callback_does_not_delay_others, 10)
    ]).

setup() ->
    Type = unique_type("mt"),
    #{type => Type}.

teardown(#{type := Type}) ->
    clear_sink(Type).

%% ---- tests ---------------------------------------------------------------

get_workers_not_found_without_subscription(#{type := T}) ->
    ?assertEqual({error, not_found}, couch_workers:get_workers(T)),
    %% A registered worker alone makes no membership cache.
    Ref = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assert(is_reference(Ref)),
    ?assertEqual({error, not_found}, couch_workers:get_workers(T)),
    ok = couch_workers:worker_unregister(Ref).

nil_subscription_gets_empty_membership_at_once(#{type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    ?assert(is_reference(S)),
    {VS, W} = recv_membership(S, 5000),
    ?assertEqual(#{}, W),
    ?assert(is_binary(VS)),
    ?assertEqual(10, byte_size(VS)),
    %% Exactly once.
    no_membership(S, 300),
    ok = couch_workers:membership_unsubscribe(S).

module_subscription_gets_empty_membership_at_once(#{type := T}) ->
    set_sink(T, self()),
    S = couch_workers:membership_subscribe(T, couch_workers_test_cb, self()),
    ?assert(is_reference(S)),
    ?assertMatch({T, #{}, _, S}, recv_callback(couch_workers_test_cb, 5000)),
    ?assertEqual(timeout, recv_callback(couch_workers_test_cb, 300)),
    %% A module subscription sends no message itself.
    no_membership(S, 0),
    ok = couch_workers:membership_unsubscribe(S).

initial_delivery_has_current_workers(#{type := T}) ->
    R1 = couch_workers:worker_register(T, <<"w1">>, #{k => 1}, self()),
    R2 = couch_workers:worker_register(T, <<"w2">>, #{k => 2}, self()),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, W} = recv_membership(S, 5000),
    ?assertEqual(#{<<"w1">> => #{<<"k">> => 1}, <<"w2">> => #{<<"k">> => 2}}, W),
    ok = couch_workers:worker_unregister(R1),
    ok = couch_workers:worker_unregister(R2),
    ok = couch_workers:membership_unsubscribe(S).

second_subscriber_gets_cached_membership(#{type := T}) ->
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    S1 = couch_workers:membership_subscribe(T, nil, self()),
    {VS1, W1} = recv_membership(S1, 5000),
    %% The watcher already delivered: the second subscription gets the
    %% cached membership, with the same versionstamp, right away.
    S2 = couch_workers:membership_subscribe(T, nil, self()),
    ?assertEqual({VS1, W1}, recv_membership(S2, 0)),
    ?assertEqual({ok, VS1, W1}, couch_workers:get_workers(T)),
    no_membership(S2, 200),
    ok = couch_workers:worker_unregister(R),
    ok = couch_workers:membership_unsubscribe(S1),
    ok = couch_workers:membership_unsubscribe(S2).

each_subscribe_makes_a_new_ref(#{type := T}) ->
    S1 = couch_workers:membership_subscribe(T, nil, self()),
    S2 = couch_workers:membership_subscribe(T, nil, self()),
    ?assert(is_reference(S1)),
    ?assert(is_reference(S2)),
    ?assertNotEqual(S1, S2),
    ?assertMatch({_, #{}}, recv_membership(S1, 5000)),
    ?assertMatch({_, #{}}, recv_membership(S2, 5000)),
    ok = couch_workers:membership_unsubscribe(S1),
    ok = couch_workers:membership_unsubscribe(S2).

get_workers_after_subscription(#{type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {VS0, #{}} = recv_membership(S, 5000),
    ?assertEqual({ok, VS0, #{}}, couch_workers:get_workers(T)),
    R = couch_workers:worker_register(T, <<"w1">>, #{a => <<"b">>}, self()),
    {VS1, W1, _} = wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ?assertEqual({ok, VS1, W1}, couch_workers:get_workers(T)),
    ?assertEqual(#{<<"w1">> => #{<<"a">> => <<"b">>}}, W1),
    ok = couch_workers:worker_unregister(R),
    {VS2, #{}, _} = wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ?assertEqual({ok, VS2, #{}}, couch_workers:get_workers(T)),
    ?assert(VS2 > VS1),
    ok = couch_workers:membership_unsubscribe(S).

deliveries_have_increasing_versionstamps(#{type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {VS0, #{}} = recv_membership(S, 5000),
    Refs = [couch_workers:worker_register(T, integer_to_binary(I), #{i => I}, self()) || I <- lists:seq(1, 5)],
    [ok = couch_workers:worker_unregister(R) || R <- lists:sublist(Refs, 2)],
    %% wait_membership asserts each VS is greater than the one before.
    {VS, W, All} = wait_membership(S, fun(W) -> lists:sort(maps:keys(W)) =:= [<<"3">>, <<"4">>, <<"5">>] end, 5000),
    ?assert(hd(All) > VS0),
    ?assertEqual(All, lists:usort(All)),
    ?assertEqual(#{<<"3">> => #{<<"i">> => 3}, <<"4">> => #{<<"i">> => 4}, <<"5">> => #{<<"i">> => 5}}, W),
    ?assertEqual({ok, VS, W}, couch_workers:get_workers(T)),
    [ok = couch_workers:worker_unregister(R) || R <- lists:nthtail(2, Refs)],
    {_, #{}, _} = wait_membership(S, fun(W1) -> W1 =:= #{} end, 5000),
    ok = couch_workers:membership_unsubscribe(S).

module_deliveries_follow_changes(#{type := T}) ->
    set_sink(T, self()),
    S = couch_workers:membership_subscribe(T, couch_workers_test_cb, self()),
    {T, #{}, VS0, S} = recv_callback(couch_workers_test_cb, 5000),
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    {T, W1, VS1, S} = recv_callback(couch_workers_test_cb, 5000),
    ?assertEqual(#{<<"w1">> => #{}}, W1),
    ?assert(VS1 > VS0),
    ok = couch_workers:worker_unregister(R),
    {T, W2, VS2, S} = recv_callback(couch_workers_test_cb, 5000),
    ?assertEqual(#{}, W2),
    ?assert(VS2 > VS1),
    ok = couch_workers:membership_unsubscribe(S).

subscriber_for_another_pid(#{type := T}) ->
    %% The subscription's messages go to Pid, not to the caller.
    Self = self(),
    Pid = spawn_link(fun() ->
        receive
            {couch_workers_membership, _, W, _, Ref} -> Self ! {forwarded, Ref, W}
        end
    end),
    S = couch_workers:membership_subscribe(T, nil, Pid),
    receive
        {forwarded, S, W} -> ?assertEqual(#{}, W)
    after 5000 -> error(no_delivery)
    end,
    no_membership(S, 0),
    ok = couch_workers:membership_unsubscribe(S).

unsubscribe_nil_no_delivery_after(#{type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    ?assertEqual(ok, couch_workers:membership_unsubscribe(S)),
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    no_membership(S, 500),
    ok = couch_workers:worker_unregister(R).

unsubscribe_flushes_queued_deliveries(#{type := T}) ->
    S = couch_workers:membership_subscribe(T, nil, self()),
    %% Do not receive: the deliveries queue up. Once the cache has w1 and
    %% the server answered a call after that, the delivery with w1 is in
    %% this mailbox (messages between two processes keep their order).
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    wait_for(
        fun() ->
            case couch_workers:get_workers(T) of
                {ok, _, #{<<"w1">> := _}} -> true;
                _ -> false
            end
        end,
        5000
    ),
    _ = sys:get_state(couch_workers_global),
    ?assertMatch({message_queue_len, N} when N >= 1, process_info(self(), message_queue_len)),
    ?assertEqual(ok, couch_workers:membership_unsubscribe(S)),
    no_membership(S, 0),
    ok = couch_workers:worker_unregister(R),
    no_membership(S, 300).

unsubscribe_module_no_call_after(#{type := T}) ->
    set_sink(T, self()),
    S = couch_workers:membership_subscribe(T, couch_workers_test_cb, self()),
    {T, #{}, _, S} = recv_callback(couch_workers_test_cb, 5000),
    ?assertEqual(ok, couch_workers:membership_unsubscribe(S)),
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assertEqual(timeout, recv_callback(couch_workers_test_cb, 500)),
    ok = couch_workers:worker_unregister(R).

unsubscribe_from_inside_callback(#{type := T}) ->
    %% A callback that unsubscribes its own subscription neither deadlocks
    %% nor gets another call.
    Self = self(),
    set_unsub_sink(T, Self),
    S = couch_workers:membership_subscribe(T, couch_workers_test_unsub_cb, self()),
    receive
        {unsubscribed, S, Result} -> ?assertEqual(ok, Result)
    after 5000 -> error(no_callback)
    end,
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    receive
        {unsubscribed, S, _} -> error(called_after_unsubscribe)
    after 500 -> ok
    end,
    ok = couch_workers:worker_unregister(R).

last_unsubscribe_stops_watcher(#{type := T}) ->
    %% Earlier tests' subscriptions ended with their processes; their
    %% watchers stop shortly after: start from none.
    #{watchers := W0} = settled_stats(#{watchers => 0}),
    S1 = couch_workers:membership_subscribe(T, nil, self()),
    S2 = couch_workers:membership_subscribe(T, couch_workers_test_cb, self()),
    {_, _} = recv_membership(S1, 5000),
    ?assertMatch(#{watchers := N} when N =:= W0 + 1, couch_workers:stats()),
    ok = couch_workers:membership_unsubscribe(S1),
    %% One subscription left: the watcher and the cache stay.
    ?assertMatch({ok, _, #{}}, couch_workers:get_workers(T)),
    ?assertMatch(#{watchers := N} when N =:= W0 + 1, couch_workers:stats()),
    ok = couch_workers:membership_unsubscribe(S2),
    ?assertEqual({error, not_found}, couch_workers:get_workers(T)),
    settled_stats(#{watchers => W0}).

one_watcher_per_type(#{type := T}) ->
    %% Earlier tests' subscriptions ended with their processes; their
    %% watchers stop shortly after: start from none.
    #{watchers := W0} = settled_stats(#{watchers => 0}),
    Subs = [couch_workers:membership_subscribe(T, nil, self()) || _ <- lists:seq(1, 5)],
    [{_, #{}} = recv_membership(S, 5000) || S <- Subs],
    ?assertMatch(#{watchers := N} when N =:= W0 + 1, couch_workers:stats()),
    [ok = couch_workers:membership_unsubscribe(S) || S <- Subs],
    settled_stats(#{watchers => W0}).

subscriber_exit_ends_subscription(#{type := T}) ->
    %% Earlier tests' subscriptions ended with their processes; their
    %% watchers stop shortly after: start from none.
    #{watchers := W0} = settled_stats(#{watchers => 0}),
    Self = self(),
    Pid = spawn(fun() ->
        S = couch_workers:membership_subscribe(T, nil, self()),
        receive
            {couch_workers_membership, T, _, _, S} -> Self ! {subscribed, self(), S}
        end,
        receive stop -> ok end
    end),
    S =
        receive
            {subscribed, Pid, Ref} -> Ref
        after 5000 -> error(no_subscription)
        end,
    ?assertMatch({ok, _, #{}}, couch_workers:get_workers(T)),
    ?assertMatch(#{watchers := N} when N =:= W0 + 1, couch_workers:stats()),
    Pid ! stop,
    wait_for(fun() -> couch_workers:get_workers(T) =:= {error, not_found} end, 5000),
    settled_stats(#{watchers => W0}),
    %% Its Ref is stale now.
    ?assertEqual(ok, couch_workers:membership_unsubscribe(S)).

module_subscriber_exit_ends_subscription(#{type := T}) ->
    set_sink(T, self()),
    %% Earlier tests' subscriptions ended with their processes; their
    %% watchers stop shortly after: start from none.
    #{watchers := W0} = settled_stats(#{watchers => 0}),
    Owner = spawn(fun() -> receive stop -> ok end end),
    S = couch_workers:membership_subscribe(T, couch_workers_test_cb, Owner),
    {T, #{}, _, S} = recv_callback(couch_workers_test_cb, 5000),
    exit(Owner, kill),
    wait_for(fun() -> couch_workers:get_workers(T) =:= {error, not_found} end, 5000),
    settled_stats(#{watchers => W0}),
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assertEqual(timeout, recv_callback(couch_workers_test_cb, 300)),
    ok = couch_workers:worker_unregister(R).

crashing_callback_does_not_disturb_others(#{type := T}) ->
    set_sink(T, self()),
    Crash = couch_workers:membership_subscribe(T, couch_workers_test_crash_cb, self()),
    Good = couch_workers:membership_subscribe(T, couch_workers_test_cb, self()),
    Nil = couch_workers:membership_subscribe(T, nil, self()),
    {T, #{}, _, Crash} = recv_callback(couch_workers_test_crash_cb, 5000),
    {T, #{}, _, Good} = recv_callback(couch_workers_test_cb, 5000),
    {_, #{}} = recv_membership(Nil, 5000),
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    %% The crashing callback keeps being called (its crashes are caught),
    %% and the others get every change.
    {T, W1, _, Crash} = recv_callback(couch_workers_test_crash_cb, 5000),
    {T, W1, _, Good} = recv_callback(couch_workers_test_cb, 5000),
    ?assertEqual(#{<<"w1">> => #{}}, W1),
    {_, W1} = recv_membership(Nil, 5000),
    ?assert(is_process_alive(whereis(couch_workers_global))),
    ok = couch_workers:worker_unregister(R),
    {T, #{}, _, Good} = recv_callback(couch_workers_test_cb, 5000),
    [ok = couch_workers:membership_unsubscribe(S) || S <- [Crash, Good, Nil]].

slow_callback_does_not_delay_others(#{type := T}) ->
    set_sink(T, self()),
    Slow = couch_workers:membership_subscribe(T, couch_workers_test_slow_cb, self()),
    Fast = couch_workers:membership_subscribe(T, couch_workers_test_cb, self()),
    Nil = couch_workers:membership_subscribe(T, nil, self()),
    {T, #{}, _, Fast} = recv_callback(couch_workers_test_cb, 5000),
    {_, #{}} = recv_membership(Nil, 5000),
    %% The slow callback is still in its first call (2 s).
    T0 = erlang:monotonic_time(millisecond),
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    {T, #{<<"w1">> := _}, _, Fast} = recv_callback(couch_workers_test_cb, 1000),
    {_, #{<<"w1">> := _}} = recv_membership(Nil, 1000),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 1000),
    ?assertEqual(timeout, recv_callback(couch_workers_test_slow_cb, 0)),
    %% It still gets both deliveries, in order.
    {T, #{}, VS0, Slow} = recv_callback(couch_workers_test_slow_cb, 5000),
    {T, #{<<"w1">> := _}, VS1, Slow} = recv_callback(couch_workers_test_slow_cb, 5000),
    ?assert(VS1 > VS0),
    ok = couch_workers:worker_unregister(R),
    %% Unsubscribing a callback in the middle of a slow call returns at
    %% once and nothing more arrives from it.
    ok = couch_workers:membership_unsubscribe(Slow),
    ?assertEqual(timeout, recv_callback(couch_workers_test_slow_cb, 2500)),
    [ok = couch_workers:membership_unsubscribe(S) || S <- [Fast, Nil]].

%% ---- helpers -------------------------------------------------------------

set_unsub_sink(T, Pid) ->
    persistent_term:put({couch_workers_test_unsub_sink, T}, Pid).
