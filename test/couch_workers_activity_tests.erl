%% @doc Activity timeouts through the Erlang API: a running job whose
%% worker does not update it for its `activity_timeout' is taken back (an
%% attempt spent, pending again, the error `activity_timeout'); the
%% worker's owner is told `{couch_workers_job_timeout, WorkerRef, Type,
%% Id}'; the old handle is refused; telemetry emits
%% `[couch_workers, job, timed_out]' and the node's metrics count it
%% (`jobs_timed_out').
-module(couch_workers_activity_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2]).

-define(SINK, couch_workers_test_telemetry_sink).

activity_test_() ->
    couch_workers_test_util:app_fixture("couch_workers activity timeouts", fun setup/0, fun teardown/1, [
        ?TDEF_FE(a_job_not_updated_is_taken_back_and_its_owner_told, 15),
        ?TDEF_FE(an_updated_job_keeps_running, 15),
        ?TDEF_FE(the_timeout_is_emitted_to_telemetry, 15),
        ?TDEF_FE(the_timeout_is_counted_in_metrics, 15)
    ]).

setup() ->
    #{type => unique_type("activity")}.

teardown(_) ->
    ok.

%% A worker whose owner is the test's process (the one that receives the
%% owner's messages).
with_worker(T, Test) ->
    W = register_worker(T, <<"w">>),
    try
        Test(W)
    after
        ok = couch_workers:worker_unregister(W)
    end.

%% ---- tests ---------------------------------------------------------------

a_job_not_updated_is_taken_back_and_its_owner_told(#{type := T}) ->
    with_worker(T, fun(W) -> taken_back(T, W) end).

taken_back(T, W) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{activity_timeout => 1}),
    {ok, Handle} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assertMatch(#{id := <<"a">>, attempts := 1}, Handle),
    Started = erlang:monotonic_time(millisecond),
    receive
        {couch_workers_job_timeout, W, T, <<"a">>} -> ok
    after 6000 -> erlang:error(no_timeout_message)
    end,
    ?assert(erlang:monotonic_time(millisecond) - Started >= 900),
    {ok, Job} = couch_workers:job_get(T, <<"a">>),
    ?assertMatch(#{state := pending, attempts := 1, error := #{<<"reason">> := <<"activity_timeout">>}}, Job),
    ?assertEqual({error, not_owner}, couch_workers:job_update(Handle, #{<<"late">> => true})),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Handle, #{})),
    %% Told once.
    receive
        {couch_workers_job_timeout, W, T, _} = Twice -> erlang:error({told_twice, Twice})
    after 500 -> ok
    end,
    %% The worker is still registered, and takes the job again.
    {ok, Again} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assertMatch(#{id := <<"a">>, attempts := 2}, Again),
    ok = couch_workers:job_finish(Again, #{}).

an_updated_job_keeps_running(#{type := T}) ->
    with_worker(T, fun(W) -> kept(T, W) end).

kept(T, W) ->
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{activity_timeout => 1}),
    {ok, Handle} = couch_workers:job_accept(W, #{timeout => 5000}),
    Last = lists:foldl(
        fun(I, H) ->
            timer:sleep(250),
            {ok, Next} = couch_workers:job_update(H, #{<<"n">> => I}),
            Next
        end,
        Handle,
        lists:seq(1, 10)
    ),
    ?assertMatch({ok, #{state := running}}, couch_workers:job_get(T, <<"b">>)),
    receive
        {couch_workers_job_timeout, W, T, _} = Msg -> erlang:error({timed_out, Msg})
    after 0 -> ok
    end,
    ok = couch_workers:job_finish(Last, #{}).

the_timeout_is_emitted_to_telemetry(#{type := T}) ->
    with_worker(T, fun(W) -> emitted(T, W) end).

emitted(T, W) ->
    {module, telemetry} = code:ensure_loaded(telemetry),
    persistent_term:put(?SINK, self()),
    try
        ok = couch_workers:job_add(T, <<"c">>, #{}, #{activity_timeout => 1}),
        {ok, _Handle} = couch_workers:job_accept(W, #{timeout => 5000}),
        Node = node(),
        receive
            {telemetry, [couch_workers, job, timed_out], Measurements, Metadata} ->
                ?assertMatch(#{count := 1, system_time := _}, Measurements),
                ?assertMatch(#{type := T, id := <<"c">>, worker := <<"w">>, timeout := 1, node := Node}, Metadata)
        after 6000 -> erlang:error(no_telemetry_event)
        end,
        receive
            {couch_workers_job_timeout, W, T, <<"c">>} -> ok
        after 1000 -> erlang:error(no_timeout_message)
        end
    after
        _ = persistent_term:erase(?SINK),
        _ = code:purge(telemetry),
        _ = code:delete(telemetry),
        _ = code:purge(telemetry)
    end.

the_timeout_is_counted_in_metrics(#{type := T}) ->
    with_worker(T, fun(W) -> counted(T, W) end).

counted(T, W) ->
    Before = timed_out_count(T),
    ok = couch_workers:job_add(T, <<"d">>, #{}, #{activity_timeout => 1}),
    {ok, _Handle} = couch_workers:job_accept(W, #{timeout => 5000}),
    receive
        {couch_workers_job_timeout, W, T, <<"d">>} -> ok
    after 6000 -> erlang:error(no_timeout_message)
    end,
    %% Counted from the core's log event, which may come a moment after
    %% the owner's message.
    ?assertEqual(ok, wait_count(T, Before + 1, 50)),
    Text = iolist_to_binary(couch_workers:metrics(prometheus)),
    Node = atom_to_binary(node()),
    Sample = iolist_to_binary([
        "couch_workers_jobs_timed_out_total{node=\"", Node, "\",type=\"", T, "\"} ", integer_to_binary(Before + 1), "\n"
    ]),
    ?assertMatch({_, _}, binary:match(Text, Sample)).

timed_out_count(T) ->
    #{types := Types} = couch_workers:metrics(),
    maps:get(jobs_timed_out, maps:get(T, Types, #{}), 0).

wait_count(T, Want, Tries) ->
    case timed_out_count(T) of
        Want -> ok;
        Got when Tries =:= 0 -> {count, Got};
        _ ->
            timer:sleep(100),
            wait_count(T, Want, Tries - 1)
    end.
