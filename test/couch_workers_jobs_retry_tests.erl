%% @doc Failure as a state: `job_fail/3' stores the
%% error and retries with the default backoff (exponential in attempts,
%% jittered, capped, from the app env) or the given `delay', and ends
%% `failed' once attempts are spent or with `retry => false';
%% `job_release/2' gives a job back without spending an attempt. A
%% worker's death (multi-node: `couch_workers_jobs_peer_tests').
-module(couch_workers_jobs_retry_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2, wait_job/3]).

-define(BASE_MS, 100).
-define(MAX_MS, 400).

retry_test_() ->
    {
        "couch_workers job failures and releases",
        {
            setup,
            fun() ->
                Ctx = couch_workers_test_util:start_app(),
                ok = application:set_env(couch_workers, retry_backoff_base_ms, ?BASE_MS),
                ok = application:set_env(couch_workers, retry_backoff_max_ms, ?MAX_MS),
                Ctx
            end,
            fun(Ctx) ->
                application:unset_env(couch_workers, retry_backoff_base_ms),
                application:unset_env(couch_workers, retry_backoff_max_ms),
                couch_workers_test_util:stop_app(Ctx)
            end,
            {
                foreach,
                fun setup/0,
                fun teardown/1,
                [
                    ?TDEF_FE(backoff_grows_and_attempts_end_in_failed, 30),
                    ?TDEF_FE(fail_with_a_delay, 30),
                    ?TDEF_FE(retry_false_fails_at_once),
                    ?TDEF_FE(infinite_attempts_never_fail),
                    ?TDEF_FE(a_failed_job_is_kept_and_resubmitted),
                    ?TDEF_FE(fail_of_a_job_with_a_cancel_request),
                    ?TDEF_FE(release_spends_no_attempt),
                    ?TDEF_FE(release_with_schedule_info_and_priority),
                    ?TDEF_FE(subscribers_see_failures_and_retries, 30),
                    ?TDEF_FE(stale_handles_are_refused),
                    ?TDEF_FE(bad_input_writes_nothing)
                ]
            }
        }
    }.

setup() ->
    T = unique_type("retry"),
    #{type => T, worker => register_worker(T, <<"w">>)}.

