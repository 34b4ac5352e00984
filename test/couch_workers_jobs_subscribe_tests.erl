%% @doc Job subscriptions: the current job, then one message per change
%% (failover included), `removed' at the end; several subscriptions at
%% once; unsubscribe flushes; a subscriber's exit ends its subscriptions;
%% the server that owns them restarts cleanly.
-module(couch_workers_jobs_subscribe_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [
    unique_type/1,
    settled_stats/1,
    register_worker/2,
    recv_job/2,
    wait_job/3,
    no_job_msg/2
]).

subscribe_test_() ->
    couch_workers_test_util:app_fixture("couch_workers job subscriptions", fun setup/0, fun teardown/1, [
        ?TDEF_FE(subscribe_unknown_job_is_not_found),
        ?TDEF_FE(subscribe_sees_every_change),
        ?TDEF_FE(subscribe_twice_shares_one_watcher),
        ?TDEF_FE(subscribe_wait_multiple),
        ?TDEF_FE(remove_when_subscribed_and_pending),
        ?TDEF_FE(remove_when_subscribed_and_running),
        ?TDEF_FE(failover_is_seen_by_subscriber),
        ?TDEF_FE(cancel_is_seen_by_subscriber),
        ?TDEF_FE(messages_go_to_the_given_pid),
        ?TDEF_FE(unsubscribe_flushes_and_stops),
        ?TDEF_FE(unsubscribe_unknown_is_ok),
        ?TDEF_FE(subscriber_exit_ends_subscription),
        ?TDEF_FE(killed_jobs_server_restores_subscriptions),
        ?TDEF_FE(killed_jobs_server_monitors_again),
        ?TDEF_FE(unknown_messages_are_logged_not_fatal)
    ]).

setup() ->
    #{type => unique_type("js")}.

teardown(#{}) ->
    ok.

%% ---- tests ---------------------------------------------------------------

subscribe_unknown_job_is_not_found(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ?assertEqual({error, not_found}, couch_workers:job_subscribe(<<"xyz">>, <<"j1">>, self())),
    ?assertEqual({error, not_found}, couch_workers:job_subscribe(T, <<"j5">>, self())),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}).

subscribe_sees_every_change(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"z">> => 1}, #{}),
    {ok, Sub, Job0} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    ?assert(is_reference(Sub)),
    ?assertMatch(#{type := T, id := <<"j1">>, state := pending, info := #{<<"z">> := 1}}, Job0),
    ?assertNot(maps:is_key(token, Job0)),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    Running = wait_job(Sub, fun(_) -> true end, 5000),
    ?assertMatch(#{state := running, worker := <<"w1">>, attempts := 1, info := #{<<"z">> := 1}}, Running),
    ?assertNot(maps:is_key(token, Running)),
    ?assert(maps:get(vs, Running) > maps:get(vs, Job0)),
    %% Intermediate running updates are seen too.
    {ok, _} = couch_workers:job_update(Job, #{<<"z">> => 2}),
    Updated = wait_job(Sub, fun(_) -> true end, 5000),
    ?assertMatch(#{state := running, info := #{<<"z">> := 2}}, Updated),
    ?assert(maps:get(vs, Updated) > maps:get(vs, Running)),
    ok = couch_workers:job_finish(Job, #{<<"z">> => 3}),
    Finished = wait_job(Sub, fun(_) -> true end, 5000),
    ?assertMatch(#{state := finished, result := #{<<"z">> := 3}}, Finished),
    no_job_msg(Sub, 100),
    %% What get says is what the last message said (get adds the history).
    {ok, Got} = couch_workers:job_get(T, <<"j1">>),
    ?assertEqual(Finished, maps:without([history], Got)),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ?assertEqual(removed, recv_job(Sub, 5000)),
    no_job_msg(Sub, 100),
    ?assertEqual({error, not_found}, couch_workers:job_subscribe(T, <<"j1">>, self())),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    ok = couch_workers:worker_unregister(W).

subscribe_twice_shares_one_watcher(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, S1, J1} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    {ok, S2, J2} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    ?assertNotEqual(S1, S2),
    ?assertEqual(J1, J2),
    settled_stats(#{job_subscriptions => 2, job_watchers => 1}),
    ok = couch_workers:job_cancel(T, <<"j1">>),
    ?assertMatch(#{state := canceled}, wait_job(S1, fun(_) -> true end, 5000)),
    ?assertMatch(#{state := canceled}, wait_job(S2, fun(_) -> true end, 5000)),
    ok = couch_workers:job_unsubscribe(S1),
    settled_stats(#{job_subscriptions => 1, job_watchers => 1}),
    ok = couch_workers:job_remove(T, <<"j1">>),
    no_job_msg(S1, 100),
    ?assertEqual(removed, recv_job(S2, 5000)),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}).

subscribe_wait_multiple(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    {ok, S1, #{state := pending}} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    {ok, S2, #{state := pending}} = couch_workers:job_subscribe(T, <<"j2">>, self()),
    Subs = [S1, S2],
    %% One accept, one running message (from either subscription).
    {ok, PJob1} = couch_workers:job_accept(W, #{}),
    ?assertMatch(#{state := running}, wait_any(Subs, 5000)),
    ?assertEqual(timeout, wait_any(Subs, 50)),
    {ok, PJob2} = couch_workers:job_accept(W, #{}),
    ?assertMatch(#{state := running}, wait_any(Subs, 5000)),
    ?assertEqual(timeout, wait_any(Subs, 50)),
    {ok, _} = couch_workers:job_update(PJob1, #{<<"q">> => 5}),
    {ok, _} = couch_workers:job_update(PJob2, #{<<"r">> => 6}),
    %% Each job was updated once: two running messages.
    ?assertMatch(#{state := running}, wait_any(Subs, 5000)),
    ?assertMatch(#{state := running}, wait_any(Subs, 5000)),
    ?assertEqual(timeout, wait_any(Subs, 50)),
    ok = couch_workers:job_finish(PJob1, #{}),
    ?assertMatch(#{state := finished, info := #{<<"q">> := 5}}, wait_any(Subs, 5000)),
    ?assertEqual(timeout, wait_any(Subs, 50)),
    %% The second finish's message is flushed by the unsubscribe (or
    %% never sent): none arrives after it.
    ok = couch_workers:job_finish(PJob2, #{}),
    ok = couch_workers:job_unsubscribe(S1),
    ok = couch_workers:job_unsubscribe(S2),
    ?assertEqual(timeout, wait_any(Subs, 100)),
    ok = couch_workers:worker_unregister(W).

remove_when_subscribed_and_pending(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"x">> => 1}, #{}),
    {ok, S, #{state := pending}} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ?assertEqual(removed, recv_job(S, 5000)),
    no_job_msg(S, 100),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}).

remove_when_subscribed_and_running(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"z">> => 2}, #{}),
    {ok, S, #{state := pending}} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    {ok, _Job} = couch_workers:job_accept(W, #{}),
    ?assertMatch(#{state := running}, wait_job(S, fun(_) -> true end, 5000)),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ?assertEqual(removed, recv_job(S, 5000)),
    no_job_msg(S, 100),
    %% The subscription ended: unsubscribing it is fine.
    ?assertEqual(ok, couch_workers:job_unsubscribe(S)),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    ok = couch_workers:worker_unregister(W).

failover_is_seen_by_subscriber(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{<<"y">> => 1}, #{}),
    {ok, _Job} = couch_workers:job_accept(W, #{}),
    {ok, S, #{state := running}} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    ok = couch_workers:worker_unregister(W),
    ?assertMatch(
        #{state := pending, worker := null, attempts := 1, info := #{<<"y">> := 1}},
        wait_job(S, fun(_) -> true end, 5000)
    ),
    ok = couch_workers:job_unsubscribe(S).

cancel_is_seen_by_subscriber(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    {ok, S, #{state := running, cancel_requested := false}} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    ok = couch_workers:job_cancel(T, <<"j1">>),
    ?assertMatch(#{state := running, cancel_requested := true}, wait_job(S, fun(_) -> true end, 5000)),
    {error, canceled} = couch_workers:job_update(Job, #{}),
    ?assertMatch(#{state := canceled, worker := null}, wait_job(S, fun(_) -> true end, 5000)),
    ok = couch_workers:job_unsubscribe(S),
    ok = couch_workers:worker_unregister(W).

messages_go_to_the_given_pid(#{type := T}) ->
    Self = self(),
    Pid = spawn_link(fun() -> forward(Self) end),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, S, _} = couch_workers:job_subscribe(T, <<"j1">>, Pid),
    ok = couch_workers:job_cancel(T, <<"j1">>),
    receive
        {forwarded, {couch_workers_job, S, #{state := canceled}}} -> ok
    after 5000 -> error(no_message)
    end,
    no_job_msg(S, 100),
    ok = couch_workers:job_unsubscribe(S),
    ok = couch_workers:job_remove(T, <<"j1">>),
    receive
        {forwarded, Msg} -> error({unexpected, Msg})
    after 200 -> ok
    end,
    unlink(Pid),
    exit(Pid, kill).

unsubscribe_flushes_and_stops(#{type := T}) ->
    W = register_worker(T, <<"w1">>),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, S, _} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    %% Let the message arrive, then unsubscribe: it is flushed.
    wait_mailbox(S, 5000),
    ok = couch_workers:job_unsubscribe(S),
    no_job_msg(S, 0),
    %% And nothing comes after.
    {ok, _} = couch_workers:job_update(Job, #{<<"a">> => 1}),
    ok = couch_workers:job_finish(Job, #{}),
    ok = couch_workers:job_remove(T, <<"j1">>),
    no_job_msg(S, 200),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    ok = couch_workers:worker_unregister(W).

unsubscribe_unknown_is_ok(#{}) ->
    ?assertEqual(ok, couch_workers:job_unsubscribe(make_ref())),
    ?assertEqual(ok, couch_workers:job_unsubscribe(not_a_ref)),
    ?assertEqual(ok, couch_workers:job_unsubscribe(<<"ref">>)).

subscriber_exit_ends_subscription(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Pid = spawn(fun() ->
        receive
            stop -> ok
        end
    end),
    {ok, _S1, _} = couch_workers:job_subscribe(T, <<"j1">>, Pid),
    {ok, _S2, _} = couch_workers:job_subscribe(T, <<"j1">>, Pid),
    settled_stats(#{job_subscriptions => 2, job_watchers => 1}),
    exit(Pid, kill),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    %% A dead pid's subscription ends at once.
    Dead = spawn(fun() -> ok end),
    wait_dead(Dead),
    {ok, _S3, _} = couch_workers:job_subscribe(T, <<"j1">>, Dead),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}).

%% A crash of the subscription server keeps every subscription: the
%% next change is delivered, unsubscribe works, and the end (`removed')
%% still reaches the restarted server, which drops its row.
killed_jobs_server_restores_subscriptions(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    {ok, S1, _} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    {ok, S2, _} = couch_workers:job_subscribe(T, <<"j2">>, self()),
    settled_stats(#{job_subscriptions => 2, job_watchers => 2}),
    New = kill_jobs_server(),
    %% The handles were kept (in the supervisor's table): nothing ended.
    settled_stats(#{job_subscriptions => 2, job_watchers => 2}),
    ok = couch_workers:job_cancel(T, <<"j1">>),
    ?assertMatch(#{state := canceled}, recv_job(S1, 5000)),
    %% Unsubscribe after the restart: nothing more arrives.
    ok = couch_workers:job_unsubscribe(S1),
    ok = couch_workers:job_remove(T, <<"j1">>),
    no_job_msg(S1, 200),
    settled_stats(#{job_subscriptions => 1, job_watchers => 1}),
    ?assertEqual(1, ets:info(couch_workers_jobs_subs, size)),
    %% The end of S2 reaches the new server, which forgets S2.
    ok = couch_workers:job_remove(T, <<"j2">>),
    ?assertEqual(removed, recv_job(S2, 5000)),
    couch_workers_test_util:wait_for(fun() -> ets:info(couch_workers_jobs_subs, size) =:= 0 end, 5000),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    ?assertEqual(New, whereis(couch_workers_jobs_subs)),
    ?assertEqual(0, map_size(element(2, sys:get_state(couch_workers_jobs_subs)))).

%% Subscribers are monitored again after the crash: one that exits
%% afterwards, or while no server ran, has its subscription ended.
killed_jobs_server_monitors_again(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Self = self(),
    Sub = fun() ->
        spawn(fun() ->
            {ok, _, _} = couch_workers:job_subscribe(T, <<"j1">>, self()),
            Self ! {subscribed, self()},
            receive stop -> ok end
        end)
    end,
    [P1, P2] = [Sub(), Sub()],
    [receive {subscribed, P} -> ok after 10000 -> error(no_subscribe) end || P <- [P1, P2]],
    settled_stats(#{job_subscriptions => 2, job_watchers => 1}),
    Old = whereis(couch_workers_jobs_subs),
    exit(Old, kill),
    %% P1 dies before the server is back (or just after: both are DOWN).
    exit(P1, kill),
    _ = wait_restarted(couch_workers_jobs_subs, Old),
    settled_stats(#{job_subscriptions => 1, job_watchers => 1}),
    exit(P2, kill),
    settled_stats(#{job_subscriptions => 0, job_watchers => 0}),
    ?assertEqual(0, ets:info(couch_workers_jobs_subs, size)).

unknown_messages_are_logged_not_fatal(#{type := T}) ->
    Pid = whereis(couch_workers_jobs_subs),
    ?assertEqual({error, {bad_call, bogus}}, gen_server:call(couch_workers_jobs_subs, bogus)),
    gen_server:cast(couch_workers_jobs_subs, bogus),
    Pid ! bogus,
    Pid ! {make_ref(), {ok, late}},
    Pid ! {couch_workers_job_ended, make_ref()},
    _ = sys:get_state(couch_workers_jobs_subs),
    ?assertEqual(Pid, whereis(couch_workers_jobs_subs)),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {ok, S, _} = couch_workers:job_subscribe(T, <<"j1">>, self()),
    ok = couch_workers:job_unsubscribe(S).

%% ---- helpers ---------------------------------------------------------------

%% The next job message of any of Subs.
wait_any(Subs, Timeout) ->
    receive
        {couch_workers_job, S, Msg} ->
            ?assert(lists:member(S, Subs)),
            Msg
    after Timeout -> timeout
    end.

%% Waits until a message for S is in the mailbox (without taking it).
wait_mailbox(S, Timeout) ->
    couch_workers_test_util:wait_for(
        fun() ->
            {messages, Msgs} = process_info(self(), messages),
            lists:any(fun(M) -> element(1, M) =:= couch_workers_job andalso element(2, M) =:= S end, [
                M
             || M <- Msgs, is_tuple(M), tuple_size(M) =:= 3
            ])
        end,
        Timeout
    ).

forward(To) ->
    receive
        Msg ->
            To ! {forwarded, Msg},
            forward(To)
    end.

wait_dead(Pid) ->
    Mon = erlang:monitor(process, Pid),
    receive
        {'DOWN', Mon, process, Pid, _} -> ok
    end.

kill_jobs_server() ->
    Old = whereis(couch_workers_jobs_subs),
    exit(Old, kill),
    New = wait_restarted(couch_workers_jobs_subs, Old),
    ?assertNotEqual(Old, New),
    New.

wait_restarted(Name, Old) ->
    couch_workers_test_util:wait_for(
        fun() ->
            case whereis(Name) of
                P when is_pid(P), P =/= Old -> P;
                _ -> false
            end
        end,
        5000
    ).
