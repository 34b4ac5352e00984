%% @doc Scheduled jobs: `delay' and `run_at', never
%% accepted early, on time within a bound, a past `run_at', an earlier add
%% that re-arms the dispatcher's timer, many jobs due at one instant, and
%% the validation of every new option of `job_add/4'. couch_jobs'
%% `accept_max_schedtime' and `accept_no_schedule', ported.
-module(couch_workers_jobs_schedule_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1, register_worker/2, job_state/2]).

%% How late a due job may be handed to a waiting acceptor in these tests:
%% generous, the machine is shared and may be loaded (bench J5 measures
%% the real lateness); the waits are 10 s, so a job handed out only at the
%% end of one is still told apart.
-define(LATE_MS, 3000).

schedule_test_() ->
    couch_workers_test_util:app_fixture("couch_workers scheduled jobs", fun setup/0, fun teardown/1, [
        ?TDEF_FE(a_scheduled_job_is_never_accepted_early, 30),
        ?TDEF_FE(a_job_due_at_once_is_pending),
        ?TDEF_FE(a_due_job_counts_as_pending, 30),
        ?TDEF_FE(an_earlier_add_rearms_the_timer, 30),
        ?TDEF_FE(many_jobs_due_at_one_instant, 30),
        ?TDEF_FE(cancel_a_scheduled_job),
        ?TDEF_FE(accept_max_schedtime, 30),
        ?TDEF_FE(accept_no_schedule),
        ?TDEF_FE(bad_options_write_nothing)
    ]).

setup() ->
    #{type => unique_type("sched")}.

