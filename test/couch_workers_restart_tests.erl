%% @doc A crash of the app's own servers drops no registration and no
%% subscription: `couch_workers_local' and
%% `couch_workers_global' keep their state in tables the supervisor owns,
%% and their restarts restore it. Killed with `exit(Pid, kill)' (no
%% terminate/2) and crashed with an abnormal terminate: the registrations
%% keep heartbeating, the owners are still monitored, the subscriptions
%% keep their deliveries, and every count of `couch_workers:stats/0' comes
%% back. And an unsubscribe returns only once no delivery can follow, also
%% when its server answers later than the call timeout.
-module(couch_workers_restart_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [
    unique_type/1,
    wait_for/2,
    wait_membership/3,
    recv_membership/2,
    no_membership/2,
    recv_callback/2,
    counts/0,
    settled_stats/1
]).

%% A store budget of 1 s: the API's call timeout is 6 s.
-define(TX_TIMEOUT_MS, 1000).

restart_test_() ->
    {
        "crashes of the app's servers",
        {
            foreach,
            fun() -> couch_workers_test_util:start_app(#{tx_timeout_ms => ?TX_TIMEOUT_MS}) end,
            fun couch_workers_test_util:stop_app/1,
            [
                ?TDEF_FE(killed_local_server_keeps_every_registration, 30),
                ?TDEF_FE(crashed_local_server_keeps_every_registration, 30),
                ?TDEF_FE(register_in_flight_when_the_server_dies_is_done_by_its_successor, 30),
                ?TDEF_FE(local_server_stopped_by_its_supervisor_leaves_nothing_to_restore, 30),
                ?TDEF_FE(killed_global_server_keeps_every_subscription, 30),
                ?TDEF_FE(subscription_that_cannot_be_restored_tells_its_owner, 30),
                ?TDEF_FE(delivery_lost_with_a_callback_process_comes_after_the_restart, 30),
                ?TDEF_FE(unsubscribes_wait_for_a_server_slower_than_the_call_timeout, 40)
            ]
        }
    }.

%% ---- tests ---------------------------------------------------------------

killed_local_server_keeps_every_registration(_) ->
    local_server_keeps_every_registration(fun(Pid) -> exit(Pid, kill) end).

crashed_local_server_keeps_every_registration(_) ->
    %% terminate/2 runs, with a crash's reason: it must not unregister.
    local_server_keeps_every_registration(fun(Pid) -> catch sys:terminate(Pid, injected_crash, 5000) end).

local_server_keeps_every_registration(Crash) ->
    T = unique_type("restart"),
    Before = counts(),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    %% Timeout 1 s: a registration whose heartbeats stopped leaves within 2 s.
    R1 = couch_workers:worker_register(T, <<"w1">>, #{timeout => 1}, self()),
    Self = self(),
    Owner2 = spawn(fun() ->
        Self ! {registered, couch_workers:worker_register(T, <<"w2">>, #{timeout => 1}, self())},
        receive stop -> ok end
    end),
    R2 = receive {registered, R} -> R after 10000 -> error(no_register) end,
    ?assert(is_reference(R2)),
    wait_membership(S, fun(W) -> map_size(W) =:= 2 end, 5000),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Old = whereis(couch_workers_local),
    Crash(Old),
    New = couch_workers_test_util:wait_restarted(couch_workers_local, Old),
    ?assertNotEqual(Old, New),
    %% Three timeouts later both are still members: their heartbeats went on.
    no_membership(S, 3000),
    ?assertMatch({ok, _, #{<<"w1">> := _, <<"w2">> := _}}, couch_workers:get_workers(T)),
    %% Their Refs work: the same Ref again, and an accept.
    ?assertEqual(R1, couch_workers:worker_register(T, <<"w1">>, #{timeout => 1}, self())),
    {ok, J} = couch_workers:job_accept(R1, #{}),
    ok = couch_workers:job_finish(J, #{}),
    %% The owners are monitored again: an owner's exit unregisters.
    Owner2 ! stop,
    wait_membership(S, fun(W) -> not maps:is_key(<<"w2">>, W) end, 5000),
    ok = couch_workers:worker_unregister(R1),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ok = couch_workers:membership_unsubscribe(S),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ?assertEqual(Before, settled(Before)),
    ?assertEqual(0, ets:info(couch_workers_local, size)).

register_in_flight_when_the_server_dies_is_done_by_its_successor(_) ->
    T = unique_type("restart"),
    Before = counts(),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    Self = self(),
    Old = whereis(couch_workers_local),
    ok = sys:suspend(Old),
    spawn_link(fun() -> Self ! {registered, couch_workers:worker_register(T, <<"w1">>, #{}, Self)} end),
    wait_for(fun() -> queue_len(Old) >= 1 end, 5000),
    exit(Old, kill),
    R = receive {registered, Res} -> Res after 15000 -> error(no_register) end,
    ?assert(is_reference(R)),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ?assertMatch({ok, T, <<"w1">>}, couch_workers_local:lookup(R)),
    ok = couch_workers:worker_unregister(R),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    ok = couch_workers:membership_unsubscribe(S),
    ?assertEqual(Before, settled(Before)).

local_server_stopped_by_its_supervisor_leaves_nothing_to_restore(_) ->
    T = unique_type("restart"),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    %% A deliberate stop unregisters its workers: a restart must not bring
    %% back their (removed) registrations.
    ok = supervisor:terminate_child(couch_workers_handles_sup, couch_workers_local),
    wait_membership(S, fun(W) -> W =:= #{} end, 5000),
    {ok, _} = supervisor:restart_child(couch_workers_handles_sup, couch_workers_local),
    ?assertEqual(error, couch_workers_local:lookup(R)),
    ?assertEqual(0, ets:info(couch_workers_local, size)),
    R2 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assertNotEqual(R, R2),
    wait_membership(S, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
    ok = couch_workers:worker_unregister(R2),
    ok = couch_workers:membership_unsubscribe(S).

killed_global_server_keeps_every_subscription(_) ->
    T = unique_type("restart"),
    Before = counts(),
    couch_workers_test_util:set_sink(T, self()),
    try
        S1 = couch_workers:membership_subscribe(T, nil, self()),
        {_, #{}} = recv_membership(S1, 5000),
        S2 = couch_workers:membership_subscribe(T, couch_workers_test_cb, self()),
        {T, #{}, _, S2} = recv_callback(couch_workers_test_cb, 5000),
        Self = self(),
        Owner3 = spawn(fun() ->
            Self ! {subscribed, couch_workers:membership_subscribe(T, nil, self())},
            receive stop -> ok end
        end),
        S3 = receive {subscribed, R} -> R after 10000 -> error(no_subscribe) end,
        R1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
        {VS1, #{<<"w1">> := _}, _} = wait_membership(S1, fun(W) -> maps:is_key(<<"w1">>, W) end, 5000),
        {T, #{<<"w1">> := _}, VS1, S2} = recv_callback(couch_workers_test_cb, 5000),
        Old = whereis(couch_workers_global),
        exit(Old, kill),
        New = couch_workers_test_util:wait_restarted(couch_workers_global, Old),
        ?assertNotEqual(Old, New),
        %% The cache answers all along; nobody gets a delivery it has seen.
        ?assertMatch({ok, VS1, #{<<"w1">> := _}}, couch_workers:get_workers(T)),
        no_membership(S1, 300),
        ?assertEqual(timeout, recv_callback(couch_workers_test_cb, 0)),
        %% The new watcher delivers the next change to both.
        R2 = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
        {VS2, W2, _} = wait_membership(S1, fun(W) -> maps:is_key(<<"w2">>, W) end, 5000),
        ?assert(VS2 > VS1),
        ?assertMatch({T, W2, VS2, S2}, recv_callback(couch_workers_test_cb, 5000)),
        %% One watcher again (the old one stopped with its handle).
        settled_stats(#{watchers => 1, watches => 1}),
        %% Owners are monitored again.
        Owner3 ! stop,
        wait_for(fun() -> ets:lookup(couch_workers_membership_subs, S3) =:= [] end, 5000),
        ok = couch_workers:membership_unsubscribe(S1),
        ok = couch_workers:membership_unsubscribe(S2),
        ok = couch_workers:worker_unregister(R1),
        ok = couch_workers:worker_unregister(R2),
        ?assertEqual(Before, settled(Before)),
        ?assertEqual({error, not_found}, couch_workers:get_workers(T)),
        ?assertEqual(0, ets:info(couch_workers_membership_subs, size))
    after
        couch_workers_test_util:clear_sink(T)
    end.

%% The callback process dies with the server (it is linked): a delivery
%% still in its mailbox is lost with it, and the restarted server
%% delivers the membership it had not taken.
delivery_lost_with_a_callback_process_comes_after_the_restart(_) ->
    T = unique_type("restart"),
    couch_workers_test_util:set_sink(T, self()),
    try
        %% The first call (#{}) blocks until released: the delivery of
        %% w1's join waits in the callback process's mailbox.
        S = couch_workers:membership_subscribe(T, couch_workers_test_block_cb, self()),
        {Proc0, #{}, _VS0} = recv_blocked(S),
        R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
        wait_for(fun() -> queue_len(Proc0) >= 1 end, 5000),
        {ok, VS1, #{<<"w1">> := _}} = couch_workers:get_workers(T),
        Old = whereis(couch_workers_global),
        exit(Old, kill),
        couch_workers_test_util:wait_restarted(couch_workers_global, Old),
        ?assertNot(is_process_alive(Proc0)),
        {Proc1, W1, VS1} = recv_blocked(S),
        ?assertMatch(#{<<"w1">> := _}, W1),
        Proc1 ! release,
        %% Nothing else: the killed call of #{} is not made again.
        ?assertEqual(nothing, receive {cb_called, _, _, _, _, S} = M -> M after 500 -> nothing end),
        ok = couch_workers:membership_unsubscribe(S),
        ok = couch_workers:worker_unregister(R)
    after
        couch_workers_test_util:clear_sink(T)
    end.

recv_blocked(S) ->
    receive
        {cb_called, Proc, _T, Workers, VS, S} -> {Proc, Workers, VS}
    after 5000 -> error(no_callback)
    end.

subscription_that_cannot_be_restored_tells_its_owner(_) ->
    T = unique_type("restart"),
    S = couch_workers:membership_subscribe(T, nil, self()),
    {_, #{}} = recv_membership(S, 5000),
    %% The Rust node stops under the app: no watcher can start again.
    Stop = make_ref(),
    ok = couch_workers_nif:stop(Stop),
    ok = couch_workers_nif:wait(Stop, 10000),
    Old = whereis(couch_workers_global),
    exit(Old, kill),
    couch_workers_test_util:wait_restarted(couch_workers_global, Old),
    receive
        {couch_workers_membership_ended, S, Reason} -> ?assertEqual(not_started, Reason)
    after 5000 -> error(owner_not_told)
    end,
    ?assertEqual(0, ets:info(couch_workers_membership_subs, size)),
    ?assertEqual({error, not_found}, couch_workers:get_workers(T)),
    ok = couch_workers:membership_unsubscribe(S).

%% Each server is suspended longer than the call timeout while a
%% subscriber unsubscribes; a delivery is on its way meanwhile (queued in
%% the membership server; for a job, made after the call timeout). The
%% unsubscribe returns once the server answered, and nothing follows it.
unsubscribes_wait_for_a_server_slower_than_the_call_timeout(_) ->
    T = unique_type("restart"),
    CallTimeout = couch_workers_app:call_timeout(),
    ?assertEqual(?TX_TIMEOUT_MS + 5000, CallTimeout),
    Self = self(),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    MemberSub = spawn_link(fun() -> unsubscriber(Self, membership, T) end),
    JobSub = spawn_link(fun() -> unsubscriber(Self, job, T) end),
    [receive {subscribed, P} -> ok after 10000 -> error(no_subscribe) end || P <- [MemberSub, JobSub]],
    Global = whereis(couch_workers_global),
    Jobs = whereis(couch_workers_jobs_subs),
    ok = sys:suspend(Global),
    ok = sys:suspend(Jobs),
    Resumed =
        try
            %% A change queued in the membership server before the unsubscribe.
            R = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
            wait_for(fun() -> queue_len(Global) >= 1 end, 5000),
            MemberSub ! unsubscribe,
            JobSub ! unsubscribe,
            wait_for(fun() -> queue_len(Global) >= 2 andalso queue_len(Jobs) >= 1 end, 5000),
            timer:sleep(CallTimeout + 500),
            %% A job change after the call timeout: the subscription is live
            %% until the suspended server ends it.
            ok = couch_workers:job_cancel(T, <<"j1">>),
            timer:sleep(300),
            R
        after
            self() ! {resuming, erlang:monotonic_time(millisecond)},
            ok = sys:resume(Global),
            ok = sys:resume(Jobs)
        end,
    ResumedAt = receive {resuming, At} -> At end,
    [
        receive
            {unsubscribed, P, ReturnedAt, After} ->
                ?assertEqual({P, []}, {P, After}),
                ?assert(ReturnedAt >= ResumedAt)
        after 15000 -> error({no_unsubscribe, P})
        end
     || P <- [MemberSub, JobSub]
    ],
    ok = couch_workers:worker_unregister(Resumed),
    ok = couch_workers:job_remove(T, <<"j1">>).

%% ---- helpers ---------------------------------------------------------------

%% A subscriber that unsubscribes when told, and reports when that
%% returned and which of its deliveries came after.
unsubscriber(Test, Kind, T) ->
    Ref =
        case Kind of
            membership ->
                S = couch_workers:membership_subscribe(T, nil, self()),
                {_, #{}} = recv_membership(S, 5000),
                S;
            job ->
                {ok, S, _} = couch_workers:job_subscribe(T, <<"j1">>, self()),
                S
        end,
    Test ! {subscribed, self()},
    receive unsubscribe -> ok end,
    ok =
        case Kind of
            membership -> couch_workers:membership_unsubscribe(Ref);
            job -> couch_workers:job_unsubscribe(Ref)
        end,
    ReturnedAt = erlang:monotonic_time(millisecond),
    After = deliveries(Ref, 1000),
    Test ! {unsubscribed, self(), ReturnedAt, After}.

deliveries(Ref, Timeout) ->
    receive
        {couch_workers_membership, _, _, _, Ref} = M -> [M | deliveries(Ref, Timeout)];
        {couch_workers_job, Ref, _} = M -> [M | deliveries(Ref, Timeout)]
    after Timeout -> []
    end.

queue_len(Pid) ->
    {message_queue_len, N} = process_info(Pid, message_queue_len),
    N.

settled(Expected) ->
    try
        wait_for(fun() -> counts() =:= Expected end, 5000),
        Expected
    catch
        error:{wait_for_timeout, _} -> counts()
    end.