teardown(#{worker := W}) ->
    ok = couch_workers:worker_unregister(W).

now_ms() ->
    os:system_time(millisecond).

%% Fails the job; returns the delay bounds the call allows: the job's
%% `run_at' less the wall clock after and before the call.
fail_measured(Job, Error, Opts, T, Id) ->
    T0 = now_ms(),
    ok = couch_workers:job_fail(Job, Error, Opts),
    T1 = now_ms(),
    {ok, #{state := scheduled, run_at := RunAt} = After} = couch_workers:job_get(T, Id),
    {RunAt - T1, RunAt - T0, After}.

%% ---- tests ---------------------------------------------------------------

backoff_grows_and_attempts_end_in_failed(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{max_attempts => 4}),
    %% attempts 1, 2, 3: base * 2^(attempts - 1), capped at the max, less
    %% up to a quarter of jitter.
    Delays = lists:map(
        fun(Attempt) ->
            {ok, #{attempts := Attempt} = J} = couch_workers:job_accept(W, #{timeout => 5000}),
            Error = #{<<"reason">> => <<"try">>, <<"n">> => Attempt},
            {Low, High, After} = fail_measured(J, Error, #{}, T, <<"j">>),
            ?assertMatch(#{error := Error, attempts := Attempt, worker := null}, After),
            Full = min(?BASE_MS bsl (Attempt - 1), ?MAX_MS),
            ?assert(High >= Full - Full div 4),
            ?assert(Low =< Full),
            {Low, High}
        end,
        [1, 2, 3]
    ),
    ?assertMatch([_, _, _], Delays),
    %% The 4th accept spends the last attempt: its failure ends the job.
    {ok, #{attempts := 4} = J4} = couch_workers:job_accept(W, #{timeout => 5000}),
    ok = couch_workers:job_fail(J4, #{<<"reason">> => <<"last">>}, #{}),
    ?assertMatch(
        {ok, #{state := failed, error := #{<<"reason">> := <<"last">>}, attempts := 4, run_at := null}},
        couch_workers:job_get(T, <<"j">>)
    ),
    ?assertMatch(#{failed := 1, scheduled := 0, pending := 0, running := 0}, couch_workers:job_counts(T)),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 300})).

fail_with_a_delay(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    %% 0: pending at once.
    ok = couch_workers:job_fail(J1, #{<<"e">> => 1}, #{delay => 0}),
    ?assertMatch({ok, #{state := pending, error := #{<<"e">> := 1}}}, couch_workers:job_get(T, <<"j">>)),
    {ok, J2} = couch_workers:job_accept(W, #{}),
    %% 3 s: long enough that the read and the accept below come before it
    %% falls due on a loaded machine (with 700 ms, a stall of that much
    %% made the read see it due, `pending`).
    {Low, High, _} = fail_measured(J2, #{<<"e">> => 2}, #{delay => 3000}, T, <<"j">>),
    ?assert(Low =< 3000 andalso High >= 3000),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 200})),
    ?assertMatch({ok, #{attempts := 3}}, couch_workers:job_accept(W, #{timeout => 10000})).

retry_false_fails_at_once(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{max_attempts => 10}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J, #{<<"fatal">> => true}, #{retry => false, delay => 0}),
    ?assertMatch({ok, #{state := failed, attempts := 1, error := #{<<"fatal">> := true}}}, couch_workers:job_get(T, <<"j">>)).

infinite_attempts_never_fail(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{max_attempts => infinity}),
    lists:foreach(
        fun(N) ->
            {ok, #{attempts := N} = J} = couch_workers:job_accept(W, #{}),
            ok = couch_workers:job_fail(J, #{}, #{delay => 0})
        end,
        lists:seq(1, 25)
    ),
    ?assertMatch({ok, #{state := pending, attempts := 25, max_attempts := infinity}}, couch_workers:job_get(T, <<"j">>)).

a_failed_job_is_kept_and_resubmitted(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"v">> => 1}, #{max_attempts => 1}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J, #{<<"boom">> => 1}, #{}),
    ?assertMatch({ok, [#{id := <<"j">>, state := failed}], _}, couch_workers:job_list(T, #{states => [failed]})),
    ok = couch_workers:job_resubmit(T, <<"j">>, #{<<"v">> => 2}, #{max_attempts => 2}),
    ?assertMatch(
        {ok, #{state := pending, attempts := 0, error := null, max_attempts := 2, info := #{<<"v">> := 2}}},
        couch_workers:job_get(T, <<"j">>)
    ),
    ?assertMatch({ok, #{attempts := 1}}, couch_workers:job_accept(W, #{})).

%% Nobody would see the request if the job ran again: it ends canceled.
fail_of_a_job_with_a_cancel_request(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_cancel(T, <<"j">>),
    ok = couch_workers:job_fail(J, #{<<"e">> => 1}, #{delay => 0}),
    ?assertMatch({ok, #{state := canceled, error := #{<<"e">> := 1}}}, couch_workers:job_get(T, <<"j">>)).

release_spends_no_attempt(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{max_attempts => 1}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_release(J1, #{}),
    ?assertMatch(
        {ok, #{state := pending, attempts := 1, max_attempts := 2, error := null, worker := null}},
        couch_workers:job_get(T, <<"j">>)
    ),
    %% The raised limit leaves this accept its one failure with a retry.
    {ok, #{attempts := 2} = J2} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_fail(J2, #{}, #{}),
    ?assertMatch({ok, #{state := failed}}, couch_workers:job_get(T, <<"j">>)),
    ok = couch_workers:job_add(T, <<"inf">>, #{}, #{max_attempts => infinity}),
    {ok, J3} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_release(J3, #{}),
    ?assertMatch({ok, #{max_attempts := infinity}}, couch_workers:job_get(T, <<"inf">>)).

%% A replicator's "run again in 15 s with this checkpoint".
release_with_schedule_info_and_priority(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{<<"checkpoint">> => 0}, #{priority => 5}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_release(J, #{delay => 500, info => #{<<"checkpoint">> => 42}, priority => -1}),
    {ok, #{state := scheduled, priority := -1, info := #{<<"checkpoint">> := 42}, run_at := RunAt}} =
        couch_workers:job_get(T, <<"j">>),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 100})),
    {ok, #{id := <<"j">>, attempts := 2, max_attempts := 21} = J2} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assert(now_ms() >= RunAt),
    ok = couch_workers:job_finish(J2, #{}).

subscribers_see_failures_and_retries(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{max_attempts => 2}),
    {ok, Sub, #{state := pending}} = couch_workers:job_subscribe(T, <<"j">>, self()),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    wait_job(Sub, fun(J) -> maps:get(state, J) =:= running end, 5000),
    %% 3 s: the subscription's read comes before it falls due (a due job
    %% reads `pending`), on a loaded machine too.
    ok = couch_workers:job_fail(J1, #{<<"n">> => 1}, #{delay => 3000}),
    ?assertMatch(#{state := scheduled, error := #{<<"n">> := 1}}, wait_job(Sub, fun(J) -> maps:get(state, J) =/= running end, 5000)),
    {ok, J2} = couch_workers:job_accept(W, #{timeout => 10000}),
    wait_job(Sub, fun(J) -> maps:get(state, J) =:= running end, 5000),
    ok = couch_workers:job_fail(J2, #{<<"n">> => 2}, #{}),
    ?assertMatch(#{state := failed, error := #{<<"n">> := 2}}, wait_job(Sub, fun(J) -> maps:get(state, J) =:= failed end, 5000)),
    ok = couch_workers:job_unsubscribe(Sub).

stale_handles_are_refused(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:job_release(J1, #{}),
    ?assertEqual({error, not_owner}, couch_workers:job_fail(J1, #{}, #{})),
    ?assertEqual({error, not_owner}, couch_workers:job_release(J1, #{})),
    {ok, J2} = couch_workers:job_accept(W, #{}),
    ?assertEqual({error, not_owner}, couch_workers:job_fail(J1, #{}, #{})),
    ok = couch_workers:job_remove(T, <<"j">>),
    ?assertEqual({error, not_found}, couch_workers:job_fail(J2, #{}, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_release(J2, #{})).

bad_input_writes_nothing(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    {ok, J} = couch_workers:job_accept(W, #{}),
    {ok, Before} = couch_workers:job_get(T, <<"j">>),
    ?assertError(badarg, couch_workers:job_fail(J, not_a_map, #{})),
    ?assertError(badarg, couch_workers:job_fail(J, #{}, [])),
    ?assertError(badarg, couch_workers:job_fail(maps:remove(token, J), #{}, #{})),
    ?assertError(badarg, couch_workers:job_fail(not_a_job, #{}, #{})),
    ?assertEqual({error, invalid_delay}, couch_workers:job_fail(J, #{}, #{delay => -1})),
    ?assertEqual({error, invalid_delay}, couch_workers:job_fail(J, #{}, #{delay => soon})),
    ?assertEqual({error, invalid_retry}, couch_workers:job_fail(J, #{}, #{retry => maybe})),
    ?assertEqual({error, invalid_info}, couch_workers:job_fail(J, #{p => self()}, #{})),
    ?assertError(badarg, couch_workers:job_release(J, not_a_map)),
    ?assertError(badarg, couch_workers:job_release(#{}, #{})),
    ?assertEqual({error, invalid_delay}, couch_workers:job_release(J, #{delay => -5})),
    ?assertEqual({error, invalid_schedule}, couch_workers:job_release(J, #{delay => 5, run_at => 5})),
    ?assertEqual({error, invalid_priority}, couch_workers:job_release(J, #{priority => high})),
    ?assertEqual({error, invalid_info}, couch_workers:job_release(J, #{info => not_a_map})),
    ?assertEqual({error, invalid_info}, couch_workers:job_release(J, #{info => #{r => make_ref()}})),
    ?assertEqual({ok, Before}, couch_workers:job_get(T, <<"j">>)),
    ok = couch_workers:job_finish(J, #{}).