teardown(#{}) ->
    ok.

now_ms() ->
    os:system_time(millisecond).

%% Accepts in a process of its own; the answer comes as
%% `{accepted, Pid, Result, WallMsAtAnswer}'.
accept_async(W, Timeout) ->
    Self = self(),
    spawn_link(fun() ->
        R = couch_workers:job_accept(W, #{timeout => Timeout}),
        Self ! {accepted, self(), R, now_ms()}
    end).

recv_accept(Pid, Timeout) ->
    receive
        {accepted, Pid, R, At} -> {R, At}
    after Timeout -> error({no_accept, Pid})
    end.

%% ---- tests ---------------------------------------------------------------

a_scheduled_job_is_never_accepted_early(#{type := T}) ->
    W = register_worker(T, <<"w">>),
    Before = now_ms(),
    %% 3 s: the reads and short waits below come before it falls due, on
    %% a loaded machine too (with 400 ms they could see it due).
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{delay => 3000}),
    {ok, #{state := scheduled, run_at := RunAt, attempts := 0}} = couch_workers:job_get(T, <<"j">>),
    ?assert(RunAt >= Before + 3000),
    ?assert(RunAt =< now_ms() + 3000),
    %% Not acceptable now, neither at once nor by a short wait.
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 100})),
    ?assertEqual(0, couch_workers:job_pending_count(T)),
    %% A waiting acceptor gets it at its time: not before, not much after.
    Pid = accept_async(W, 10000),
    {{ok, #{id := <<"j">>, state := running, run_at := null}}, At} = recv_accept(Pid, 11000),
    ?assert(At >= RunAt),
    ?assert(At - RunAt < ?LATE_MS),
    ok = couch_workers:worker_unregister(W).

a_job_due_at_once_is_pending(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"d0">>, #{}, #{delay => 0}),
    ok = couch_workers:job_add(T, <<"past">>, #{}, #{run_at => now_ms() - 60000}),
    ok = couch_workers:job_add(T, <<"zero">>, #{}, #{run_at => 0}),
    ok = couch_workers:job_add(T, <<"later">>, #{}, #{run_at => now_ms() + 3600000}),
    ?assertMatch({ok, #{state := pending, run_at := null}}, couch_workers:job_get(T, <<"d0">>)),
    ?assertMatch({ok, #{state := pending}}, couch_workers:job_get(T, <<"past">>)),
    ?assertMatch({ok, #{state := pending}}, couch_workers:job_get(T, <<"zero">>)),
    ?assertMatch({ok, #{state := scheduled}}, couch_workers:job_get(T, <<"later">>)),
    ?assertEqual(3, couch_workers:job_pending_count(T)),
    ?assertMatch(#{pending := 3, scheduled := 1}, couch_workers:job_counts(T)),
    %% The due ones run in the order they were added.
    W = register_worker(T, <<"w">>),
    Ids = [begin {ok, #{id := Id}} = couch_workers:job_accept(W, #{}), Id end || _ <- [1, 2, 3]],
    ?assertEqual([<<"d0">>, <<"past">>, <<"zero">>], Ids),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{})),
    ok = couch_workers:worker_unregister(W).

%% With no acceptor anywhere, nothing moves the job; still it is pending
%% as soon as it can be accepted, for job_get, the counts, and an accept.
a_due_job_counts_as_pending(#{type := T}) ->
    %% Counted while not due (1 s leaves room for a loaded machine), then
    %% once due.
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{delay => 1000}),
    ?assertMatch(#{scheduled := 1, pending := 0}, couch_workers:job_counts(T)),
    timer:sleep(1100),
    ?assertMatch({ok, #{state := pending, run_at := null}}, couch_workers:job_get(T, <<"j">>)),
    ?assertMatch(#{scheduled := 0, pending := 1}, couch_workers:job_counts(T)),
    ?assertEqual(1, couch_workers:job_pending_count(T)),
    W = register_worker(T, <<"w">>),
    ?assertMatch({ok, #{id := <<"j">>}}, couch_workers:job_accept(W, #{})),
    ?assertMatch(#{scheduled := 0, pending := 0, running := 1}, couch_workers:job_counts(T)),
    ok = couch_workers:worker_unregister(W).

%% The dispatcher's timer is armed for a job due in 3 s; a job due in
%% 200 ms added later wakes the waiter at its own time.
an_earlier_add_rearms_the_timer(#{type := T}) ->
    W = register_worker(T, <<"w">>),
    ok = couch_workers:job_add(T, <<"late">>, #{}, #{delay => 3000}),
    Pid = accept_async(W, 10000),
    timer:sleep(200),
    ok = couch_workers:job_add(T, <<"early">>, #{}, #{delay => 200}),
    {ok, #{run_at := RunAt}} = couch_workers:job_get(T, <<"early">>),
    {{ok, #{id := Id}}, At} = recv_accept(Pid, 10000),
    ?assertEqual(<<"early">>, Id),
    ?assert(At >= RunAt),
    ?assert(At - RunAt < ?LATE_MS),
    ?assertMatch({ok, #{state := scheduled}}, couch_workers:job_get(T, <<"late">>)),
    ok = couch_workers:worker_unregister(W).

many_jobs_due_at_one_instant(#{type := T}) ->
    N = 60,
    %% 3 s: the count below comes before they fall due, on a loaded
    %% machine too.
    RunAt = now_ms() + 3000,
    Jobs = [{integer_to_binary(I), #{<<"i">> => I}, #{run_at => RunAt}} || I <- lists:seq(1, N)],
    ok = couch_workers:job_add_many(T, Jobs),
    ?assertMatch(#{scheduled := N}, couch_workers:job_counts(T)),
    Workers = [register_worker(T, <<"w", (integer_to_binary(I))/binary>>) || I <- lists:seq(1, 6)],
    Self = self(),
    Takers = [
        spawn_link(fun() -> Self ! {took, self(), take_all(W, [])} end)
     || W <- Workers
    ],
    Taken = lists:append([receive {took, P, L} -> L after 20000 -> error(no_takes) end || P <- Takers]),
    ?assertEqual(N, length(Taken)),
    ?assertEqual(lists:sort([integer_to_binary(I) || I <- lists:seq(1, N)]), lists:usort([Id || {Id, _} <- Taken])),
    [?assert(At >= RunAt) || {_, At} <- Taken],
    ?assertMatch(#{scheduled := 0, pending := 0, finished := N}, couch_workers:job_counts(T)),
    [ok = couch_workers:worker_unregister(W) || W <- Workers].

%% Takes and finishes jobs until none comes within 5 s of its wait (the
%% first wait spans the 3 s until they fall due).
take_all(W, Acc) ->
    case couch_workers:job_accept(W, #{timeout => 5000}) of
        {ok, #{id := Id} = J} ->
            At = now_ms(),
            ok = couch_workers:job_finish(J, #{}),
            take_all(W, [{Id, At} | Acc]);
        {error, not_found} ->
            Acc
    end.

cancel_a_scheduled_job(#{type := T}) ->
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{delay => 60000}),
    {ok, Sub, #{state := scheduled}} = couch_workers:job_subscribe(T, <<"j">>, self()),
    ok = couch_workers:job_cancel(T, <<"j">>),
    ?assertMatch(
        #{state := canceled, run_at := null},
        couch_workers_test_util:wait_job(Sub, fun(J) -> maps:get(state, J) =:= canceled end, 5000)
    ),
    ?assertMatch(#{scheduled := 0, canceled := 1}, couch_workers:job_counts(T)),
    ok = couch_workers:job_unsubscribe(Sub).

%% couch_jobs: a job scheduled later than the acceptor's max_sched_time is
%% not accepted. Here the schedule is the job's `run_at': before it no
%% accept takes the job, at it one does.
accept_max_schedtime(#{type := T}) ->
    W = register_worker(T, <<"w">>),
    %% 3 s: the accepts before it come before it falls due, on a loaded
    %% machine too (it was 600 ms).
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{run_at => now_ms() + 3000}),
    ok = couch_workers:job_add(T, <<"j2">>, #{}, #{}),
    ?assertMatch({ok, #{id := <<"j2">>}}, couch_workers:job_accept(W, #{})),
    ?assertEqual({error, not_found}, couch_workers:job_accept(W, #{timeout => 200})),
    ?assertMatch({ok, #{id := <<"j1">>}}, couch_workers:job_accept(W, #{timeout => 10000})),
    ok = couch_workers:worker_unregister(W).

%% couch_jobs: a job added without a schedule is accepted at once.
accept_no_schedule(#{type := T}) ->
    W = register_worker(T, <<"w">>),
    ok = couch_workers:job_add(T, <<"j">>, #{}, #{}),
    ?assertMatch({ok, #{state := pending, run_at := null}}, couch_workers:job_get(T, <<"j">>)),
    ?assertMatch({ok, #{id := <<"j">>}}, couch_workers:job_accept(W, #{})),
    ok = couch_workers:worker_unregister(W).

bad_options_write_nothing(#{type := T}) ->
    Bad = [
        {#{delay => 10, run_at => now_ms() + 10}, invalid_schedule},
        {#{<<"delay">> => 10, run_at => 5}, invalid_schedule},
        {#{delay => -1}, invalid_delay},
        {#{delay => 1.5}, invalid_delay},
        {#{delay => infinity}, invalid_delay},
        {#{run_at => -1}, invalid_run_at},
        {#{run_at => <<"soon">>}, invalid_run_at},
        {#{max_attempts => 0}, invalid_max_attempts},
        {#{max_attempts => -3}, invalid_max_attempts},
        {#{max_attempts => many}, invalid_max_attempts},
        {#{max_attempts => 2.0}, invalid_max_attempts},
        {#{keep => -1}, invalid_keep},
        {#{keep => forever}, invalid_keep},
        {#{keep => 1.0}, invalid_keep},
        {#{priority => 1.0, delay => 5}, invalid_priority}
    ],
    lists:foreach(
        fun({Opts, Reason}) ->
            ?assertEqual({error, Reason}, couch_workers:job_add(T, <<"j">>, #{}, Opts)),
            ?assertEqual({error, Reason}, couch_workers:job_add_many(T, [{<<"k">>, #{}, #{}}, {<<"j">>, #{}, Opts}]))
        end,
        Bad
    ),
    ?assertEqual(not_found, job_state(T, <<"j">>)),
    ?assertEqual(not_found, job_state(T, <<"k">>)),
    ?assertMatch(#{scheduled := 0, pending := 0}, couch_workers:job_counts(T)),
    %% The good edges are taken.
    ok = couch_workers:job_add(T, <<"a">>, #{}, #{max_attempts => infinity, keep => infinity}),
    ok = couch_workers:job_add(T, <<"b">>, #{}, #{max_attempts => 1, keep => 0, <<"delay">> => 0}),
    ?assertMatch({ok, #{max_attempts := infinity, keep := infinity}}, couch_workers:job_get(T, <<"a">>)),
    ?assertMatch({ok, #{max_attempts := 1, keep := 0, state := pending}}, couch_workers:job_get(T, <<"b">>)),
    %% The defaults: 20 attempts, the app env's keep (infinity here).
    ok = couch_workers:job_add(T, <<"c">>, #{}, #{}),
    ?assertMatch({ok, #{max_attempts := 20, keep := infinity}}, couch_workers:job_get(T, <<"c">>)).
