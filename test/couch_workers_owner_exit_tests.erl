%% @doc An owner's exit is a death (the contract, `worker_register/4': "When
%% `Pid' exits, the worker is removed, as a death: its running jobs
%% fail"): each job it ran fails with `#{<<"reason">> => <<"worker_lost">>}'
%% and spends the attempt its accept counted, back to `pending' while
%% attempts are left, else `failed'. A crash and a `normal' exit are the
%% same; so is an owner that died while `couch_workers_local' was down
%% (the restarted server's monitor finds it gone). Only a deliberate
%% `worker_unregister/1' releases the jobs (attempt not spent:
%% `max_attempts' + 1). A job that kills every owner it runs on therefore
%% ends `failed' after `max_attempts' runs instead of cycling forever.
-module(couch_workers_owner_exit_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, wait_for/2]).

%% A pattern: the error holds at least this (the contract).
-define(LOST, #{<<"reason">> := <<"worker_lost">>}).

owner_exit_test_() ->
    couch_workers_test_util:app_fixture("couch_workers: an owner's exit fails its worker's jobs", fun setup/0, fun teardown/1, [
        ?TDEF_FE(owner_crash_fails_running_job),
        ?TDEF_FE(owner_normal_exit_is_a_death),
        ?TDEF_FE(owner_crash_with_max_attempts_1_ends_failed),
        ?TDEF_FE(every_running_job_of_every_worker_fails),
        ?TDEF_FE(unregister_releases_running_job),
        ?TDEF_FE(job_that_kills_every_owner_ends_failed, 30),
        ?TDEF_FE(owner_dead_while_server_down_is_a_death, 30)
    ]).

setup() ->
    #{type => unique_type("oe")}.

teardown(#{}) ->
    ok.

%% ---- tests ---------------------------------------------------------------

owner_crash_fails_running_job(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {Owner, [Job]} = owner_running(T, <<"w1">>, 1),
    exit(Owner, kill),
    Lost = wait_left(T, <<"j1">>),
    ?assertMatch(#{state := pending, attempts := 1, max_attempts := 20, error := ?LOST}, Lost),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    %% The next accept is the second attempt, and it may succeed.
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    {ok, Job2} = couch_workers:job_accept(W, #{timeout => 5000}),
    ?assertMatch(#{id := <<"j1">>, attempts := 2}, Job2),
    ok = couch_workers:job_finish(Job2, #{}),
    ?assertMatch({ok, #{state := finished, attempts := 2}}, couch_workers:job_get(T, <<"j1">>)),
    ok = couch_workers:worker_unregister(W).

%% The contract names no exit reason that is not a death: a process that
%% returns (`normal') without unregistering is gone all the same.
owner_normal_exit_is_a_death(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {Owner, [_Job]} = owner_running(T, <<"w1">>, 1),
    Owner ! {exit, normal},
    Lost = wait_left(T, <<"j1">>),
    ?assertMatch(#{state := pending, attempts := 1, max_attempts := 20, error := ?LOST}, Lost).

owner_crash_with_max_attempts_1_ends_failed(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{max_attempts => 1}),
    {Owner, [Job]} = owner_running(T, <<"w1">>, 1),
    Owner ! {exit, {shutdown, crashed_on_purpose}},
    Lost = wait_left(T, <<"j1">>),
    ?assertMatch(#{state := failed, attempts := 1, max_attempts := 1, error := ?LOST}, Lost),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})),
    W = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ok = couch_workers:worker_unregister(W).

%% One owner, two workers, three running jobs: every one fails, each by
%% its own limit.
every_running_job_of_every_worker_fails(#{type := T}) ->
    ok = couch_workers:job_add_many(T, [
        {<<"j1">>, #{}, #{max_attempts => 1}},
        {<<"j2">>, #{}, #{}},
        {<<"j3">>, #{}, #{max_attempts => infinity}}
    ]),
    Self = self(),
    Owner = spawn(fun() ->
        W1 = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
        W2 = couch_workers:worker_register(T, <<"w2">>, #{}, self()),
        {ok, J1} = couch_workers:job_accept(W1, #{}),
        {ok, J2} = couch_workers:job_accept(W2, #{}),
        {ok, J3} = couch_workers:job_accept(W1, #{}),
        Self ! {running, self(), [J1, J2, J3]},
        receive
            never -> ok
        end
    end),
    receive
        {running, Owner, _} -> ok
    after 10000 -> error(owner_not_running)
    end,
    exit(Owner, kill),
    ?assertMatch(#{state := failed, attempts := 1, error := ?LOST}, wait_left(T, <<"j1">>)),
    ?assertMatch(#{state := pending, attempts := 1, max_attempts := 20, error := ?LOST}, wait_left(T, <<"j2">>)),
    ?assertMatch(#{state := pending, attempts := 1, max_attempts := infinity, error := ?LOST}, wait_left(T, <<"j3">>)),
    %% Both workers left the store's membership.
    ?assertEqual([], couch_workers:workers(T)).

%% The contrast: a deliberate unregister is a clean shutdown, which never
%% fails a job (the attempt is given back as `max_attempts' + 1).
unregister_releases_running_job(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{max_attempts => 1}),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    {ok, Job} = couch_workers:job_accept(W, #{}),
    ok = couch_workers:worker_unregister(W),
    {ok, Released} = couch_workers:job_get(T, <<"j1">>),
    ?assertMatch(#{state := pending, attempts := 1, max_attempts := 2, error := null, worker := null}, Released),
    ?assertEqual({error, not_owner}, couch_workers:job_finish(Job, #{})).

%% Each run's owner crashes as soon as it has the job (a job that takes
%% its worker down). With `max_attempts => 3' the third death ends it:
%% `failed', `worker_lost', and no fourth run. Before deaths counted, an
%% owner's exit released the job and raised its limit, so it ran forever.
job_that_kills_every_owner_ends_failed(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"poison">>, #{}, #{max_attempts => 3}),
    Runs = run_until_failed(T, <<"poison">>, 0, 10),
    ?assertEqual(3, Runs),
    {ok, Job} = couch_workers:job_get(T, <<"poison">>),
    ?assertMatch(#{state := failed, attempts := 3, max_attempts := 3, error := ?LOST, worker := null}, Job),
    W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 300})),
    ok = couch_workers:worker_unregister(W).

%% The owner dies while `couch_workers_local' is down (the supervisor
%% holds its restart back): the restarted server's monitor of the owner
%% fires at once (`noproc'), and that is a death too.
owner_dead_while_server_down_is_a_death(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {Owner, [_Job]} = owner_running(T, <<"w1">>, 1),
    Old = whereis(couch_workers_local),
    ok = sys:suspend(couch_workers_handles_sup),
    try
        OldMon = erlang:monitor(process, Old),
        exit(Old, kill),
        receive
            {'DOWN', OldMon, process, Old, killed} -> ok
        end,
        OwnerMon = erlang:monitor(process, Owner),
        exit(Owner, kill),
        receive
            {'DOWN', OwnerMon, process, Owner, killed} -> ok
        end,
        %% Nobody has removed the worker: its job still runs.
        ?assertMatch({ok, #{state := running}}, couch_workers:job_get(T, <<"j1">>))
    after
        ok = sys:resume(couch_workers_handles_sup)
    end,
    wait_for(fun() -> is_pid(whereis(couch_workers_local)) andalso whereis(couch_workers_local) =/= Old end, 5000),
    Lost = wait_left(T, <<"j1">>),
    ?assertMatch(#{state := pending, attempts := 1, max_attempts := 20, error := ?LOST}, Lost).

%% ---- helpers -------------------------------------------------------------

%% Spawns an owner that registers worker Id of type T and accepts N jobs;
%% returns once it runs them. The owner then waits for `{exit, Reason}'.
owner_running(T, Id, N) ->
    Self = self(),
    Owner = spawn(fun() ->
        W = couch_workers:worker_register(T, Id, #{}, self()),
        true = is_reference(W),
        Jobs = [
            begin
                {ok, J} = couch_workers:job_accept(W, #{timeout => 5000}),
                J
            end
         || _ <- lists:seq(1, N)
        ],
        Self ! {running, self(), Jobs},
        receive
            {exit, Reason} -> exit(Reason)
        end
    end),
    receive
        {running, Owner, Jobs} -> {Owner, Jobs}
    after 10000 -> error(owner_not_running)
    end.

%% Waits until job Id of T has left its worker (the removal was written);
%% returns the job.
wait_left(T, Id) ->
    wait_for(
        fun() ->
            case couch_workers:job_get(T, Id) of
                {ok, #{state := running}} -> false;
                {ok, #{}} -> true
            end
        end,
        5000
    ),
    {ok, Job} = couch_workers:job_get(T, Id),
    Job.

%% Runs job Id under a fresh owner each time until it is `failed' (or
%% Max runs): each owner registers, accepts and crashes. Returns the runs.
run_until_failed(T, Id, Runs, Max) when Runs < Max ->
    case couch_workers:job_get(T, Id) of
        {ok, #{state := failed}} ->
            Runs;
        {ok, #{state := pending}} ->
            {Owner, Mon} = spawn_monitor(fun() ->
                W = couch_workers:worker_register(T, <<"w">>, #{}, self()),
                {ok, #{id := Id}} = couch_workers:job_accept(W, #{timeout => 5000}),
                exit(poisoned)
            end),
            receive
                {'DOWN', Mon, process, Owner, poisoned} -> ok;
                {'DOWN', Mon, process, Owner, Other} -> error({owner_did_not_run_the_job, Other})
            after 10000 -> error(owner_hung)
            end,
            _ = wait_left(T, Id),
            run_until_failed(T, Id, Runs + 1, Max)
    end;
run_until_failed(_T, _Id, Runs, _Max) ->
    Runs.
