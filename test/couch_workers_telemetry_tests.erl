%% @doc Telemetry events, through the stand-in `telemetry' module of
%% test/ (the real application cannot be installed here): while it is
%% loaded, every counted event reaches it with its measurements and
%% metadata; while it is not, none does and the counters still count.
-module(couch_workers_telemetry_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

-export([set_sink/1]).

-define(SINK, couch_workers_test_telemetry_sink).

telemetry_test_() ->
    {
        "telemetry events",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun(Ctx) ->
                unload_stand_in(),
                couch_workers_test_util:stop_app(Ctx)
            end,
            fun(_) ->
                [
                    {"job and worker events with measurements and metadata", ?_test(events_when_loaded())},
                    {"events of the job ends: retried, failed, released, resubmitted, pruned", ?_test(job_end_events())},
                    {"events of the core's failovers, from its log events", ?_test(failover_events())},
                    {"accepted carries queue_time: pending since the add, a release, a schedule's run_at", ?_test(queue_time_events())},
                    {"no event while telemetry is not loaded", ?_test(no_events_when_absent())}
                ]
            end
        }
    }.

set_sink(Pid) ->
    persistent_term:put(?SINK, Pid).

events_when_loaded() ->
    {module, telemetry} = code:ensure_loaded(telemetry),
    set_sink(self()),
    T = unique_type("tel"),
    Node = node(),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assertMatch(
        {#{system_time := _, count := 1}, #{type := T, id := <<"w1">>, node := Node}}, recv([couch_workers, worker, registered])
    ),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {#{duration := D, count := 1}, #{type := T, id := <<"j1">>, node := Node}} = recv([couch_workers, job, added]),
    ?assert(is_integer(D) andalso D > 0),
    ok = couch_workers:job_add_many(T, [{<<"j2">>, #{}, #{}}, {<<"j3">>, #{}, #{}}]),
    ?assertMatch({#{count := 2}, #{type := T, ids := [<<"j2">>, <<"j3">>]}}, recv([couch_workers, job, added])),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ?assertMatch({#{duration := _}, #{type := T, id := <<"j1">>}}, recv([couch_workers, job, accepted])),
    ok = couch_workers:job_finish(J, #{}),
    ?assertMatch({#{duration := _}, #{type := T, id := <<"j1">>}}, recv([couch_workers, job, finished])),
    ok = couch_workers:job_cancel(T, <<"j2">>),
    ?assertMatch({_, #{type := T, id := <<"j2">>}}, recv([couch_workers, job, canceled])),
    ok = couch_workers:job_remove(T, <<"j3">>),
    ?assertMatch({_, #{type := T, id := <<"j3">>}}, recv([couch_workers, job, removed])),
    %% A failed call emits nothing.
    {error, already_exists} = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:worker_unregister(W),
    ?assertMatch({_, #{type := T, id := <<"w1">>}}, recv([couch_workers, worker, unregistered])),
    ?assertEqual([], drain()).

job_end_events() ->
    {module, telemetry} = code:ensure_loaded(telemetry),
    set_sink(self()),
    T = unique_type("tel_end"),
    Node = node(),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{max_attempts => 2, keep => 0}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J1, #{<<"reason">> => <<"a">>}, #{delay => 0}),
    {#{duration := D, count := 1}, Meta1} = recv([couch_workers, job, retried]),
    ?assert(is_integer(D) andalso D > 0),
    ?assertEqual(#{type => T, id => <<"j1">>, node => Node, attempts => 1, error => #{<<"reason">> => <<"a">>}}, Meta1),
    {ok, J2} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_release(J2, #{}),
    ?assertMatch({#{duration := _, count := 1}, #{type := T, id := <<"j1">>, node := Node}}, recv([couch_workers, job, released])),
    %% The release raised max_attempts to 3; attempts 3 of 3 is the end.
    {ok, J3} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J3, #{<<"reason">> => <<"b">>}, #{}),
    ?assertMatch(
        {#{duration := _, count := 1}, #{type := T, id := <<"j1">>, attempts := 3, error := #{<<"reason">> := <<"b">>}}},
        recv([couch_workers, job, failed])
    ),
    ?assertMatch({ok, #{state := failed}}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:job_resubmit(T, <<"j1">>, #{}, #{}),
    ?assertMatch({#{duration := _, count := 1}, #{type := T, id := <<"j1">>}}, recv([couch_workers, job, resubmitted])),
    {ok, J5} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_finish(J5, #{}),
    _ = recv([couch_workers, job, finished]),
    %% keep 0: this node's pruner removes it.
    ?assertMatch({#{system_time := _, count := 1}, #{type := T, node := Node}}, recv([couch_workers, job, pruned])),
    ok = couch_workers:worker_unregister(W),
    _ = recv([couch_workers, worker, unregistered]),
    %% Each once (the adds and accepts were not received above).
    Ends = [retried, failed, released, resubmitted, finished, pruned],
    ?assertEqual([], [E || {telemetry, [couch_workers, job, A], _, _} = E <- drain(), lists:member(A, Ends)]).

%% The core's log events that carry counts (a reap's failed-over jobs, a
%% sweep's, a prune's), as couch_workers_events hands them over; a reap's
%% own test with a killed peer is in couch_workers_metrics_tests.
failover_events() ->
    {module, telemetry} = code:ensure_loaded(telemetry),
    set_sink(self()),
    T = unique_type("tel_fo"),
    ok = couch_workers_observe:log_event(worker_reaped, #{type => T, id => <<"b1">>, jobs => 3}),
    ?assertMatch({#{count := 1}, #{type := T, id := <<"b1">>}}, recv([couch_workers, worker, reaped])),
    ?assertMatch(
        {#{system_time := _, count := 3}, #{type := T, worker := <<"b1">>, reason := reaped}}, recv([couch_workers, job, requeued])
    ),
    ok = couch_workers_observe:log_event(worker_reaped, #{type => T, id => <<"b2">>, jobs => 0}),
    _ = recv([couch_workers, worker, reaped]),
    ok = couch_workers_observe:log_event(orphaned_jobs_requeued, #{type => T, worker => <<"b3">>, count => 700}),
    ?assertMatch({#{count := 700}, #{type := T, worker := <<"b3">>, reason := swept}}, recv([couch_workers, job, requeued])),
    ?assertEqual([], drain()),
    ?assertMatch(#{jobs_requeued := 703, workers_reaped := 2}, maps:get(T, maps:get(types, couch_workers:metrics()))),
    %% A real one: the owner of a worker running a job exits.
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    Owner = spawn(fun() -> receive stop -> ok end end),
    W = couch_workers:worker_register(T, <<"b4">>, #{}, Owner),
    {ok, _} = couch_workers:job_accept(W, #{}),
    Owner ! stop,
    ?assertMatch(
        {#{system_time := _, count := 1}, #{type := T, worker := <<"b4">>, reason := owner_exit}},
        recv([couch_workers, job, requeued])
    ),
    ?assertMatch(#{jobs_requeued := 704}, maps:get(T, maps:get(types, couch_workers:metrics()))),
    %% (The worker's own events, which the test after this one must not see.)
    _ = recv([couch_workers, worker, unregistered]),
    [_, _, _] = [E || {telemetry, [couch_workers, _, A], _, _} = E <- drain(), lists:member(A, [added, registered, accepted])].

%% `queue_time' of `accepted': how long the job could have been accepted
%% before the accept took it, in native units like `duration'. Pending
%% since its add (300 ms before the accept); since its release, not its
%% add; a scheduled job since its `run_at', not since its add.
queue_time_events() ->
    {module, telemetry} = code:ensure_loaded(telemetry),
    set_sink(self()),
    T = unique_type("tel_q"),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    Ms = fun(Native) -> erlang:convert_time_unit(Native, native, millisecond) end,
    Accepted = fun(Opts) ->
        {ok, J} = couch_workers:job_accept(W, Opts),
        {#{queue_time := Q, duration := D}, #{id := Id}} = recv([couch_workers, job, accepted]),
        ?assertEqual(Id, maps:get(id, J)),
        {J, Ms(Q), Ms(D)}
    end,
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    timer:sleep(300),
    {J1, Q1, _} = Accepted(#{}),
    %% At least the 300 ms slept; a generous upper bound (a loaded machine).
    ?assert(Q1 >= 300 andalso Q1 < 5000, Q1),
    %% Released: queued again from the release, not from the add (1.3 s
    %% before): no longer than from the release to the accept's end.
    timer:sleep(1000),
    T0 = erlang:monotonic_time(millisecond),
    ok = couch_workers:job_release(J1, #{}),
    {J2, Q2, _} = Accepted(#{}),
    ?assert(Q2 =< erlang:monotonic_time(millisecond) - T0 + 50, Q2),
    ok = couch_workers:job_finish(J2, #{}),
    %% Scheduled 1 s ahead, taken by an acceptor waiting already: it waited
    %% from its run_at, not from its add (which the accept's own wait,
    %% begun just after the add, shows: at least 500 ms more).
    ok = couch_workers:job_add(T, <<"s1">>, #{}, #{delay => 1000}),
    {J3, Q3, D3} = Accepted(#{timeout => 10000}),
    ?assert(D3 >= 900, D3),
    ?assert(Q3 + 500 =< D3, {Q3, D3}),
    ok = couch_workers:job_finish(J3, #{}),
    ok = couch_workers:worker_unregister(W),
    _ = drain().

no_events_when_absent() ->
    unload_stand_in(),
    set_sink(self()),
    T = unique_type("tel_off"),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ?assertEqual(false, erlang:module_loaded(telemetry)),
    ?assertEqual([], drain()),
    %% Counting goes on.
    #{T := #{jobs_added := 1, jobs_removed := 1}} = maps:get(types, couch_workers:metrics()).

recv(Event) ->
    receive
        {telemetry, Event, Measurements, Metadata} -> {Measurements, Metadata}
    after 5000 -> erlang:error({no_event, Event, drain()})
    end.

drain() ->
    receive
        {telemetry, _, _, _} = E -> [E | drain()]
    after 200 -> []
    end.

unload_stand_in() ->
    _ = persistent_term:erase(?SINK),
    _ = code:purge(telemetry),
    _ = code:delete(telemetry),
    _ = code:purge(telemetry),
    ok.
