%% @doc Running limits through the Erlang API: `job_type_set/2' with
%% `max_running' 2 and three workers that wait for jobs; `job_counts/1',
%% sampled all along, never shows more than 2 running, shows 2, and every
%% job finishes.
-module(couch_workers_limits_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2]).

limits_test_() ->
    couch_workers_test_util:app_fixture("couch_workers running limits", fun setup/0, fun teardown/1, [
        ?TDEF_FE(max_running_2_with_3_workers, 30),
        ?TDEF_FE(readme_example_runs)
    ]).

setup() ->
    #{type => unique_type("lim")}.

teardown(#{}) ->
    ok.

%% The README's limits example, line for line; then a worker takes the
%% job, which runs under both limits.
readme_example_runs(#{}) ->
    ok = couch_workers:job_type_set(<<"replication">>, #{max_running => 8, max_running_per_group => 2, activity_timeout => 61}),
    ok = couch_workers:job_add(<<"replication">>, <<"doc1">>, #{}, #{group => <<"https://target-a">>, unique => <<"repid-1">>}),
    {error, {duplicate, <<"doc1">>}} = couch_workers:job_add(<<"replication">>, <<"doc2">>, #{}, #{unique => <<"repid-1">>}),
    ?assertEqual(
        #{max_running => 8, max_running_per_group => 2, activity_timeout => 61},
        couch_workers:job_type_get(<<"replication">>)
    ),
    W = register_worker(<<"replication">>, <<"n1-r1">>),
    {ok, #{id := <<"doc1">>, group := <<"https://target-a">>}} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assertMatch(#{running := 1}, couch_workers:job_counts(<<"replication">>)),
    ok = couch_workers:worker_unregister(W),
    ok = couch_workers:job_remove(<<"replication">>, <<"doc1">>),
    ok = couch_workers:job_type_set(
        <<"replication">>, #{max_running => infinity, max_running_per_group => infinity, activity_timeout => infinity}
    ).

max_running_2_with_3_workers(#{type := T}) ->
    N = 30,
    ok = couch_workers:job_type_set(T, #{max_running => 2}),
    ok = couch_workers:job_add_many(T, [{integer_to_binary(I), #{}, #{}} || I <- lists:seq(1, N)]),
    Self = self(),
    Sampler = spawn_link(fun() -> sample(T, 0, 0) end),
    Pids = [
        spawn_link(fun() ->
            W = register_worker(T, <<"w", (integer_to_binary(K))/binary>>),
            Self ! {done, self(), work(T, W, [])}
        end)
     || K <- lists:seq(1, 3)
    ],
    Ids = lists:append([receive {done, P, Done} -> Done after 25000 -> error(work_timeout) end || P <- Pids]),
    Sampler ! {stop, Self},
    {Most, Samples} = receive {sampled, M, S} -> {M, S} after 5000 -> error(sampler_timeout) end,
    ?assertEqual(N, length(lists:usort(Ids))),
    ?assert(Samples > 0),
    ?assertEqual(2, Most),
    ?assertMatch(#{finished := N, running := 0, pending := 0}, couch_workers:job_counts(T)).

%% Accepts (waiting up to 300 ms for a slot) and finishes until the queue
%% is empty and nothing runs.
work(T, W, Done) ->
    case couch_workers:job_accept(W, #{timeout => 300}) of
        {ok, #{id := Id} = Job} ->
            timer:sleep(5),
            ok = couch_workers:job_finish(Job, #{}),
            work(T, W, [Id | Done]);
        {error, not_found} ->
            case couch_workers:job_counts(T) of
                #{pending := 0, running := 0} -> Done;
                #{} -> work(T, W, Done)
            end
    end.

%% Reads the counts until told to stop; fails on more than 2 running.
sample(T, Most, Samples) ->
    receive
        {stop, From} -> From ! {sampled, Most, Samples}
    after 0 ->
        #{running := Running} = couch_workers:job_counts(T),
        Running =< 2 orelse error({over_the_limit, Running}),
        sample(T, max(Most, Running), Samples + 1)
    end.
