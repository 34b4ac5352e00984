%% @doc A job's run history in the Job map of `job_get/2': the last 10
%% runs, newest first, each `#{attempt, worker, started_at, ended_at,
%% outcome, error}'.
-module(couch_workers_history_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2]).

history_test_() ->
    couch_workers_test_util:app_fixture("couch_workers run history", fun setup/0, fun teardown/1, [
        ?TDEF_FE(runs_newest_first),
        ?TDEF_FE(the_last_ten)
    ]).

setup() ->
    T = unique_type("hist"),
    #{type => T, worker => register_worker(T, <<"w">>)}.

teardown(#{worker := W}) ->
    ok = couch_workers:worker_unregister(W).

%% ---- tests ---------------------------------------------------------------

runs_newest_first(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{}),
    ?assertMatch({ok, #{history := []}}, couch_workers:job_get(T, <<"a">>)),
    Before = erlang:system_time(millisecond),
    {ok, J1} = couch_workers:job_accept(W, #{}),
    ?assertNot(maps:is_key(history, J1)),
    {ok, #{history := [Running]}} = couch_workers:job_get(T, <<"a">>),
    ?assertMatch(#{attempt := 1, worker := <<"w">>, outcome := running, ended_at := null, error := null}, Running),
    ?assert(maps:get(started_at, Running) >= Before),
    ok = couch_workers:job_fail(J1, #{<<"why">> => <<"db_down">>}, #{delay => 0}),
    {ok, J2} = couch_workers:job_accept(W, #{timeout => 5000}),
    ok = couch_workers:job_finish(J2, #{}),
    {ok, #{history := [Second, First]}} = couch_workers:job_get(T, <<"a">>),
    ?assertMatch(#{attempt := 2, outcome := finished, error := null}, Second),
    ?assertMatch(#{attempt := 1, outcome := retried, error := #{<<"why">> := <<"db_down">>}}, First),
    ?assert(is_integer(maps:get(ended_at, First)) andalso maps:get(ended_at, First) >= maps:get(started_at, First)).

the_last_ten(#{type := T, worker := W}) ->
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{max_attempts => infinity}),
    lists:foreach(
        fun(_) ->
            {ok, J} = couch_workers:job_accept(W, #{timeout => 5000}),
            ok = couch_workers:job_fail(J, #{}, #{delay => 0})
        end,
        lists:seq(1, 12)
    ),
    {ok, #{history := Runs}} = couch_workers:job_get(T, <<"a">>),
    ?assertEqual(lists:seq(12, 3, -1), [A || #{attempt := A} <- Runs]),
    ?assertEqual([retried], lists:usort([O || #{outcome := O} <- Runs])).
